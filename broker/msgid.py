"""Message ids and unique keys: how a client names a stored message.

- a msg id is ``HEX(group) + %016X commitlog offset``: the replica set and the record's
  place in its data files, so the id alone locates the message (``make_msg_id``);
- a UNIQ_KEY (``new_uniq_key``) is the producer-side key every message carries in its
  properties (the key index finds a message by it), unique per process by construction.

Malformed ids raise ``MessageFormatError`` (from ``broker.message``) naming "msg id".
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from typing import Final

from .message import MessageFormatError

__all__ = ["make_msg_id", "msg_id_maker", "msg_id_prefix", "new_uniq_key", "parse_msg_id"]

_I64_MAX: Final = 2**63 - 1
_GROUP_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HEX_RE: Final = re.compile(r"[0-9A-Fa-f]+")
_OFFSET_HEX: Final = 16


def make_msg_id(group: str, commitlog_offset: int) -> str:
    """``HEX(group utf-8) + %016X offset`` (RocketMQ's offsetMsgId is host + offset).

    Upper-case hex is URL-safe and the id alone locates the message: the DLedger group
    names the replica set, the offset the record inside its data files.
    """
    return msg_id_maker(group)(commitlog_offset)


def msg_id_prefix(group: str) -> str:
    """What every message id of ``group`` starts with: its checked, upper-case hex."""
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise MessageFormatError(f"msg id: group {group!r} must match [A-Za-z0-9_-]{{1,64}}")
    return group.encode().hex().upper()


def msg_id_maker(group: str) -> Callable[[int], str]:
    """``make_msg_id`` with ``group`` checked and hex-encoded once, for every id of a
    pull or a produce answer."""
    prefix = msg_id_prefix(group)

    def make(commitlog_offset: int) -> str:
        if not 0 <= commitlog_offset <= _I64_MAX:
            raise MessageFormatError(
                f"msg id: commitlog offset {commitlog_offset} is not an i64 >= 0"
            )
        return f"{prefix}{commitlog_offset:016X}"

    return make


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """The inverse of ``make_msg_id``: (group, commitlog offset). Hex of either case."""
    # _HEX_RE first: bytes.fromhex would otherwise accept spaces inside the id.
    if (
        not isinstance(msg_id, str)
        or len(msg_id) % 2
        or len(msg_id) < _OFFSET_HEX + 2
        or not _HEX_RE.fullmatch(msg_id)
    ):
        raise MessageFormatError(
            f"msg id: {msg_id!r} is not an even-length hex string of at least "
            f"{_OFFSET_HEX + 2} characters"
        )
    try:
        group = bytes.fromhex(msg_id[:-_OFFSET_HEX]).decode()
    except UnicodeDecodeError:
        raise MessageFormatError(f"msg id: {msg_id!r} has a group that is not UTF-8") from None
    if not _GROUP_RE.fullmatch(group):
        raise MessageFormatError(f"msg id: {msg_id!r} names the invalid group {group!r}")
    commitlog_offset = int(msg_id[-_OFFSET_HEX:], 16)
    if commitlog_offset > _I64_MAX:
        raise MessageFormatError(f"msg id: {msg_id!r} has an offset beyond the i64 range")
    return group, commitlog_offset


# A random per-process prefix plus a counter: unique within the process by construction
# and across processes with 2**-64 collision odds per pair, at ~0.2 µs (os.urandom(16) is
# a syscall, ~0.5 µs; uuid4 ~2 µs). A forked child draws a fresh prefix so that parent and
# child do not hand out the same keys from the same counter value.
_uniq_prefix = os.urandom(8).hex().upper()
_uniq_counter = itertools.count()


def _reseed_uniq() -> None:
    global _uniq_prefix, _uniq_counter  # noqa: PLW0603 - per-process state by design
    _uniq_prefix = os.urandom(8).hex().upper()
    _uniq_counter = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_uniq)


def new_uniq_key() -> str:
    """A unique message key (UNIQ_KEY): 32 upper-case hex chars, prefix + counter."""
    return f"{_uniq_prefix}{next(_uniq_counter) & 0xFFFF_FFFF_FFFF_FFFF:016X}"
