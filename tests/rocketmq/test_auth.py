"""AK/SK signatures (``api/rocketmq/auth.py``): the clients' header as they write it,
keys files, the date window, and scopes."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import pytest

from api.rocketmq.auth import AccessKeys, Authenticator, parse_authorization, sign
from broker import errors

NOW = 1_795_000_000.0  # 2026-11-18T...Z


def date_of(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def headers(ak: str, sk: str, t: float = NOW, upper: bool = False) -> dict[str, str]:
    """What the Python client sends (``Signature.metadata``); Node's hex is upper-case."""
    date = date_of(t)
    sig = hmac.new(sk.encode(), date.encode(), hashlib.sha1).hexdigest()
    sig = sig.upper() if upper else sig
    return {
        "x-mq-date-time": date,
        "authorization": f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time,"
        f" Signature={sig}",
    }


@pytest.fixture
def auth() -> Authenticator:
    keys = AccessKeys(
        [
            ("writer", "s3cret-w", ["produce:orders"]),
            ("reader", "s3cret-r", ["consume:orders"]),
            ("ops", "s3cret-o", ["admin"]),
        ]
    )
    return Authenticator(keys, max_skew_s=900, clock=lambda: NOW)


def test_sign_is_the_clients_hmac_sha1_hex() -> None:
    # the Python client's own Signature.sign, computed by hand
    want = hmac.new(b"sk", b"20261127T092203Z", hashlib.sha1).hexdigest()
    assert sign(b"sk", "20261127T092203Z") == want and len(want) == 40


@pytest.mark.parametrize("upper", [False, True])
def test_a_signed_call_gets_its_keys_scopes(auth: Authenticator, upper: bool) -> None:
    grant = auth.grant_of(headers("writer", "s3cret-w", upper=upper))
    assert grant.allows("produce", "orders") and not grant.allows("consume", "orders")


@pytest.mark.parametrize(
    "md",
    [
        {},  # Node without credentials
        headers("", ""),  # Python without credentials: Credential= empty
        headers("writer", "wrong"),
        headers("nobody", "s3cret-w"),
        {**headers("writer", "s3cret-w"), "authorization": "Bearer xyz"},
        {**headers("writer", "s3cret-w"), "x-mq-date-time": "yesterday"},
        {**headers("writer", "s3cret-w"), "x-mq-date-time": date_of(NOW + 1)},  # not signed
        headers("writer", "s3cret-w", t=NOW - 901),  # a replay past the window
        headers("writer", "s3cret-w", t=NOW + 3600),  # Python's local time east of UTC
    ],
)
def test_unsigned_badly_signed_or_stale_calls_are_unauthenticated(
    auth: Authenticator, md: dict[str, str]
) -> None:
    with pytest.raises(errors.UnauthenticatedError):
        auth.grant_of(md)


def test_the_window_is_a_setting(auth: Authenticator) -> None:
    auth.max_skew_s = 14 * 3600
    assert auth.grant_of(headers("ops", "s3cret-o", t=NOW + 3600)).admin


def test_scopes_forbid(auth: Authenticator) -> None:
    reader = auth.grant_of(headers("reader", "s3cret-r"))
    auth.need(reader, ("consume",), "orders")
    auth.need(reader, ("produce", "consume"), "orders")  # a route
    with pytest.raises(errors.ForbiddenError, match="consume:clicks"):
        auth.need(reader, ("consume",), "clicks")
    with pytest.raises(errors.ForbiddenError):
        auth.need(reader, ("produce",), "orders")


def test_parse_authorization_keeps_the_key_before_a_slash() -> None:
    ak, signed, sig = parse_authorization(
        "MQv2-HMAC-SHA1 Credential=AK/2026/x, SignedHeaders=x-mq-date-time, Signature=ab"
    )
    assert (ak, signed, sig) == ("AK", "x-mq-date-time", "ab")


def test_keys_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(
        "# ak sk scopes\napp  sk1 produce:orders consume:orders  # the app\n\nops sk2 admin\n"
    )
    keys = AccessKeys.from_file(f)
    assert len(keys) == 2
    got = keys.get("app")
    assert got is not None and got.secret == b"sk1"
    for bad in ("app sk1\n", "app sk1 fly\n", "app sk1 admin\napp sk2 admin\n", "# none\n"):
        f.write_text(bad)
        with pytest.raises(ValueError, match=str(f)) as e:
            AccessKeys.from_file(f)
        assert "sk1" not in str(e.value) and "sk2" not in str(e.value)  # no secret said
