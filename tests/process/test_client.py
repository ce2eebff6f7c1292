"""``ledgermq.client`` against three broker processes on 127.0.0.1 (``cluster3``, and
``fresh_cluster3`` for the tests that kill or stop a node): round trips sync and async,
master discovery from a slave, retries deduplicated by the producer session, and a
master killed or paused mid-stream with nothing lost or duplicated. The client without
a server (its sans-I/O core and drivers) is tested in ``tests/api/test_client.py``."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import Counter

import httpx
import pytest

from ledgermq import client as mq
from ledgermq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    Message,
    Producer,
    ReceivedMessage,
)
from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until


def read_all(admin: Admin, topic: str) -> dict[int, list[ReceivedMessage]]:
    """Every retained message of every queue, in offset order (bounded)."""
    out: dict[int, list[ReceivedMessage]] = {}
    for q in admin.describe_topic(topic).queues:
        got: list[ReceivedMessage] = []
        offset = q.min_offset
        for _ in range(1000):
            if offset >= q.max_offset:
                break
            r = admin.pull(topic, q.queue_id, offset, max_messages=500)
            got += r.messages
            offset = r.next_offset
        out[q.queue_id] = got
    return out


def slave_url(cl: LocalBrokerCluster) -> tuple[str, str]:
    master = cl.wait_ready(timeout_s=30)
    slave = next(n for n in cl.ids if n != master)
    return cl.urls[master], cl.urls[slave]


def test_round_trip_sync(cluster3: LocalBrokerCluster) -> None:
    topic = "rt-sync"
    sent: list[mq.MessageLike] = [
        "plain",
        b"\x00\xffbinary",
        Message("keyed", key="k1", tags="TagA", properties={"color": "red"}),
        Message("pinned", queue_id=3),
        {"body": "from a dict", "keys": ["a", "b"]},
        *[Message(f"ordered-{i}", sharding_key="order-1") for i in range(10)],
    ]
    with Admin(cluster3.brokers) as admin:
        assert admin.create_topic(topic, 4) == mq.TopicInfo(topic, 4, created=True)
        assert admin.create_topic(topic, 4).created is False
        with Producer(cluster3.brokers) as p:
            results = p.send(topic, sent)
            results.append(p.send_one(topic, "last", tags="TagB"))
            assert p.sequence == 2
        assert results[3].queue_id == 3
        assert len({r.queue_id for r in results[5:15]}) == 1  # one sharding key, one queue
        with Consumer(cluster3.brokers, "rt-g", topic) as c:
            got = list(c.messages(max_messages=len(results), max_idle_s=10, wait_ms=500))
        assert sorted((m.queue_id, m.queue_offset) for m in got) == sorted(
            (r.queue_id, r.queue_offset) for r in results
        )
        by_id = {m.msg_id: m for m in got}
        assert by_id[results[1].msg_id].body == b"\x00\xffbinary"
        keyed = by_id[results[2].msg_id]
        assert (keyed.text, keyed.key, keyed.tags, keyed.properties.get("color")) == (
            "keyed",
            "k1",
            "TagA",
            "red",
        )
        assert set(by_id[results[4].msg_id].keys) == {"a", "b"}
        assert keyed.topic == topic and keyed.store_timestamp >= keyed.born_timestamp > 0
        ordered = [m.text for m in got if m.text.startswith("ordered-")]
        assert ordered == [f"ordered-{i}" for i in range(10)]
        # Closing committed everything: the group has no lag, a new member gets nothing.
        assert all(o.lag == 0 for o in admin.group_offsets("rt-g", topic))
        with Consumer(cluster3.brokers, "rt-g", topic) as c:
            assert c.poll(10, wait_ms=200) == []
        assert "rt-g" in admin.groups()


def test_round_trip_async(cluster3: LocalBrokerCluster) -> None:
    topic = "rt-async"

    async def run() -> None:
        async with AsyncProducer(cluster3.brokers) as p:
            results = await p.send(topic, [f"a-{i}" for i in range(20)])
        async with AsyncConsumer(cluster3.brokers, "rt-ag", topic) as c:
            got = [m async for m in c.messages(max_messages=20, max_idle_s=10, wait_ms=500)]
            assert await c.poll(5, wait_ms=0) == []
        assert sorted(m.text for m in got) == sorted(f"a-{i}" for i in range(20))
        assert {m.msg_id for m in got} == {r.msg_id for r in results}
        async with AsyncAdmin(cluster3.brokers) as admin:
            offsets = await admin.group_offsets("rt-ag", topic)
            assert sum(o.lag for o in offsets) == 0
            assert sum(o.committed_offset or 0 for o in offsets) == 20

    asyncio.run(run())


def test_master_discovery_from_a_slave_url(cluster3: LocalBrokerCluster) -> None:
    master, slave = slave_url(cluster3)
    with Producer(slave) as p:
        unknown = p.master
        assert unknown is None
        p.send("disco", ["x"])
        assert p.master == master
    with Admin(slave) as admin:  # admin writes find it the same way
        admin.create_topic("disco-2", 2)
        assert admin.master == master
        views = admin.cluster_all()  # learns the other nodes from the one it was given
        assert [v.node_id for v in views] == cluster3.ids
        assert sorted(v.status.broker_role for v in views if v.status) == [
            "MASTER",
            "SLAVE",
            "SLAVE",
        ]


def test_cluster_all_shows_a_node_that_does_not_answer(cluster3: LocalBrokerCluster) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with Admin([dead, *cluster3.urls.values()], timeout_s=2) as admin:
        views = admin.cluster_all()
    assert [v.node_id for v in views if v.status] == cluster3.ids
    strays = [v for v in views if v.status is None]
    assert [(v.url, v.node_id) for v in strays] == [(dead, None)]
    assert "BROKER_UNAVAILABLE" in (strays[0].error or "")


class LoseFirstReply(httpx.BaseTransport):
    """Forwards to the real broker, but the first produce's answer is "lost" (a read
    timeout after the broker did the work): what a client sees when a master dies or a
    network drops between commit and reply."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.lost = 0
        self.produce_bodies: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/messages"):
            self.produce_bodies.append(request.read())
            if self.lost == 0:
                response.read()
                response.close()
                self.lost += 1
                raise httpx.ReadTimeout("reply lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_lost_reply_is_retried_and_deduplicated(cluster3: LocalBrokerCluster) -> None:
    topic = "dedupe-lost"
    transport = LoseFirstReply()
    with Producer(cluster3.brokers, transport=transport) as p:
        results = p.send(topic, [f"m{i}" for i in range(5)])
    assert transport.lost == 1
    assert len(transport.produce_bodies) == 2
    assert transport.produce_bodies[0] == transport.produce_bodies[1]  # same session, same sequence
    with Admin(cluster3.brokers) as admin:
        stored = [m for q in read_all(admin, topic).values() for m in q]
    assert sorted(m.text for m in stored) == [f"m{i}" for i in range(5)]  # once each
    assert {m.msg_id for m in stored} == {r.msg_id for r in results}


def test_a_resent_session_batch_is_answered_not_appended(cluster3: LocalBrokerCluster) -> None:
    topic = "dedupe-resend"
    batch = [f"r{i}" for i in range(3)]
    with Producer(cluster3.brokers, producer_id="p-resend") as p:
        first = p.send(topic, batch)
    # A restarted process resuming its session resends sequence 0.
    with Producer(cluster3.brokers, producer_id="p-resend", first_sequence=0) as p:
        again = p.send(topic, batch)
        p.send(topic, ["next"])  # sequence 1
        p._ops.sequence = 0  # a stale retry from before it
        with pytest.raises(mq.SequenceTooOldError):
            p.send(topic, ["late"])
    assert again == first
    with Admin(cluster3.brokers) as admin:
        assert sorted(m.text for v in read_all(admin, topic).values() for m in v) == [
            "next",
            *batch,
        ]


def test_a_manual_commit_consumer_never_redelivers(cluster3: LocalBrokerCluster) -> None:
    topic = "manual"
    with Producer(cluster3.brokers) as p:
        p.send(topic, [f"m{i:02}" for i in range(30)])
    seen: list[str] = []
    with Consumer(cluster3.brokers, "manual-g", topic, auto_commit=False) as c:
        for _ in range(20):  # bounded; polls without committing move on all the same
            batch = c.poll(7, wait_ms=100)
            seen += [m.text for m in batch]
            if len(seen) >= 20:
                break
        assert len(seen) == len(set(seen)) >= 20
        assert c.commit()  # commits the positions
        assert c.commit() == {}  # nothing new
        assert sum(c.committed.values()) == len(seen)
        c.poll(5, wait_ms=0)  # delivered, never committed: the next member sees it again
    with Consumer(cluster3.brokers, "manual-g", topic) as c:
        rest = [m.text for m in c.messages(max_messages=30, max_idle_s=2, wait_ms=300)]
    assert sorted(seen + rest) == [f"m{i:02}" for i in range(30)]


def test_reading_without_a_group_from_earliest_and_latest(cluster3: LocalBrokerCluster) -> None:
    topic = "nogroup"
    with Producer(cluster3.brokers) as p:
        p.send(topic, ["old-1", "old-2"])
        with (
            Consumer(cluster3.brokers, None, topic, start="latest") as late,
            Consumer(cluster3.brokers, None, topic) as early,
        ):
            assert late.poll(10, wait_ms=0) == []  # positions taken now: at the end
            p.send(topic, ["new"])
            got_late = [m.text for m in late.messages(max_messages=1, max_idle_s=5, wait_ms=300)]
            got_early = [m.text for m in early.messages(max_messages=3, max_idle_s=5, wait_ms=300)]
            assert late.commit() == {}  # no group: nothing to commit
    assert got_late == ["new"]
    assert sorted(got_early) == ["new", "old-1", "old-2"]


def test_admin_queries_and_errors(cluster3: LocalBrokerCluster) -> None:
    topic = "admin-q"
    with Admin(cluster3.brokers) as admin, Producer(cluster3.brokers) as p:
        admin.create_topic(topic, 2)
        before = int(time.time() * 1000) - 1
        r = p.send(topic, [Message("findme", key="order-7", queue_id=1)])[0]
        m = admin.get_message(r.msg_id)
        assert (m.text, m.queue_id, m.queue_offset) == ("findme", 1, r.queue_offset)
        assert [x.msg_id for x in admin.query_by_key(topic, "order-7")] == [r.msg_id]
        assert admin.offset_for_timestamp(topic, 1, before) <= r.queue_offset
        assert admin.offset_for_timestamp(topic, 1, before + 10**9) == r.queue_offset + 1
        pulled = admin.pull(topic, 1, r.queue_offset)
        assert pulled.status == "FOUND" and pulled.messages[0].msg_id == r.msg_id
        assert admin.pull(topic, 1, 10_000).status == "OFFSET_ILLEGAL"
        assert mq.TopicInfo(topic, 2) in admin.list_topics()
        assert admin.commit_offsets("admin-g", topic, {1: r.queue_offset + 1}) == {
            1: r.queue_offset + 1
        }
        assert admin.commit_offsets("admin-g", topic, {1: 0}) == {1: r.queue_offset + 1}
        assert admin.reset_offsets("admin-g", topic, "earliest") == {0: 0, 1: 0}
        lag = {o.queue_id: o.lag for o in admin.group_offsets("admin-g", topic)}
        assert lag[1] == r.queue_offset + 1
        with pytest.raises(mq.TopicConflictError):
            admin.create_topic(topic, 3)
        with pytest.raises(mq.InvalidArgumentError):
            admin.create_topic("bad name!")
        with pytest.raises(mq.MessageNotFoundError):
            admin.get_message("67300000000000FFFFFF")
        with pytest.raises(mq.GroupNotFoundError):
            admin.group_offsets("no-such-group")
        admin.delete_topic(topic)
        with pytest.raises(mq.TopicNotFoundError):
            admin.describe_topic(topic)


# ---- failover -------------------------------------------------------------------------------


def test_master_killed_mid_stream_nothing_lost_or_duplicated(
    fresh_cluster3: LocalBrokerCluster,
) -> None:
    cl = fresh_cluster3
    first = cl.wait_ready(timeout_s=30)
    topic, group, per_batch, max_batches = "failover", "fo-g", 10, 400
    with Admin(cl.brokers) as admin:
        admin.create_topic(topic, 4)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        """Sends without pause until told to stop: the kill lands mid-stream."""
        try:
            with Producer(cl.brokers, deadline_s=45) as p:
                for b in range(max_batches):
                    if stop.is_set():
                        return
                    bodies = [f"b{b:03}-{i}" for i in range(per_batch)]
                    p.send(topic, bodies)
                    acked.extend(bodies)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    try:
        # A consumer takes (and commits, on close) part of the stream before the kill.
        with Consumer(cl.brokers, group, topic) as c:
            consumed_before = [
                m.text for m in c.messages(max_messages=60, max_idle_s=10, wait_ms=300)
            ]
        acked_at_kill = len(acked)
        cl.kill(first)  # SIGKILL
        wait_until(lambda: len(acked) >= acked_at_kill + 10 * per_batch or errors, 45)
    finally:
        stop.set()
        producer.join(timeout=60)
    assert not producer.is_alive(), "the producer did not stop"
    assert not errors, f"the producer failed: {errors[0]!r}"
    assert 60 <= acked_at_kill < len(acked) < max_batches * per_batch
    second = cl.wait_ready(nodes=[n for n in cl.ids if n != first], timeout_s=30)
    assert second != first

    # Every queue read in full on the new master: each acknowledged message exactly once,
    # nothing unexpected, queue offsets contiguous.
    with Admin(cl.urls[second]) as admin:
        queues = read_all(admin, topic)
    stored = [m.text for q in queues.values() for m in q]
    for q, msgs in queues.items():
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"queue {q} has gaps"
    counts = Counter(stored)
    assert not [b for b, n in counts.items() if n > 1], "duplicated"
    assert not set(acked) - set(counts), "lost"
    assert not set(counts) - set(acked), "unexpected"

    # The group resumes exactly where it committed before the failover.
    assert len(consumed_before) == 60
    with Consumer(cl.brokers, group, topic) as c:
        consumed_after = [
            m.text for m in c.messages(max_messages=len(acked) - 60, max_idle_s=5, wait_ms=500)
        ]
    assert not set(consumed_before) & set(consumed_after)
    assert sorted(consumed_before + consumed_after) == sorted(acked)


def test_a_paused_master_costs_about_an_election_not_the_request_timeout(
    fresh_cluster3: LocalBrokerCluster,
) -> None:
    """SIGSTOP the master process: a send waits ``produce_answer_timeout_s`` (1 s) for
    it, finds the new master and is acknowledged there, once, well before the 10 s
    request timeout it took before issue 16."""
    cl = fresh_cluster3
    master = cl.wait_ready(timeout_s=30)
    settings = mq.ClientSettings(timeout_s=10.0, deadline_s=30.0, produce_answer_timeout_s=1.0)
    with Producer(cl.brokers, settings=settings) as p:
        p.send("paused", ["before"])
        assert p.master == cl.urls[master]
        cl.procs[master].send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            p.send("paused", ["during"])
            elapsed_s = time.monotonic() - t0
            assert p.master != cl.urls[master]
        finally:
            cl.procs[master].send_signal(signal.SIGCONT)
    assert elapsed_s < settings.timeout_s / 2, f"the send took {elapsed_s:.1f} s"
    with Admin(cl.brokers) as admin:
        wait_until(lambda: cl.wait_ready(timeout_s=30) and True, what="the cluster is whole")
        stored = [m.text for q in read_all(admin, "paused").values() for m in q]
    assert sorted(stored) == ["before", "during"]
