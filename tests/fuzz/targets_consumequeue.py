"""Fuzz targets of ``consumequeue``: a consume queue's segment files and the key index's
files as a node finds them on open (after a crash, a bad disk, an operator), then used:
read, searched, truncated, appended to. Every call gives a value or
``ConsumeQueueError`` (the queues and the key index are derived state: a node refuses
or rebuilds them, it does not crash over them)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from consumequeue import ConsumeQueueError, KeyIndex, KeyIndexSettings
from consumequeue.keyindex import HEADER, HEADER_SIZE, MAGIC, _IndexFile
from consumequeue.queue import RESET_FILE, UNIT, ConsumeQueue, ConsumeQueueSettings
from dledger.store.mmapfile import segment_name

from .reader import Reader, Writer
from .registry import scratch_dir, target

CQ = ConsumeQueueSettings(segment_units=8, recovery_tail_segments=2, max_read_units=64)
SEGMENT_BYTES = CQ.segment_bytes


def _queue_seeds() -> list[bytes]:
    units = b"".join(UNIT.pack(48 + 100 * i, 60, i) for i in range(12))
    w = Writer().uint(2, 1)
    w.uint(0, 1).chunk(units[:SEGMENT_BYTES]).uint(1, 1).chunk(units[SEGMENT_BYTES:])
    return [
        w.chunk(b"").uint(0, 4).done(),
        Writer().uint(1, 1).uint(1, 1).chunk(units[:60]).chunk(b"9\n").uint(500, 4).done(),
    ]


@target("consume_queue_files", max_len=2048, seeds=_queue_seeds)
def consume_queue_files(data: bytes) -> None:
    """A consume queue's segments and ``reset_offset`` file, opened, read, searched by
    commitlog offset, truncated and appended to."""
    r = Reader(data)
    with scratch_dir() as d:
        qdir = d / "t" / "0"
        qdir.mkdir(parents=True)
        for _ in range(r.uint(1) % 4):
            start = r.uint(1) % 8 * SEGMENT_BYTES
            (qdir / segment_name(start)).write_bytes(r.chunk(SEGMENT_BYTES + 1))
        reset = r.chunk(24)
        if reset:
            (qdir / RESET_FILE).write_bytes(reset)
        cut = r.uint(4)
        try:
            q = ConsumeQueue(d, "t", 0, CQ)
        except ConsumeQueueError:
            return
        try:
            _use_queue(q, cut)
        finally:
            q.close()


def _use_queue(q: ConsumeQueue, cut: int) -> None:
    lo, hi = q.min_offset, q.max_offset
    assert 0 <= lo <= hi
    units = q.read(lo, hi - lo)
    assert [u[0] for u in units] == list(range(lo, lo + min(hi - lo, CQ.max_read_units)))
    assert q.get(hi) is None and (hi == lo or q.get(lo) is not None)
    try:
        q.truncate_dirty_tail(cut)
        q.put(q.max_offset, max(q.max_commitlog_offset_end, 48), 20, 7)
    except ConsumeQueueError:
        pass
    assert q.min_offset <= q.max_offset


KI = KeyIndexSettings(
    slots_per_file=8, max_entries_per_file=16, max_query_results=16, max_keys_per_message=4
)


def _index_file(r: Reader) -> tuple[str, bytes]:
    """One key index file: a name, then a header (right magic unless told otherwise,
    small geometry) and as much of the slots and entries as the input has."""
    name = segment_name(r.uint(2))
    magic = MAGIC if r.uint(1) != 0xFF else r.uint(4)
    slots, entries = r.int_in(1, 8), r.int_in(1, 16)
    size = _IndexFile.size_for(slots, entries) + r.int_in(-1, 1) * 4
    i64 = [r.uint(8) - (1 << 63) for _ in range(5)]  # base, min, max, begin, end
    used, count = r.uint(1), r.int_in(0, 17)
    header = HEADER.pack(magic, slots, entries, 0, *i64, used, count)
    body = r.chunk(size - HEADER_SIZE).ljust(max(0, size - HEADER_SIZE), b"\0")
    return name, header + body


def _index_seeds() -> list[bytes]:
    with scratch_dir() as d:
        ki = KeyIndex(d, KI)
        for n in range(20):
            ki.put([f"k{n % 3}", f"u{n}"], 48 + 100 * n, 1_000 + n)
        ki.flush()
        files = sorted(d.iterdir())
        w = Writer().uint(len(files), 1)
        for p in files:
            w.raw(_as_index_file_input(p))
        ki.close()
    return [w.uint(1, 2).uint(3, 1).uint(400, 2).done()]


def _as_index_file_input(p: Path) -> bytes:
    """The ``_index_file`` input that writes ``p`` back (for seeds)."""
    raw = p.read_bytes()
    fields = HEADER.unpack_from(raw, 0)
    slots, entries = fields[1], fields[2]
    w = Writer().uint(int(p.name), 2).uint(0, 1).int_in(slots, 1).int_in(entries, 1)
    w.uint(1, 1)  # size adjustment 0
    for v in fields[4:9]:
        w.uint(v + (1 << 63), 8)
    return w.uint(fields[9] % 256, 1).uint(fields[10], 1).chunk(raw[HEADER_SIZE:]).done()


@target("key_index_files", max_len=4096, seeds=_index_seeds)
def key_index_files(data: bytes) -> None:
    """Key index files, opened (damaged ones dropped), queried, restored to a recorded
    position, truncated and appended to."""
    r = Reader(data)
    with scratch_dir() as d:
        for _ in range(r.uint(1) % 4):
            name, raw = _index_file(r)
            (d / name).write_bytes(raw)
        count, key, cut = r.int_in(0, 20), r.chunk(16).decode("latin-1"), r.uint(2)
        try:
            ki = KeyIndex(d, KI)
        except ConsumeQueueError:
            return
        try:
            for k in ("k0", "u3", key):
                with contextlib.suppress(ConsumeQueueError):
                    assert len(ki.query(k, 8)) <= 8
            name, _ = ki.position()
            try:
                ki.restore((name, count))
                ki.truncate_dirty_tail(cut)
                ki.put(["k0", key], ki.last_commitlog_offset + 48, 5_000)
            except ConsumeQueueError:
                pass
        finally:
            ki.close()
