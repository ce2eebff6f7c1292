"""Dispatch as a list of appliers (``broker/dispatch``): the walk hands each committed
entry to the appliers in their order, and the replicated state's appliers get it once,
whatever the replays and retries; the metadata snapshot is the state appliers' parts
side by side, in the bytes docs/formats.md shows; a new applier's part round-trips and
is empty in a snapshot written before it existed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.commitlog import DLedgerCommitLog
from broker.dispatch.appliers import state_appliers
from broker.dispatch.entry import Applier, Committed, StateApplier
from broker.dispatch.snapshots import parse_snapshot, snapshot_bytes
from broker.dispatch.walk import ReputMessageService
from broker.jsonint import json_int
from broker.message import encode_message
from broker.metadata import (
    SYS_TOPIC,
    MetadataState,
    op_commit_offsets,
    op_create_topic,
)
from dledger.store import MAGIC_NOOP, MemoryStore

ROOT = Path(__file__).resolve().parents[2]


def _documented_snapshot() -> bytes:
    text = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line.startswith('{"version"')).encode()


def _state() -> MetadataState:
    """The state of the snapshot docs/formats.md shows."""
    meta = MetadataState()
    meta.apply_op(1, orjson.dumps(op_create_topic("orders", 2)))
    meta.apply_op(5, orjson.dumps(op_commit_offsets("g", "orders", {0: 1})))
    meta.record_session("p1", 3, 0, 1, (0, 1, 340))
    meta.applied_index = 7
    return meta


def test_sessions_are_bounded_by_the_results_they_keep_too() -> None:
    """Issue 32: up to 100,000 sessions each keeping its last batch's results (~25 bytes
    each in the snapshot, 1,000 a batch) could pass what a snapshot may send; the least
    recently used go first once they keep more than ``max_session_results``, the same
    on every replica, and a snapshot's sessions count what they keep."""
    meta = MetadataState(max_sessions=100, max_session_results=10)
    for n, pid in enumerate(("p1", "p2", "p3")):
        for i in range(4):
            meta.record_session(pid, 0, i, 4, (0, 4 * n + i, 100 * (4 * n + i)))
    assert list(meta.sessions) == ["p2", "p3"] and meta.session_results == 8
    meta.record_session("p2", 1, 0, 1, (0, 12, 1200))  # p2's next batch replaces its last
    assert list(meta.sessions) == ["p3", "p2"] and meta.session_results == 5
    parts = state_appliers(meta)
    data = snapshot_bytes(meta, parts, {})
    again = MetadataState(max_sessions=100, max_session_results=10)
    parse_snapshot(data, state_appliers(again)).adopt(again)
    assert again.session_results == 5 and list(again.sessions) == ["p3", "p2"]


def test_the_snapshot_is_the_state_appliers_parts_in_the_documented_bytes() -> None:
    meta = _state()
    data = snapshot_bytes(meta, state_appliers(meta), {"queues": {"orders/0": 2, "orders/1": 0}})
    assert data == _documented_snapshot()
    again = MetadataState()
    parts = state_appliers(again)
    snapshot = parse_snapshot(data, parts)
    snapshot.adopt(again)
    assert snapshot_bytes(again, parts, snapshot.extra) == data


def test_a_malformed_part_is_a_value_error_and_adopts_nothing() -> None:
    doc = orjson.loads(_documented_snapshot())
    doc["sessions"] = [["p1", 3.5, 1, []]]
    meta = MetadataState()
    with pytest.raises(ValueError, match=r"malformed metadata snapshot.*sequence"):
        parse_snapshot(orjson.dumps(doc), state_appliers(meta))
    assert (meta.applied_index, meta.topics, meta.offsets) == (-1, {}, {})


class _LastSeen:
    """A toy kind of replicated state, as a new applier would add one: when each topic
    last had a message, by the master's stamp (time from the entries)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.applied: list[int] = []

    def apply(self, e: Committed) -> None:
        self.applied.append(e.index)
        if not e.system:
            self.last[e.info.topic] = e.info.store_timestamp

    def snapshot_part(self) -> dict[str, Any]:
        return {"last_seen": self.last}

    def parse_part(self, doc: Mapping[str, Any]) -> dict[str, int]:
        return {str(t): json_int(ms, "timestamp") for t, ms in doc.get("last_seen", {}).items()}

    def adopt_part(self, part: dict[str, int]) -> None:
        self.last = part


class _Recorder:
    """An applier that notes what it is handed, and fails once on entry ``fail_at``."""

    def __init__(self, name: str, seen: list[tuple[str, int]], fail_at: int = -1) -> None:
        self.name, self.seen, self.fail_at = name, seen, fail_at

    def apply(self, e: Committed) -> None:
        self.seen.append((self.name, e.index))
        if e.index == self.fail_at:
            self.fail_at = -1
            raise OSError(28, "No space left on device")


def _log() -> tuple[MemoryStore, list[int]]:
    """A committed log: a topic made, messages, a NOOP and an entry that is not a
    message record; returns the store and the indexes of the message records."""
    store = MemoryStore()
    store.add_append_hook(DLedgerCommitLog._append_hook)  # PHYSICALOFFSET = pos + 48
    op = orjson.dumps(op_create_topic("t", 1))
    records = [encode_message(topic=SYS_TOPIC, body=op, born_timestamp=1)]
    records += [
        encode_message(topic="t", body=b"m", queue_offset=i, born_timestamp=1, store_timestamp=t)
        for i, t in enumerate((1000, 2000))
    ]
    store.append_as_leader(1, records)
    store.append_as_leader(1, [b""], magic=MAGIC_NOOP)
    store.append_as_leader(1, [b"not a message record"])
    store.append_as_leader(
        1,
        [encode_message(topic="t", body=b"m", queue_offset=2, born_timestamp=1, store_timestamp=3)],
    )
    store.update_committed(store.ledger_end_index)
    return store, [0, 1, 2, 5]


def test_the_walk_hands_each_entry_to_the_appliers_in_order_the_state_once() -> None:
    store, messages = _log()
    meta, seen = MetadataState(), []
    stats = {"entries": 0, "skipped": 0}
    state: list[Applier] = [_Recorder("a", seen), _Recorder("b", seen)]
    walk = ReputMessageService(store, meta, state, [_Recorder("c", seen)], stats)
    assert walk.dispatch_some(100) == 6
    assert seen == [(name, i) for i in messages for name in "abc"]  # no NOOP, no garbage
    assert stats == {"entries": 6, "skipped": 1}
    assert walk.dispatched_index == meta.applied_index == 5
    seen.clear()
    walk.reset(-1)  # a restart replays what the state has: only the files' appliers run
    walk.replay(5)
    assert seen == [("c", i) for i in messages]


def test_an_entry_a_disk_error_stopped_goes_again_to_the_files_appliers_only() -> None:
    store, _messages = _log()
    meta, seen = MetadataState(), []
    stats = {"entries": 0, "skipped": 0}
    flaky = _Recorder("c", seen, fail_at=2)
    walk = ReputMessageService(store, meta, [_Recorder("a", seen)], [flaky], stats)
    with pytest.raises(OSError):
        walk.dispatch_some(100)
    assert walk.dispatched_index == 1 and stats["entries"] == 2
    assert walk.dispatch_some(100) == 4
    # entry 2 reached "a" once, "c" twice: before the disk error and after it
    assert seen == [(name, i) for i in (0, 1, 2) for name in "ac"] + [("c", 2), ("a", 5), ("c", 5)]


def test_a_new_state_applier_has_its_part_and_reads_older_snapshots_as_empty() -> None:
    store, _messages = _log()
    meta, toy = MetadataState(), _LastSeen()
    parts: list[StateApplier[Any]] = [*state_appliers(meta), toy]
    ReputMessageService(store, meta, parts, [], {"entries": 0, "skipped": 0}).dispatch_some(9)
    assert toy.applied == [0, 1, 2, 5] and toy.last == {"t": 3}  # the last one's stamp
    data = snapshot_bytes(meta, parts)
    fields = ["version", "applied_index", "topics", "offsets", "sessions", "pop", "timers"]
    fields += ["transactions", "send_window"]
    fields += ["last_seen", "extra"]
    assert list(orjson.loads(data)) == fields
    again, new_toy = MetadataState(), _LastSeen()
    parse_snapshot(data, [*state_appliers(again), new_toy]).adopt(again)
    assert (new_toy.last, again.topics) == (toy.last, meta.topics)
    older = _LastSeen()
    parse_snapshot(snapshot_bytes(meta, parts[:-1]), [*state_appliers(again), older]).adopt(again)
    assert older.last == {}
