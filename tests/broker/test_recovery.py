"""Restart recovery of the derived state across a topic delete and re-create (more
queues): whichever metadata snapshot is on disk, older or newer than the dispatch
checkpoint, and whichever derived files are lost, the consume queues and the key index
come back byte for byte as live dispatch wrote them (recover-across-topic-delete, found
by the broker simulation), and the metadata as the log says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.broker import Broker, NewMessage
from tests.broker.harness import BrokerCluster
from tests.waiting import until

pytestmark = pytest.mark.asyncio


def _derived(c: BrokerCluster) -> dict[str, bytes]:
    root = c.settings("n0").data_dir
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("consumequeue/g0", "index/g0")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


async def _churn(b: Broker) -> bytes:
    """Messages with keys in a topic of 2 queues, a snapshot half-way through them; the
    topic deleted and made again with 3 queues, more messages (some keys again) and an
    offset commit. Returns the dispatch checkpoint file as it was half-way."""
    await b.topics.create("t", 2)
    for i in range(40):
        await b.producer.produce("t", [NewMessage(b"old%d" % i, keys=[f"k{i % 7}", f"o{i}"])])
        if i == 20:
            await b.dispatcher.snapshot()
            await b.dispatcher.checkpoint()
            half_way = b.dispatcher.checkpoints.path.read_bytes()
    await b.topics.delete("t")
    await b.topics.create("t", 3)
    for i in range(30):
        await b.producer.produce("t", [NewMessage(b"new%d" % i, keys=[f"k{i % 7}"])] * 2)
    await b.groups.commit_offsets("g", "t", {1: 5})
    return half_way


def _lose(c: BrokerCluster, what: str, half_way_checkpoint: bytes) -> None:
    root = c.settings("n0").data_dir
    if what == "older checkpoint":  # a crash before any checkpoint after the delete
        (root / "consumequeue" / "checkpoint-g0").write_bytes(half_way_checkpoint)
    elif what == "older snapshot":  # only the one taken before the delete is left
        *_, newest = sorted((root / "metadata" / "g0").iterdir())
        newest.unlink()
    elif what == "consume queues":  # a rebuild, with a snapshot newer than the log head
        c.wipe_consume_queues("n0")
    elif what == "a key index file":  # the first file's header never reached the disk
        first = min((root / "index" / "g0").iterdir())
        fd = os.open(first, os.O_RDWR)
        os.pwrite(fd, bytes(64), 0)
        os.close(fd)


@pytest.mark.parametrize(
    "lost", ["older snapshot", "older checkpoint", "consume queues", "a key index file"]
)
async def test_restart_after_delete_and_recreate_rebuilds_the_same_files(
    tmp_path: Path, lost: str
) -> None:
    c = BrokerCluster(tmp_path, n=1)
    await c.start_all()
    try:
        b = await c.master()
        half_way = await _churn(b)
        topic = b.topics.get("t")
        await c.stop("n0")
        before = _derived(c)
        _lose(c, lost, half_way)
        b = await c.start("n0")
        await until(lambda: b.is_master, what="master again")
        # An older checkpoint names t/0 and t/1, now the new topic's, which hold more
        # units than it recorded: not the queues it recorded.
        assert b.dispatcher.stats["rebuilds"] == (lost in ("consume queues", "older checkpoint"))
        assert _derived(c) == before
        assert b.topics.get("t") == topic and b.meta.committed_offset("g", "t", 1) == 5
        assert [b.reads.queue_bounds("t", q) for q in range(3)] == [(0, 20)] * 3
        assert [m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", "k3")][:2] == [
            b"new24",
            b"new24",
        ]
        [res] = await b.producer.produce("t", [NewMessage(b"next")], producer_id="p", sequence=0)
        assert res.queue_offset == 20
    finally:
        await c.close()


@pytest.mark.parametrize(
    "garbage",
    [b"[]", b"{}", b'"x"', b"null", b"\xff\xfe", b'{"version": 1, "topics": 5}'],
    ids=["list", "empty-object", "string", "null", "not-utf8", "wrong-shape"],
)
async def test_a_damaged_metadata_snapshot_never_stops_a_restart(
    tmp_path: Path, garbage: bytes
) -> None:
    """The newest snapshot file holds garbage (``[]`` crashed startup): it is skipped
    with a warning, an older one or the log rebuilds the metadata, nothing is lost."""
    c = BrokerCluster(tmp_path, n=1)
    b = await c.start("n0")
    try:
        await until(lambda: b.is_master, what="master")
        await b.topics.create("t", 2)
        await b.producer.produce("t", [NewMessage(b"a%d" % i) for i in range(10)])
        await b.groups.commit_offsets("g", "t", {0: 3})
        await b.dispatcher.snapshot()
    finally:
        await c.stop("n0")
    snaps = sorted((c.settings("n0").data_dir / "metadata" / "g0").iterdir())
    assert snaps
    snaps[-1].write_bytes(garbage)
    b = await c.start("n0")
    try:
        await until(lambda: b.is_master, what="master again")
        assert b.meta.topics["t"].queues == 2
        assert b.meta.committed_offset("g", "t", 0) == 3
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0, max_messages=100)
        r1 = await b.reads.pull(b.reads.pulled_message, "t", 1, 0, max_messages=100)
        assert len(r.messages) + len(r1.messages) == 10
    finally:
        await c.close()
