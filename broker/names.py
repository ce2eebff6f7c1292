"""What a client may name: topics and groups (issue 32, "reserve what the broker owns").

A name is ``TOPIC_NAME`` / ``GROUP_NAME`` (``broker/metadata.py``: RocketMQ's characters,
``%`` among them, as RocketMQ's namespaces and retry topics use it). Of those, the broker
keeps for itself:
- the prefixes of its own topics, ``BROKER_PREFIXES``: ``%SYS%`` (metadata, delay
  messages, half messages), ``%DLQ%<group>`` (a POP group's dead letters, which only the
  broker makes and writes: a client reads and deletes them) and ``%RETRY%``;
- a ``%`` followed by two hex digits, which reads as a percent-encoding (``a%2Fb``,
  ``%2e%2e``, ``%25SYS%25META``): one name that logs, URLs and shells show two ways.
A group name may not start with a broker prefix either, nor hold a percent-encoding.
"""

from __future__ import annotations

import re

from . import errors
from .metadata import GROUP_NAME, SYS_PREFIX, TOPIC_NAME

DLQ_PREFIX = "%DLQ%"  # a POP group's dead letters: DLQ_PREFIX + group
RETRY_PREFIX = "%RETRY%"  # RocketMQ's retry topics: kept free for them
BROKER_PREFIXES = (SYS_PREFIX, DLQ_PREFIX, RETRY_PREFIX)
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def check_topic_name(name: str, *, dead_letters: bool = False) -> None:
    """``InvalidArgumentError`` unless a client may create or write topic ``name``; with
    ``dead_letters``, the broker's own ``%DLQ%<group>`` is allowed too."""
    if not TOPIC_NAME.fullmatch(name):
        raise errors.InvalidArgumentError(
            f"invalid topic name {name!r}: want [A-Za-z0-9_%|-]{{1,127}}"
        )
    _check_reserved("topic", name, allowed=DLQ_PREFIX if dead_letters else None)


def check_group_name(name: str, what: str = "group") -> None:
    """``InvalidArgumentError`` unless ``name`` may name a client's group (``what``:
    how the error calls it)."""
    if not GROUP_NAME.fullmatch(name):
        raise errors.InvalidArgumentError(
            f"invalid {what} name {name!r}: want [A-Za-z0-9_%|-]{{1,127}}"
        )
    _check_reserved(what, name, allowed=None)


def _check_reserved(what: str, name: str, allowed: str | None) -> None:
    for prefix in BROKER_PREFIXES:
        if name.startswith(prefix) and prefix != allowed:
            raise errors.InvalidArgumentError(
                f"invalid {what} name {name!r}: the prefix {prefix} is the broker's"
            )
    # (of a dead-letter topic, the group part: the prefix's last '%' and a group name
    # that starts with two hex digits, "%DLQ%failed", is no percent-encoding)
    rest = name[len(allowed) :] if allowed is not None and name.startswith(allowed) else name
    if _ESCAPE.search(rest):
        raise errors.InvalidArgumentError(
            f"invalid {what} name {name!r}: '%' and two hex digits read as a percent-encoding"
        )
