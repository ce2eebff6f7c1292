"""The demo's books can tell: a lost, duplicated, misplaced or unexpected message is
counted (so the demo's ``lost 0, duplicated 0`` is a measurement, not a slogan), a
message read before its acknowledgement is processed is not mistaken for one, and the
file comparison names a replica whose bytes differ."""

from __future__ import annotations

from pathlib import Path

from dledger.store import FileStore, StoreSettings, node_dir
from dledger.store.entry import INDEX_UNIT
from ledgermq.client import ReceivedMessage, SendResult
from ledgermq.demo.load import History, LoadSettings, pack_position, percentile, unpack_position
from ledgermq.replicas import commitlog_roots, compare_commitlog_ranges, compare_trees


def _history() -> History:
    return History("r1", LoadSettings(batch=3))


def _msg(h: History, n: int, queue_id: int, queue_offset: int) -> ReceivedMessage:
    return ReceivedMessage(
        "demo", queue_id, queue_offset, f"id{n}", h.body(n).encode(), store_timestamp=1
    )


def _send(h: History, size: int, queue_id: int, first_offset: int) -> list[int]:
    first, bodies = h.next_batch(size)
    assert len(bodies) == size and all(len(b) >= LoadSettings().body_bytes for b in bodies)
    h.acknowledge(
        first, [SendResult(f"id{first + i}", queue_id, first_offset + i) for i in range(size)]
    )
    return list(range(first, first + size))


def test_every_acknowledged_message_read_once_balances() -> None:
    h = _history()
    for n in _send(h, 3, 0, 0) + _send(h, 3, 1, 0):
        h.deliver(_msg(h, n, n // 3, n % 3))
    assert (h.acknowledged, h.consumed, h.lost_count(), h.duplicated) == (6, 6, 0, 0)
    assert (h.misplaced, h.unexpected, h.foreign) == (0, 0, 0)


def test_a_message_never_read_is_lost() -> None:
    h = _history()
    sent = _send(h, 3, 0, 0)
    for n in sent[:2]:
        h.deliver(_msg(h, n, 0, n))
    assert h.lost_count() == 1 and h.lost() == [2]


def test_a_message_read_twice_is_duplicated() -> None:
    h = _history()
    sent = _send(h, 3, 0, 0)
    for n in [*sent, sent[1], sent[1]]:
        h.deliver(_msg(h, n, 0, n))
    assert (h.consumed, h.duplicated) == (3, 1)


def test_a_message_read_elsewhere_than_acknowledged_is_misplaced() -> None:
    h = _history()
    sent = _send(h, 2, 0, 0)
    h.deliver(_msg(h, sent[0], 0, 0))
    h.deliver(_msg(h, sent[1], 3, 1))  # acknowledged at queue 0
    assert h.misplaced == 1


def test_a_message_read_before_its_ack_is_processed_is_checked_at_the_ack() -> None:
    h = _history()
    first, _ = h.next_batch(2)
    h.deliver(_msg(h, first, 2, 7))  # the consumer was quicker than the producer's books
    h.deliver(_msg(h, first + 1, 2, 9))  # ... and this one is not where the ack says
    assert (h.consumed, h.unexpected, h.misplaced) == (2, 0, 0)
    h.acknowledge(first, [SendResult("a", 2, 7), SendResult("b", 2, 8)])
    assert (h.misplaced, h.lost_count()) == (1, 0)


def test_unsent_numbers_and_other_runs_are_told_apart() -> None:
    h = _history()
    _send(h, 1, 0, 0)
    h.deliver(_msg(h, 5, 0, 5))  # a number this run never sent
    other = History("r2", LoadSettings())
    h.deliver(_msg(other, 0, 0, 1))
    h.deliver(ReceivedMessage("demo", 0, 2, "x", b"something else"))
    assert (h.unexpected, h.foreign) == (1, 2)


def test_in_doubt_batches_may_be_absent_or_read_once() -> None:
    h = _history()
    first, _ = h.next_batch(2)
    h.doubt(first, 2)
    h.deliver(_msg(h, first, 0, 0))
    assert (h.in_doubt, h.recovered(), h.lost_count(), h.misplaced) == (2, 1, 0, 0)


def test_positions_pack_and_percentiles_rank() -> None:
    assert unpack_position(pack_position(7, 123_456_789)) == (7, 123_456_789)
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([1.0, 2.0], 0.5) == 1.0 and percentile([1.0, 2.0], 1.0) == 2.0


def test_file_comparison_names_the_differing_replica(tmp_path: Path) -> None:
    roots = {}
    for node in ("n0", "n1", "n2"):
        root = tmp_path / node
        (root / "data").mkdir(parents=True)
        (root / "data" / "00000000000000000000").write_bytes(b"entries" + bytes(100))
        roots[node] = root
    same = compare_trees("commitlog", roots, ("data",))
    assert same.identical and same.files == 1 and same.total_bytes == 107
    path = roots["n2"] / "data" / "00000000000000000000"
    raw = bytearray(path.read_bytes())
    raw[50] = 1  # one byte in the zero tail
    path.write_bytes(bytes(raw))
    (roots["n1"] / "data" / "00000000000000000107").write_bytes(b"")
    diff = compare_trees("commitlog", roots, ("data",))
    assert not diff.identical
    assert diff.differences == (
        "n1: data/00000000000000000107 differs from n0's",
        "n2: data/00000000000000000000 differs from n0's",
    )


def test_commitlog_ranges_compare_only_the_entries_every_node_holds(tmp_path: Path) -> None:
    """Issue 16 (a 20-minute chaos run): a node whose log head moved (retention, a
    snapshot install that reset its log) has zeros where another still holds old
    entries, so whole files differ; over the entries all of them hold the logs must be,
    and here are, byte-identical, and a flipped byte inside that range is caught."""
    dirs = {n: tmp_path / n for n in ("n0", "n1")}
    for node, d in dirs.items():
        store = FileStore(node_dir(d, "g0", node), StoreSettings(data_file_size=4096))
        store.append_as_leader(1, [b"entry %d " % i * 20 for i in range(40)])
        store.close()
    assert compare_commitlog_ranges(dirs, "g0", 0, 39).identical
    root = node_dir(dirs["n1"], "g0", "n1")
    begin = 10  # n1's log as if reset at entry 10: what came before is zeros
    unit = (root / "index" / "00000000000000000000").read_bytes()[begin * 32 : begin * 32 + 32]
    begin_pos = INDEX_UNIT.unpack(unit)[1]
    for sub, upto in (("index", begin * 32), ("data", begin_pos)):
        for start, path in sorted((int(p.name), p) for p in (root / sub).iterdir()):
            raw = bytearray(path.read_bytes())
            cut = max(0, min(len(raw), upto - start))
            raw[:cut] = bytes(cut)
            path.write_bytes(bytes(raw))
    assert not compare_trees("commitlog", commitlog_roots(dirs, "g0"), ("data", "index")).identical
    assert compare_commitlog_ranges(dirs, "g0", begin, 39).identical
    assert not compare_commitlog_ranges(dirs, "g0", 0, 39).identical
    data = sorted((root / "data").iterdir())[-1]
    raw = bytearray(data.read_bytes())
    raw[60] ^= 0xFF  # inside an entry n1 still holds
    data.write_bytes(bytes(raw))
    diff = compare_commitlog_ranges(dirs, "g0", begin, 39)
    assert diff.differences == (f"n1: entries [{begin}, 39] differ from n0's",)
