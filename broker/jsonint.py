"""Integers read from JSON that this code wrote (snapshots, metadata operations)."""

from __future__ import annotations

from typing import Any

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def json_int(value: Any, what: str) -> int:
    """A JSON integer within i64 (a digit string too: map keys are strings). A float, a
    bool or a larger number is malformed: it never came from this code, and the next
    snapshot (orjson, 64-bit integers) could not hold it."""
    if isinstance(value, str):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not I64_MIN <= value <= I64_MAX:
        raise ValueError(f"{what}: {value!r} is not a 64-bit integer")
    return value


def decimal(text: str, max_digits: int = 18) -> int | None:
    """``text`` as a non-negative integer when it is 1..``max_digits`` ASCII digits, else
    None. (``str.isdigit`` takes superscripts, circled and Arabic-Indic digits, which
    ``int`` refuses or reads as other digits; and ``int`` of thousands of digits is
    refused, slowly.)"""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None
