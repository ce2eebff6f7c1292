"""``broker.columns.split_properties``: PROPERTIES blocks read in one go as
``decode_properties`` reads each (the records around them: tests/api/test_arrow_encode.py,
which checks ``read_chunk`` through the Arrow encoder)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.columns import PageFormatError, Spans, split_properties
from broker.message import PROP_KEYS, PROP_TAGS, SYSTEM_PROPERTIES, MessageFormatError
from broker.properties import decode_properties, encode_properties, split_keys

Pairs = list[tuple[str, str]]

# Blocks from pieces that make separators, empty pieces, system names and spaces common.
PIECES = st.sampled_from(["\x01", "\x02", " ", "a", "b", "é", "TAGS", "KEYS", "UNIQ_KEY"])
BLOCKS = st.lists(st.lists(PIECES, max_size=12).map(lambda p: "".join(p).encode()), max_size=8)


def reference(block: bytes) -> tuple[Pairs, str | None, list[str]] | None:
    """What a message shows of ``block`` (its producer's pairs, TAGS, keys), read by
    ``decode_properties``'s rule but keeping a producer's name given twice; None when
    the rule refuses the block."""
    items = block.split(b"\x02")
    if not items[-1]:
        items.pop()
    pairs = [item.split(b"\x01") for item in items]
    if any(len(p) != 2 or not p[0] for p in pairs):
        return None
    named = [(name.decode(), value.decode()) for name, value in pairs]
    system = [name for name, _ in named if name in SYSTEM_PROPERTIES]
    if len(system) != len(set(system)):
        return None
    found = dict(named)
    user = [(k, v) for k, v in named if k not in SYSTEM_PROPERTIES]
    return user, found.get(PROP_TAGS), split_keys(found.get(PROP_KEYS))


def _text(data: np.ndarray, spans: Spans) -> list[str]:
    return [bytes(data[s:e]).decode() for s, e in zip(spans.starts, spans.ends, strict=True)]


def split(blocks: list[bytes]) -> list[tuple[Pairs, str | None, list[str]]]:
    """``split_properties`` of ``blocks`` laid back to back, per row."""
    data = np.frombuffer(b"".join(blocks), np.uint8)
    bounds = np.cumsum([0, *map(len, blocks)]).astype(np.int64)
    p = split_properties(data, bounds)
    rows: list[tuple[Pairs, str | None, list[str]]] = [([], None, []) for _ in blocks]
    names, values = _text(data, p.user_names), _text(data, p.user_values)
    for row, name, value in zip(p.user_rows, names, values, strict=True):
        rows[row][0].append((name, value))
    for row, tags in zip(p.tags_rows, _text(data, p.tags), strict=True):
        rows[row] = (rows[row][0], tags, rows[row][2])
    for row, key in zip(p.keys_rows, _text(data, p.keys), strict=True):
        rows[row][2].append(key)
    shown = ((p.user_names, p.user_rows), (p.tags, p.tags_rows), (p.keys, p.keys_rows))
    for spans, rows_of in shown:
        assert np.all(np.diff(rows_of) >= 0) and np.all(spans.ends >= spans.starts)
        assert np.all(spans.starts[1:] >= spans.ends[:-1])  # in order, apart: one take cuts them
    return rows


@settings(max_examples=500)
@given(BLOCKS)
def test_blocks_are_split_as_decode_properties_reads_each(blocks: list[bytes]) -> None:
    want = [reference(b) for b in blocks]
    for block, w in zip(blocks, want, strict=True):  # the reference is decode_properties
        try:
            props = decode_properties(block)
        except MessageFormatError:
            assert w is None or len({k for k, _ in w[0]}) < len(w[0])  # a name twice
            continue
        assert w == (
            [(k, v) for k, v in props.items() if k not in SYSTEM_PROPERTIES],
            props.get(PROP_TAGS),
            split_keys(props.get(PROP_KEYS)),
        )
    if any(w is None for w in want):
        with pytest.raises(PageFormatError, match="PROPERTIES"):
            split(blocks)
    else:
        assert split(blocks) == want


def test_the_writers_blocks_and_the_optional_last_separator() -> None:
    written = encode_properties({"a": "1", PROP_TAGS: "T", PROP_KEYS: " k1  k2 ", "b": ""})
    assert split([written, b"", b"x\x01y", b"TAGS\x01U\x02KEYS\x01z"]) == [
        ([("a", "1"), ("b", "")], "T", ["k1", "k2"]),
        ([], None, []),
        ([("x", "y")], None, []),
        ([], "U", ["z"]),
    ]
    assert split([b"", b""]) == [([], None, []), ([], None, [])]
