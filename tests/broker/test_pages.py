"""``broker.pages``: how a page of units is cut into chunks (one log read each)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.pages import RawPage, RecordChunk, View, plan_chunks
from consumequeue.queue import UNIT


def units_of(spans: list[tuple[int, int]]) -> bytes:
    return b"".join(UNIT.pack(start, size, 0) for start, size in spans)


@contextmanager
def views_of(log: bytes, opened: list[tuple[int, int]]) -> Iterator[View]:
    """A ``View`` over ``log`` that records what it opens."""

    @contextmanager
    def view(pos: int, size: int) -> Iterator[memoryview]:
        opened.append((pos, size))
        with memoryview(log)[pos : pos + size] as v:
            yield v

    yield view


def test_a_page_encodes_chunk_by_chunk_on_views_of_the_log() -> None:
    units = units_of([(48, 100), (300, 100), (900, 50), (5000, 10)])
    log = bytes(range(256)) * 40
    opened: list[tuple[int, int]] = []
    with views_of(log, opened) as view:
        page = RawPage(units, view, segment_bytes=8192)
        got = page.encode(lambda c: (c.base, bytes(c.data), c.units, c.count))
    assert page.count == 4 and opened == [(48, 4962)]
    assert got == [(48, log[48:5010], units, 4)]
    opened.clear()
    with views_of(log, opened) as view:  # the last record is in the next segment
        got = RawPage(units, view, segment_bytes=4096).encode(lambda c: (c.base, c.count))
    assert opened == [(48, 352), (900, 50), (5000, 10)] and got == [(48, 2), (900, 1), (5000, 1)]
    assert RawPage(b"").encode(lambda c: pytest.fail("no chunk")) == []


def test_an_encoder_error_is_raised_after_the_view_is_released() -> None:
    """The error's frames hold buffers made from the view: it is raised once the view is
    released, not in its place as a BufferError."""
    log = bytes(1000)
    units = units_of([(48, 100)])

    def check(n: int) -> None:
        raise KeyError(n)

    def bad(chunk: RecordChunk) -> None:
        kept = pickle.PickleBuffer(chunk.data)  # noqa: F841 - alive in this frame
        try:
            check(1)
        except KeyError:
            raise ValueError("bad record") from None  # chained: two tracebacks

    with views_of(log, []) as view, pytest.raises(ValueError, match="bad record"):
        RawPage(units, view, segment_bytes=4096).encode(bad)


def test_segment_boundaries_and_the_span_limit_split_chunks() -> None:
    units = units_of([(48, 100), (200, 100), (1048, 100), (1200, 100), (1900, 50)])
    assert plan_chunks(units, segment_bytes=1000) == [(0, 2), (2, 5)]
    # Halving, not packing: (2, 5) is too wide, and so is its right half (3, 5).
    assert plan_chunks(units, segment_bytes=1000, max_span_bytes=300) == [
        (0, 2),
        (2, 3),
        (3, 4),
        (4, 5),
    ]
    # A single record bigger than the span is still a chunk of its own.
    assert plan_chunks(units_of([(0, 500)]), segment_bytes=1000, max_span_bytes=10) == [(0, 1)]
    assert plan_chunks(b"", segment_bytes=1000) == []


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 20"):
        plan_chunks(b"x" * 21, segment_bytes=10)
    with pytest.raises(ValueError, match=">= 1"):
        plan_chunks(b"", segment_bytes=0)


@given(
    st.lists(st.tuples(st.integers(0, 300), st.integers(1, 400)), min_size=1, max_size=60),
    st.integers(100, 3000),
    st.integers(1, 5000),
)
def test_chunks_cover_every_unit_in_order_within_their_limits(
    steps: list[tuple[int, int]], segment_bytes: int, span: int
) -> None:
    spans, pos = [], 0
    for gap, wanted in steps:
        start, size = pos + gap, min(wanted, segment_bytes)
        if start // segment_bytes != (start + size - 1) // segment_bytes:
            start = (start // segment_bytes + 1) * segment_bytes  # no record straddles
        spans.append((start, size))
        pos = start + size
    runs = plan_chunks(units_of(spans), segment_bytes, span)
    assert [i for first, end in runs for i in range(first, end)] == list(range(len(spans)))
    for first, end in runs:
        lo, hi = spans[first][0], spans[end - 1][0] + spans[end - 1][1]
        assert lo // segment_bytes == (hi - 1) // segment_bytes
        assert end - first == 1 or hi - lo <= span
