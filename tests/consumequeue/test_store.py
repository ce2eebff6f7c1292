"""ConsumeQueueStore: lazy opening, load, topics, deleting topics and queues."""

from __future__ import annotations

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
