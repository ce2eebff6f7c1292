"""Message ids and unique keys (``broker.msgid``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import MessageFormatError
from broker.msgid import make_msg_id, new_uniq_key, parse_msg_id

FAST = settings(max_examples=200)
GROUPS = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


@FAST
@given(group=GROUPS, commitlog_offset=st.integers(0, 2**63 - 1))
def test_msg_id_round_trip(group: str, commitlog_offset: int) -> None:
    msg_id = make_msg_id(group, commitlog_offset)
    assert msg_id == msg_id.upper() and msg_id.isalnum()
    assert msg_id.endswith(f"{commitlog_offset:016X}")
    assert parse_msg_id(msg_id) == (group, commitlog_offset)
    assert parse_msg_id(msg_id.lower()) == (group, commitlog_offset)


def test_msg_id_is_group_hex_then_offset() -> None:
    assert make_msg_id("g0", 4144) == "6730" + "0000000000001030"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "67",
        "6730000000000000103",  # odd length
        "00" * 8,  # no group
        "6730" + "000000000000103G",  # not hex
        "67 30" + "0000000000001030",  # fromhex would skip the space
        "FF" + "0000000000001030",  # group not UTF-8
        "2E" + "0000000000001030",  # group "." outside [A-Za-z0-9_-]
        "67" * 65 + "0000000000001030",  # group too long
        "67" + "8000000000000000",  # offset beyond i64
    ],
)
def test_bad_msg_ids_are_refused(bad: str) -> None:
    with pytest.raises(MessageFormatError, match="msg id"):
        parse_msg_id(bad)


@pytest.mark.parametrize(
    ("group", "commitlog_offset"), [("", 0), ("a.b", 0), ("g" * 65, 0), ("g", -1)]
)
def test_make_msg_id_validates(group: str, commitlog_offset: int) -> None:
    with pytest.raises(MessageFormatError, match="msg id"):
        make_msg_id(group, commitlog_offset)


def test_uniq_keys_are_unique_upper_hex() -> None:
    keys = [new_uniq_key() for _ in range(10_000)]
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 32 and k == k.upper() and int(k, 16) >= 0 for k in keys)
