"""ConsumeQueueStore: lazy opening, load, topics, deleting topics and queues."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from consumequeue import ConsumeQueueError, ConsumeQueueSettings, ConsumeQueueStore

SMALL = ConsumeQueueSettings(segment_units=4)


def test_queue_opens_lazily_and_find_never_creates(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, SMALL)
    assert store.find("T", 0) is None and not (tmp_path / "T").exists()
    q = store.queue("T", 0)
    assert store.queue("T", 0) is q and store.find("T", 0) is q
    assert q.path == tmp_path / "T" / "0"
    assert list(store) == [q] and len(store) == 1
    store.close()
    assert q.closed and len(store) == 0


def test_load_opens_every_queue_on_disk(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, SMALL)
    names = ["orders", "a%RETRY%g|x", "b-1_2"]
    for topic in names:
        for queue_id in (2, 0):
            store.queue(topic, queue_id).put(0, 48 + queue_id, 10, 0)
    store.flush()
    store.close()
    (tmp_path / "checkpoint").write_text("{}")  # the owner's file beside the topics
    store = ConsumeQueueStore(tmp_path, SMALL)
    assert store.topics() == {}
    store.load()
    assert store.topics() == {t: [0, 2] for t in sorted(names)}
    q = store.find("a%RETRY%g|x", 2)
    assert q is not None and q.get(0) == (50, 10, 0)
    store.close()


def test_delete_topic_closes_its_queues_and_removes_the_directory(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, SMALL)
    gone, kept = store.queue("gone", 0), store.queue("kept", 1)
    (tmp_path / "gone" / "7").mkdir()  # on disk but never opened
    store.delete_topic("gone")
    assert gone.closed and not kept.closed
    assert not (tmp_path / "gone").exists()
    assert store.topics() == {"kept": [1]} and store.find("gone", 0) is None
    store.delete_topic("never-existed")
    store.close()


def test_delete_queue_and_delete_all_keep_the_files_beside_the_topics(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, SMALL)
    one, other = store.queue("T", 0), store.queue("T", 1)
    store.delete_queue("T", 0)
    assert one.closed and not other.closed and store.topics() == {"T": [1]}
    assert sorted(p.name for p in (tmp_path / "T").iterdir()) == ["1"]
    (tmp_path / "checkpoint").write_text("{}")
    (tmp_path / "U" / "x").mkdir(parents=True)  # a directory that would not load
    store.flush()  # the directory changes are made durable too
    store.delete_all()
    assert other.closed and len(store) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]
    store.close()


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "a b", "x" * 128, "tópico"])
def test_illegal_topic_names_are_refused(tmp_path: Path, topic: str) -> None:
    store = ConsumeQueueStore(tmp_path, SMALL)
    with pytest.raises(ValueError, match="illegal topic name"):
        store.queue(topic, 0)
    with pytest.raises(ValueError, match="queue_id"):
        store.queue("T", -1)
    store.close()


def test_load_refuses_a_stranger_in_the_root(tmp_path: Path) -> None:
    (tmp_path / "T" / "zero").mkdir(parents=True)
    store = ConsumeQueueStore(tmp_path, SMALL)
    with pytest.raises(ConsumeQueueError, match="not a queue directory"):
        store.load()
    (tmp_path / "T" / "zero").rmdir()
    (tmp_path / "a b").mkdir()
    with pytest.raises(ConsumeQueueError, match="not a topic directory"):
        store.load()
    store.close()


# ---- issue 31: a bound on the queues whose segments are mapped -----------------------------

LRU = ConsumeQueueSettings(segment_units=4, max_open_queues=2)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fill(store: ConsumeQueueStore, topic: str, n: int, first: int = 0) -> None:
    q = store.queue(topic, 0)
    for i in range(first, first + n):
        assert q.put(i, 48 + 100 * i, 100, i)


def test_past_max_open_queues_the_least_recently_used_synced_ones_are_suspended(
    tmp_path: Path,
) -> None:
    """Unsynced queues stay mapped (the limit is soft until the next flush); after it,
    each use of one more queue suspends the least recently used, whose descriptors are
    closed; a suspended queue reads, appends (rolling on), and is used again as if it
    had never been closed, and the store stays within the limit."""
    store = ConsumeQueueStore(tmp_path, LRU)
    for t in ("a", "b", "c"):
        _fill(store, t, 6)  # two segments each
    assert store.mapped == 3 and store.suspensions == 0  # all unsynced: none suspended
    store.flush()
    fds = _open_fds()
    store.queue("c", 0)
    store.queue("b", 0)  # "a" is the least recently used, then "c"
    _fill(store, "d", 1)  # one more mapped queue: down to the limit, "a" and "c" go
    a, c = store.find("a", 0), store.find("c", 0)
    assert a is not None and a.suspended and c is not None and c.suspended
    assert store.mapped == 2 and store.suspensions == 2
    assert _open_fds() < fds  # 2 segments of 2 queues closed, 1 of "d" opened
    assert a.read(0, 10) == [(i, 48 + 100 * i, 100, i) for i in range(6)]  # mapped again
    assert not a.suspended and store.mapped <= 3
    store.flush()
    _fill(store, "a", 5, first=6)  # appends to its tail segment, then rolls
    assert (a.min_offset, a.max_offset) == (0, 11) and a.get(10) == (1048, 100, 10)
    store.flush()
    for t in ("b", "c", "d", "a", "b"):
        store.queue(t, 0)
    assert store.mapped == 2
    store.close()
    store = ConsumeQueueStore(tmp_path, LRU)  # what suspended queues hold is on disk
    store.load()
    assert {t: (q.min_offset, q.max_offset) for t in "abcd" if (q := store.find(t, 0))} == {
        "a": (0, 11),
        "b": (0, 6),
        "c": (0, 6),
        "d": (0, 1),
    }
    store.close()


def test_a_suspended_queue_truncates_resets_and_follows_retention(tmp_path: Path) -> None:
    """Every change to a suspended queue's files maps them first: truncation zeroes the
    units it drops, retention deletes whole head segments, a reset deletes them all."""
    store = ConsumeQueueStore(tmp_path, ConsumeQueueSettings(segment_units=4, max_open_queues=1))
    for t in ("a", "b", "c", "d"):
        _fill(store, t, 10)
    store.flush()
    assert store.mapped == 4 and store.trim() == 1  # "d", the most recently used
    qs = {t: store.find(t, 0) for t in "abc"}
    assert all(q is not None and q.suspended for q in qs.values())
    a, b, c = qs["a"], qs["b"], qs["c"]
    assert a is not None and b is not None and c is not None
    assert a.truncate(7) == 7 and a.get(7) is None and a.max_commitlog_offset_end == 48 + 700
    assert b.correct_min_offset(48) == 0 and b.suspended  # its head is there: unmapped still
    assert b.correct_min_offset(48 + 100 * 5) == 5
    assert sorted(p.name for p in b.path.iterdir()) == [f"{80:020d}", f"{160:020d}"]
    c.reset(100)
    assert (c.min_offset, c.max_offset) == (100, 100) and c.put(100, 5000, 10, 0)
    store.flush()
    store.close()
    store = ConsumeQueueStore(tmp_path, SMALL)
    store.load()
    a2, b2, c2 = (store.find(t, 0) for t in "abc")
    assert a2 is not None and b2 is not None and c2 is not None
    assert (a2.max_offset, b2.min_offset, c2.min_offset, c2.max_offset) == (7, 4, 100, 101)
    store.close()


def test_deleting_a_suspended_queue_or_its_topic(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, LRU)
    for t in ("a", "b", "c"):
        _fill(store, t, 2)
    store.flush()
    _fill(store, "d", 1)
    assert store.find("a", 0) is not None
    store.delete_topic("a")
    store.delete_queue("b", 0)
    assert store.topics() == {"c": [0], "d": [0]} and store.mapped <= 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "0").exists()
    store.close()
