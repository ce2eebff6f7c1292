"""Are the replicas the same? Two ways to look (the demo's last question, and chaos
tests' later):

- ``read_queues``: over HTTP, one node at a time (an ``AsyncAdmin`` holding only that
  node's URL, so nothing is routed elsewhere), every queue of a topic over an offset
  range: a digest of each queue's (queue offset, message id, body) sequence, and a
  callback per message. Equal digests on every node mean equal consume queues and, as
  a message id is the commitlog offset, equal positions in the commitlogs.
- ``compare_trees``: on disk, the files of each node's commitlog (DLedger ``data`` and
  ``index``) or consume queues, byte for byte, with the first differing file named.
  Meaningful once the nodes are idle (every node's log ends at the same committed
  index); segments are preallocated, so equal bytes include equal zero tails.
- ``compare_commitlog_ranges``: the commitlog over the entries every node holds,
  ``[begin_index, end_index]``: their index units and the data bytes from the first
  entry's ``pos`` to the last entry's end. Where retention or a snapshot install moved a
  node's log head, the bytes before it are no longer the log (zeros on a node whose log
  was reset there, old entries on one whose retention has not reached them) and whole
  files differ; this is what must be byte-identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dledger.store import node_dir
from dledger.store.entry import INDEX_UNIT, INDEX_UNIT_SIZE

from .client import AsyncAdmin, ClientSettings, ReceivedMessage

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class QueueImage:
    """One queue on one node over [start, end): how many messages and their digest."""

    queue_id: int
    start: int
    end: int
    count: int
    digest: str


async def read_queues(
    url: str,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    settings: ClientSettings,
    on_message: Callable[[ReceivedMessage], None] = lambda _m: None,
    *,
    max_messages: int = 1000,
) -> dict[int, QueueImage]:
    """Every queue of ``ranges`` (queue id → [start, end)) as node ``url`` holds it.
    A queue the node holds less of ends early (its count tells); the loop is bounded by
    the range's length."""
    out: dict[int, QueueImage] = {}
    async with AsyncAdmin([url], settings=settings) as admin:
        for q, (start, end) in sorted(ranges.items()):
            h = hashlib.blake2b(digest_size=16)
            offset, count = start, 0
            for _ in range(end - start + 1):  # each pull moves on by at least one
                if offset >= end:
                    break
                r = await admin.pull(topic, q, offset, max_messages=min(max_messages, end - offset))
                if r.status != "FOUND" or not r.messages:
                    break
                for m in r.messages:
                    if m.queue_offset >= end:
                        break
                    h.update(b"%d %s %d\n" % (m.queue_offset, m.msg_id.encode(), len(m.body)))
                    h.update(m.body)
                    on_message(m)
                    count += 1
                offset = r.next_offset
            out[q] = QueueImage(q, start, end, count, h.hexdigest())
    return out


@dataclass(frozen=True, slots=True)
class TreeComparison:
    """Byte-for-byte comparison of one kind of file tree across nodes."""

    what: str
    nodes: tuple[str, ...]
    files: int
    total_bytes: int
    differences: tuple[str, ...]  # "n1: data/00000000000000000000 differs", at most a few

    @property
    def identical(self) -> bool:
        return not self.differences and self.files > 0


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _tree(root: Path, subdirs: Sequence[str]) -> dict[str, tuple[int, str]]:
    out = {}
    for sub in subdirs:
        base = root / sub if sub else root
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file():
                out[str(p.relative_to(root))] = (p.stat().st_size, _file_digest(p))
    return out


def compare_trees(
    what: str, roots: Mapping[str, Path], subdirs: Sequence[str] = ("",), max_reported: int = 5
) -> TreeComparison:
    """The files under ``root/subdir`` for each node's ``root``, by relative name, size
    and content, against the first node's."""
    nodes = tuple(sorted(roots))
    images = {n: _tree(roots[n], subdirs) for n in nodes}
    ref = images[nodes[0]]
    diffs: list[str] = []
    for n in nodes[1:]:
        for name in sorted(ref.keys() | images[n].keys()):
            if ref.get(name) != images[n].get(name):
                diffs.append(f"{n}: {name} differs from {nodes[0]}'s")
    total = sum(size for size, _ in ref.values())
    return TreeComparison(what, nodes, len(ref), total, tuple(diffs[:max_reported]))


def commitlog_roots(data_dirs: Mapping[str, Path], group: str) -> dict[str, Path]:
    """Each node's DLedger directory (``<data>/dledger/<group>/<node>``)."""
    return {n: node_dir(d, group, n) for n, d in data_dirs.items()}


def consume_queue_roots(data_dirs: Mapping[str, Path], group: str) -> dict[str, Path]:
    return {n: Path(d) / "consumequeue" / group for n, d in data_dirs.items()}


def compare_commitlogs(data_dirs: Mapping[str, Path], group: str) -> TreeComparison:
    """The DLedger data and index files: the commitlog, byte for byte (``currterm`` and
    ``checkpoint`` are each node's own state and may differ)."""
    return compare_trees("commitlog", commitlog_roots(data_dirs, group), ("data", "index"))


def compare_consume_queues(data_dirs: Mapping[str, Path], group: str) -> TreeComparison:
    """Every consume queue file of every topic (the dispatch checkpoint is each node's)."""
    roots = consume_queue_roots(data_dirs, group)
    return compare_trees("consume queues", roots)


def _segments(directory: Path) -> list[tuple[int, Path]]:
    """A segment list's files by start position (the 20-digit name)."""
    return sorted((int(p.name), p) for p in directory.iterdir() if p.name.isdigit())


def _read_span(directory: Path, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the segment list in ``directory`` (missing: short)."""
    out = bytearray()
    for first, path in _segments(directory):
        size = path.stat().st_size
        lo, hi = max(start, first), min(end, first + size)
        if lo < hi:
            with path.open("rb") as f:
                f.seek(lo - first)
                out += f.read(hi - lo)
    return bytes(out)


def commitlog_range_digest(root: Path, begin_index: int, end_index: int) -> str:
    """The digest of one node's index units ``[begin_index, end_index]`` and of its data
    bytes from the first of those entries to the end of the last."""
    units = _read_span(
        root / "index", begin_index * INDEX_UNIT_SIZE, (end_index + 1) * INDEX_UNIT_SIZE
    )
    if len(units) != (end_index - begin_index + 1) * INDEX_UNIT_SIZE:
        return f"missing index units (has {len(units) // INDEX_UNIT_SIZE})"
    _, first_pos, _, _, _ = INDEX_UNIT.unpack_from(units, 0)
    _, last_pos, last_size, _, _ = INDEX_UNIT.unpack_from(units, len(units) - INDEX_UNIT_SIZE)
    h = hashlib.blake2b(units, digest_size=16)
    h.update(_read_span(root / "data", first_pos, last_pos + last_size))
    return h.hexdigest()


def compare_commitlog_ranges(
    data_dirs: Mapping[str, Path], group: str, begin_index: int, end_index: int
) -> TreeComparison:
    """The commitlog of every node over ``[begin_index, end_index]`` (the entries all of
    them hold: the largest ledger begin, the common ledger end), against the first
    node's. ``files`` counts entries, ``total_bytes`` the index units compared."""
    roots = commitlog_roots(data_dirs, group)
    nodes = tuple(sorted(roots))
    digests = {n: commitlog_range_digest(roots[n], begin_index, end_index) for n in nodes}
    diffs = tuple(
        f"{n}: entries [{begin_index}, {end_index}] differ from {nodes[0]}'s"
        for n in nodes[1:]
        if digests[n] != digests[nodes[0]]
    )
    count = end_index - begin_index + 1
    what = f"commitlog entries [{begin_index}, {end_index}]"
    return TreeComparison(what, nodes, max(0, count), max(0, count) * INDEX_UNIT_SIZE, diffs)
