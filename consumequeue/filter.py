"""Tag filtering on consume-queue units: the tags hash and subscription expressions.

A unit's ``tags_hash`` is Java's ``String.hashCode()`` of the message's TAGS property
(RocketMQ's ``tagsString2tagsCode``), so a queue built here filters exactly like a
RocketMQ consume queue. Invariants:
- ``tags_hash`` is a 32-bit signed value sign-extended to the unit's i64 field;
- a message without tags (None or "") hashes to 0. A tag whose hash is 0 is therefore
  indistinguishable from "no tags", and two tags can share a hash ("Aa" and "BB"): a
  hash match is a candidate, the consumer checks the tags string of the message itself
  (as RocketMQ's client does).
"""

from __future__ import annotations

import functools

_MASK32 = 0xFFFFFFFF
_SIGN32 = 0x80000000
SUB_ALL = "*"
"""The expression that matches every message."""
TAG_SEPARATOR = "||"
TAGS_HASH_CACHE_SIZE = 4096
"""Distinct tags whose hash is remembered: real topics use a handful of tags, so almost
every dispatch is a cache hit."""


@functools.lru_cache(maxsize=TAGS_HASH_CACHE_SIZE)
def _java_string_hash(tags: str) -> int:
    if tags.isascii():
        units: bytes | list[int] = tags.encode("ascii")
    else:
        # Java strings are UTF-16: a character outside the BMP is two code units.
        data = tags.encode("utf-16-be", "surrogatepass")
        units = [(data[i] << 8) | data[i + 1] for i in range(0, len(data), 2)]
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK32
    return h - ((h & _SIGN32) << 1)


def tags_hash(tags: str | None) -> int:
    """Java's ``tags.hashCode()`` (32-bit signed, over UTF-16 code units); 0 for None or
    the empty string."""
    if not tags:
        return 0
    return _java_string_hash(tags)


def parse_tag_expression(expr: str | None) -> frozenset[int] | None:
    """The tags hashes a RocketMQ subscription expression ("TagA || TagB") accepts, or
    None for "match all" (None, "" or "*", as ``FilterAPI.buildSubscriptionData``).

    Each tag is trimmed and empty ones are skipped; an expression with no tag left
    ("||") yields the empty set, which matches nothing, as in RocketMQ.
    """
    if expr is None:
        return None
    expr = expr.strip()
    if not expr or expr == SUB_ALL:
        return None
    return frozenset(
        tags_hash(tag) for tag in (t.strip() for t in expr.split(TAG_SEPARATOR)) if tag
    )


def matches(tags_hash: int, hashes: frozenset[int] | None) -> bool:
    """Whether a unit with ``tags_hash`` passes a parsed expression (None = all)."""
    return hashes is None or tags_hash in hashes
