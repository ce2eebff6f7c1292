"""Counting a produce body before anything is built from it (issue 17, HTTP).

A 16 MiB body of empty messages (``{"messages": [{}, {}, ...]}``) is ~5.6 million
objects once parsed, each validated into a model (44 s and 2.6 GiB on the machine that
measured it): a limit checked after parsing is too late. ``check_json_shape`` counts
with C-speed passes over the bytes and no object per token (~0.2-0.6 s, ~80 MiB of
transient copies for the same body) and refuses a body with more messages, or more
strings and scalars, than the limits allow; what passes is then parsed as before.

What is counted (an upper bound for any input, exact for valid JSON):

- strings: the escapes ``\\\\`` and ``\\"`` are dropped first (``bytes.replace``, paired
  from the left as a JSON string's are), then every pair of quotes is one string (a
  count of the quotes), and the strings are cut out by a split on the quotes, once
  their number is known to be within the limit (the split makes a piece per quote);
- messages: the containers (``{`` or ``[``) that are elements of an array. A valid
  produce body has arrays in two places, ``messages`` (objects: the messages) and a
  message's ``keys`` (strings), so this is the message count, and any other container
  placed in an array counts against the same limit. An NDJSON body's messages are its
  lines, counted by the caller (``messages=``);
- scalars: numbers, ``true``, ``false``, ``null`` (a run of bytes outside the structure
  once strings and whitespace are gone). Together with the strings they are the body's
  "values", at most ``max_strings_per_message`` per message. Objects that are values of
  a member are bounded by the strings too: each member has a name.

Messages and scalars are counted on bitmaps held as big ints (a byte per position): a
translate, a shift, an ``and`` and a ``bit_count``.
"""

from __future__ import annotations

import functools
import re

from broker import errors

_WHITESPACE = b" \t\r\n"
# A line break with the blank lines and indentation after it.
_BREAK = re.compile(rb"\n[ \t\r\f\v\n]*+")


def check_json_shape(
    body: bytes,
    max_messages: int,
    max_strings_per_message: int,
    *,
    messages: int | None = None,
) -> int:
    """The number of messages in ``body`` (or ``messages``, an NDJSON body's lines);
    ``PayloadTooLargeError`` (413) when it is over ``max_messages`` or the body holds
    more than ``max_strings_per_message`` values per message. Linear in ``len(body)``."""
    max_values = max_strings_per_message * max(1, max_messages)
    unescaped = _without_escapes(body)
    strings = unescaped.count(b'"') // 2
    if strings > max_values:
        raise _too_many("strings", max_values)
    stripped = _strings_cut(unescaped)
    del unescaped
    compact = stripped.translate(None, _WHITESPACE)
    del stripped
    items = _array_items(compact)
    counted = items if messages is None else max(items, messages)
    if counted > max_messages:
        raise _too_many("messages", max_messages)
    max_values = max_strings_per_message * max(1, counted)
    if strings + _scalars(compact) > max_values:
        raise _too_many("strings and scalars", max_values)
    return items if messages is None else messages


def _without_escapes(body: bytes) -> bytes:
    """``body`` without ``\\\\`` and ``\\"``: paired from the left as a JSON string's escapes
    are, so every quote left is a string's delimiter (in valid JSON; in invalid JSON the
    parser stops at the first stray backslash, before anything after it is built)."""
    if b"\\" not in body:  # one memchr pass instead of two copying ones (the common case)
        return body
    return body.replace(b"\\\\", b"").replace(b'\\"', b"")


def _strings_cut(unescaped: bytes) -> bytes:
    """``unescaped`` with every string (``"`` to the next ``"``) cut down to one ``"``,
    and a lone last quote kept as it is: a split on the quotes and a join of what lies
    between the strings, C-speed passes (a regex doing the same walked the bytes ten
    times slower: 600 µs of a 100-message produce body of 1 KiB messages, py-spy)."""
    parts = unescaped.split(b'"')
    if len(parts) % 2:
        return b'"'.join(parts[0::2])
    # An odd number of quotes: the last one opens no string; what follows it stays.
    return b'"'.join(parts[0:-1:2]) + b'"' + parts[-1]


def _flags(data: bytes, chars: bytes, *, inverse: bool = False) -> int:
    """A bitmap as one big int, a byte per position of ``data`` (the first one most
    significant), 1 where the byte is one of ``chars`` (not one, with ``inverse``): the
    counts below are then a shift, an ``and`` and a ``bit_count`` in C."""
    return int.from_bytes(data.translate(_table(chars, inverse)))


@functools.cache
def _table(chars: bytes, inverse: bool) -> bytes:
    """``bytes.translate``'s table for ``_flags``, built once per (chars, inverse): built
    per call it cost a 256-step Python loop, three per produce request (3.8 % of a
    master's CPU at one message per request, py-spy)."""
    return bytes((b in chars) != inverse for b in range(256))


def _array_items(compact: bytes) -> int:
    """Containers (``[``, ``{``) right after a ``[`` or a ``,``."""
    after = _flags(compact, b"[,") >> 8  # shifted to the next position
    return (after & _flags(compact, b"[{")).bit_count()


def _scalars(compact: bytes) -> int:
    """Runs of bytes outside the structure (numbers, true, false, null, junk) in a body
    without strings or whitespace: the positions of such a byte not after another."""
    inside = _flags(compact, b'{}[],:"', inverse=True)
    return inside.bit_count() - (inside & (inside >> 8)).bit_count()


def ndjson_lines(body: bytes, max_lines: int) -> list[bytes]:
    """The non-blank lines of an NDJSON body; 413 past ``max_lines``. Blank lines cost no
    object: runs of them collapse first (at most ``max_lines + 2`` runs, then it stops)."""
    collapsed, breaks = _BREAK.subn(b"\n", body, count=max_lines + 2)
    if breaks > max_lines + 1:  # a break follows every line but perhaps the last
        raise _too_many("messages", max_lines)
    lines = [line for line in collapsed.split(b"\n") if line.strip()]
    if len(lines) > max_lines:
        raise _too_many("messages", max_lines)
    return lines


def _too_many(what: str, limit: int) -> errors.PayloadTooLargeError:
    return errors.PayloadTooLargeError(f"more than {limit} {what} in the request", limit=limit)
