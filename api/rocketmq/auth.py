"""AK/SK authentication of RocketMQ 5 clients (docs/rocketmq.md "Credentials"), mapped
onto the tokens' scopes (``api.auth``). No protocol modules: a node reads its access keys
before it knows whether the gRPC front will load.

What a client sends (research §5; ``rocketmq/v5/util/signature.py`` in the Python client,
``sign`` in the Node one), on every call::

    x-mq-date-time: 20261127T092203Z
    authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
                   Signature=<hex(HMAC-SHA1(key=SK, msg=x-mq-date-time))>

(the hex is lower-case from Python, upper-case from Node: compared case-insensitively;
Python sends the header with an empty ``Credential=`` when it has no credentials,
Node sends none). The node holds, per access key, its secret and scopes
(``--access-keys-file``)::

    # access key   secret key                        scopes
    orders-app     2b7e151628aed2a6abf7158809cf4f3c   produce:orders consume:orders
    ops            9f86d081884c7d659a2feaa0c55ad015   admin

An unknown key, a missing or bad signature → ``UnauthenticatedError`` (the protocol's
UNAUTHORIZED); a key whose scopes do not cover the call → ``ForbiddenError`` (FORBIDDEN).

The date: the signature binds nothing but ``x-mq-date-time``, so a captured request's
headers would open every call for ever. A date further than ``max_skew_s`` (default 15
min) from the node's clock is refused, which bounds a replay to that window (TLS, not
this, keeps headers from being captured). Python 5.1.2 writes its *local* time with a
``Z``: a Python client outside UTC is refused unless it runs with ``TZ=UTC`` or the
node's window covers its offset (``--grpc-auth-max-skew-s 50400`` covers every zone).

Secrets are kept as given: HMAC needs them (a digest, as for bearer tokens, cannot
verify a signature). The file should be readable by the node alone.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from api.auth import Grant, config_lines, parse_scope
from broker import errors

SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
AUTH_HEADER = "authorization"
DEFAULT_MAX_SKEW_S = 900.0
_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")
_HEX = re.compile(r"[0-9A-Fa-f]{40}")
MAX_HEADER_CHARS = 1024


@dataclass(frozen=True, slots=True)
class AccessKey:
    secret: bytes
    grant: Grant


class AccessKeys:
    """Access keys → their secret and scopes."""

    def __init__(self, entries: Iterable[tuple[str, str, Iterable[str]]] = ()) -> None:
        self._keys: dict[str, AccessKey] = {}
        for access_key, secret_key, scopes in entries:
            self.add(access_key, secret_key, scopes)

    def add(self, access_key: str, secret_key: str, scopes: Iterable[str]) -> None:
        for what, word in (("an access key", access_key), ("a secret key", secret_key)):
            if not word or word.startswith("#") or any(c.isspace() or c == "," for c in word):
                raise ValueError(f"{what} is a non-empty word without commas, not led by #")
        grant = Grant(frozenset(parse_scope(s) for s in scopes))
        if not grant.scopes:
            raise ValueError("an access key needs at least one scope")
        if access_key in self._keys:
            raise ValueError(f"access key {access_key} is listed twice")
        self._keys[access_key] = AccessKey(secret_key.encode(), grant)

    @classmethod
    def from_file(cls, path: Path) -> AccessKeys:
        """Read an access keys file (``AK SK scope...`` a line, ``#`` comments);
        ``ValueError`` names the bad line (never the secret)."""
        keys = cls()
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"{path}: {e.strerror or e}") from None
        for number, words in config_lines(text):
            if len(words) < 3:
                raise ValueError(f"{path}:{number}: want ACCESS_KEY SECRET_KEY SCOPE...")
            try:
                keys.add(words[0], words[1], words[2:])
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
        if not keys._keys:
            raise ValueError(f"{path}: no access keys")
        return keys

    def get(self, access_key: str) -> AccessKey | None:
        return self._keys.get(access_key)

    def __len__(self) -> int:
        return len(self._keys)


def sign(secret: bytes, date_time: str) -> str:
    """The clients' signature: lower-case hex of HMAC-SHA1(secret, date-time)."""
    return hmac.new(secret, date_time.encode(), hashlib.sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, str, str]:
    """``MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=H, Signature=HEX`` → (AK, H, HEX);
    ``UnauthenticatedError`` when it is not that. The credential's text before a ``/``
    is the key (RocketMQ's parser, for scoped credentials ``AK/...``)."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise errors.UnauthenticatedError(f"authorization: want the {SCHEME} scheme")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, text = part.strip().partition("=")
        if eq:
            fields[name.strip()] = text.strip()
    if "Credential" not in fields or "Signature" not in fields:
        raise errors.UnauthenticatedError("authorization: no Credential or no Signature")
    access_key = fields["Credential"].split("/", 1)[0]
    return access_key, fields.get("SignedHeaders", DATE_HEADER), fields["Signature"]


def parse_date_time(text: str) -> int:
    """``20261127T092203Z`` → seconds since the epoch (as UTC); ``UnauthenticatedError``."""
    m = _DATE.fullmatch(text.strip())
    if m is None:
        raise errors.UnauthenticatedError(f"{DATE_HEADER} {text[:40]!r}: want YYYYMMDDTHHMMSSZ")
    try:
        y, mo, d, h, mi, s = (int(g) for g in m.groups())
        return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except (ValueError, OverflowError):
        raise errors.UnauthenticatedError(f"{DATE_HEADER} {text!r} is no date") from None


class Authenticator:
    """Who signed a call, and what they may do (see the module doc)."""

    def __init__(
        self,
        keys: AccessKeys | None,
        max_skew_s: float = DEFAULT_MAX_SKEW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys or AccessKeys()  # none: every call is refused
        self.max_skew_s = max_skew_s
        self.clock = clock
        self.refused = 0  # calls refused UNAUTHORIZED (tests, metrics)

    def grant_of(self, metadata: Mapping[str, str]) -> Grant:
        """The scopes of the call's signer; ``UnauthenticatedError`` when the call is not
        signed by a known key with its secret, at a date within the window."""
        try:
            return self._grant_of(metadata)
        except errors.UnauthenticatedError:
            self.refused += 1
            raise

    def _grant_of(self, metadata: Mapping[str, str]) -> Grant:
        value = metadata.get(AUTH_HEADER, "")
        if len(value) > MAX_HEADER_CHARS:
            raise errors.UnauthenticatedError("authorization: too long")
        access_key, signed, signature = parse_authorization(value) if value else ("", "", "")
        if not access_key:
            raise errors.UnauthenticatedError(
                "credentials are required: an access key and its secret (ClientConfiguration"
                " credentials / sessionCredentials)"
            )
        if DATE_HEADER not in (h.strip().lower() for h in signed.split(";")):
            raise errors.UnauthenticatedError(f"authorization: {DATE_HEADER} is not signed")
        date_time = metadata.get(DATE_HEADER, "")
        when = parse_date_time(date_time)
        key = self.keys.get(access_key)
        if key is None or not _HEX.fullmatch(signature):
            raise errors.UnauthenticatedError(f"unknown access key or bad signature ({access_key})")
        if not hmac.compare_digest(sign(key.secret, date_time), signature.lower()):
            raise errors.UnauthenticatedError(f"unknown access key or bad signature ({access_key})")
        skew = when - self.clock()
        if abs(skew) > self.max_skew_s:
            raise errors.UnauthenticatedError(
                f"{DATE_HEADER} {date_time} is {skew:+.0f} s from this node's UTC clock (at most"
                f" {self.max_skew_s:.0f}: --grpc-auth-max-skew-s). The Python client writes its"
                " local time: run it with TZ=UTC"
            )
        return key.grant

    @staticmethod
    def need(grant: Grant, actions: tuple[str, ...], topic: str) -> None:
        """``ForbiddenError`` unless ``grant`` allows one of ``actions`` on ``topic``."""
        if any(grant.allows(a, topic) for a in actions):
            return
        scopes = " or ".join(f"{a}:{topic}" for a in actions)
        raise errors.ForbiddenError(
            f"this access key may not {' or '.join(actions)} topic {topic} (scope {scopes})",
            needs=f"{actions[0]}:{topic}",
        )
