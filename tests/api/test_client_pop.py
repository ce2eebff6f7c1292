"""``PopConsumer`` and ``AsyncPopConsumer`` against a real node (docs/client.md): the async
consumer over the in-process node's ASGI app, the blocking one over a node served by
uvicorn (``serving``). Two consumers of a group share a topic; ``run`` acks what its
handler returned, nacks what it raised (the message comes back with the next attempt),
extends the invisible time of a handler that runs longer than it, and stops cleanly:
no receive after ``stop()``, the running handlers waited for and settled, within
``stop_timeout_s``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from broker.pop import applier
from ledgermq import client as mq
from ledgermq.client import (
    Admin,
    AsyncAdmin,
    AsyncPopConsumer,
    AsyncProducer,
    PopConsumer,
    PopMessage,
    Producer,
    RunStats,
)
from tests.api.conftest import Node, Served, node_settings, serving
from tests.api.test_client import FakeClock, drive, error, exchange, reply
from tests.waiting import until, wait_until

NO_DELAY = {"policy": "list", "delays_ms": [0]}  # a message not acked comes back at once
M = "http://m:1"


def _wire(body: str, handle: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "topic": "t",
        "queue_id": 0,
        "queue_offset": 7,
        "msg_id": "id",
        "body": body,
        "receipt_handle": handle,
        "delivery_attempt": attempt,
        "invisible_until": 5,
    }


def _body(r: mq.Request) -> Any:
    return orjson.loads(r.content or b"null")


# ---- the sans-I/O operations, driven by hand -----------------------------------------------


def test_the_dead_letter_names_are_the_brokers() -> None:
    assert mq.dlq_topic("g") == applier.dlq_topic("g")
    assert mq.DLQ_PROPERTIES == (
        applier.PROP_DLQ_ORIGIN_TOPIC,
        applier.PROP_DLQ_ORIGIN_QUEUE_ID,
        applier.PROP_DLQ_ORIGIN_QUEUE_OFFSET,
        applier.PROP_DLQ_ORIGIN_MSG_ID,
        applier.PROP_DELIVERY_ATTEMPTS,
        applier.PROP_POP_EPOCH,
    )


def test_a_receive_is_retried_under_one_attempt_id() -> None:
    clock = FakeClock()
    ex = exchange(M, clock)
    ex.master = M
    answers = iter(
        [
            error(503, "UNKNOWN_OUTCOME"),
            reply(200, {"node_id": "m", "broker_role": "MASTER"}),  # rediscovery
            reply(200, {"messages": [_wire("x", "v1:0:7:3")]}),
        ]
    )
    ops = mq.PopOps(ex, "g", "t")
    got, actions = drive(ops.receive(5, 1000, 200, tags="A||B"), lambda _r: next(answers), clock)
    assert got == [
        mq.PopMessage(
            topic="t",
            queue_id=0,
            queue_offset=7,
            msg_id="id",
            body=b"x",
            receipt_handle="v1:0:7:3",
            delivery_attempt=1,
            invisible_until=5,
        )
    ]
    posts = [_body(a) for a in actions if isinstance(a, mq.Request) and a.method == "POST"]
    assert len(posts) == 2 and posts[0] == posts[1]
    assert posts[0]["attempt_id"] and posts[0]["tags"] == "A||B"


def test_acks_go_in_requests_of_at_most_max_receipt_handles() -> None:
    clock = FakeClock()
    ex = exchange(M, clock, max_receipt_handles=2)
    ex.master = M

    def answer(r: mq.Request) -> mq.Outcome:
        handles = _body(r)["receipt_handles"]
        return reply(200, {"results": [{"receipt_handle": h, "status": "OK"} for h in handles]})

    results, actions = drive(mq.PopOps(ex, "g", "t").ack(["a", "b", "c"]), answer, clock)
    assert [r.receipt_handle for r in results] == ["a", "b", "c"] and all(r.ok for r in results)
    assert [len(_body(a)["receipt_handles"]) for a in actions] == [2, 1]


def test_run_renews_at_half_the_invisible_time_and_acks_when_the_handler_returns() -> None:
    """One message whose handler takes 1.7 s, invisible 1 s: renewed at 0.5, 1.0 and
    1.5 s (timed from before the request that set it: early, never late); the receives
    meanwhile long-poll no longer than until the next renewal; acked, then the run
    stops."""
    clock = FakeClock()
    ex = exchange(M, clock)
    ex.master = M
    start = clock.now
    renewed_at: list[float] = []
    receive_waits: list[int] = []
    spawned: list[mq.Spawn] = []
    acked: list[str] = []

    def perform(action: mq.RunAction) -> mq.RunOutcome | None:
        if isinstance(action, mq.Spawn):
            spawned.append(action)
            return None
        if isinstance(action, mq.Collect):
            if clock.now + action.timeout_s >= start + 1.7 and spawned:
                clock.now = max(clock.now, start + 1.7)
                return [mq.Ended(spawned.pop().token, None)]
            clock.now += action.timeout_s
            return []
        assert isinstance(action, mq.Request)
        path, body = action.url.removeprefix(M), _body(action)
        if path.endswith("/receive"):
            receive_waits.append(body["wait_ms"])
            if len(receive_waits) == 1:
                return reply(200, {"messages": [_wire("slow", "h0")]})
            clock.now += body["wait_ms"] / 1000  # nothing new: the long poll runs out
            return reply(200, {"messages": []})
        if path.endswith("/invisible"):
            renewed_at.append(round(clock.now - start, 3))
            return reply(200, {"receipt_handle": f"h{len(renewed_at)}"})
        assert path.endswith("/ack")
        acked.extend(body["receipt_handles"])
        return reply(200, {"results": [{"receipt_handle": "h3", "status": "OK"}]})

    s = mq.RunSettings(invisible_ms=1000, wait_ms=800)
    stats = mq.RunStats()
    gen = mq.PopOps(ex, "g", "t").run(s, stats, lambda: bool(acked))
    outcome: Any = None
    for _ in range(100):
        try:
            action = gen.send(outcome)
        except StopIteration:
            break
        outcome = perform(action)
    assert renewed_at == [0.5, 1.0, 1.5]
    assert receive_waits == [800, 500, 500, 500, 500]
    assert acked == ["h3"]
    assert (stats.received, stats.extended, stats.acked, stats.abandoned) == (1, 3, 1, 0)


def _asgi(node: Node) -> dict[str, Any]:
    return {"transport": httpx.ASGITransport(app=node.app)}


async def _setup(node: Node, topic: str, bodies: list[str], queues: int = 4) -> None:
    async with AsyncAdmin("http://node", **_asgi(node)) as admin:
        await admin.create_topic(topic, queues)
        d = await admin.configure_group("g", start="earliest", retry=NO_DELAY)
        assert (d.mode, d.start, d.max_delivery_attempts) == ("pop", "earliest", 17)
    if bodies:
        async with AsyncProducer("http://node", **_asgi(node)) as p:
            await p.send(topic, bodies)


def _pop(node: Node, topic: str = "t") -> AsyncPopConsumer:
    return AsyncPopConsumer("http://node", "g", topic, **_asgi(node))


@pytest.mark.asyncio
async def test_two_consumers_share_a_topic_each_message_to_one(node: Node) -> None:
    await _setup(node, "t", [f"m{i}" for i in range(40)])
    async with _pop(node) as a, _pop(node) as b:
        got_a, got_b = await asyncio.gather(a.receive(25), b.receive(25))
        assert {m.delivery_attempt for m in got_a + got_b} == {1}
        assert sorted(m.text for m in got_a + got_b) == sorted(f"m{i}" for i in range(40))
        assert await a.receive(wait_ms=50) == []  # all in flight
        assert all(r.ok for r in await a.ack(got_a))
        assert all(r.ok for r in await b.ack([m.receipt_handle for m in got_b]))
        [stale] = await b.ack(got_a[:1])
        assert (stale.receipt_handle, stale.ok) == (got_a[0].receipt_handle, False)
    async with AsyncAdmin("http://node", **_asgi(node)) as admin:
        d = await admin.describe_group("g")
        assert [(t.topic, t.in_flight, t.dead_lettered) for t in d.topics] == [("t", 0, 0)]
        offsets = await admin.group_offsets("g", "t")
        assert sum(o.next_offset or 0 for o in offsets) == 40
        assert {(o.in_flight, o.lag) for o in offsets} == {(0, 0)}


@pytest.mark.asyncio
async def test_run_acks_on_return_and_nacks_on_an_exception(node: Node) -> None:
    await _setup(node, "t", [f"m{i}" for i in range(10)])
    seen: list[tuple[str, int]] = []

    async def handler(m: PopMessage) -> None:
        seen.append((m.text, m.delivery_attempt))
        if m.text == "m3" and m.delivery_attempt == 1:
            raise RuntimeError("the first attempt fails")

    async with _pop(node) as c:
        run = asyncio.create_task(c.run(handler, concurrency=3, wait_ms=200))
        await until(lambda: c.stats.acked == 10, what="ten acks")
        c.stop()
        stats = await asyncio.wait_for(run, 10)
    assert (stats.received, stats.acked, stats.nacked, stats.stale) == (11, 10, 1, 0)
    assert sorted(a for t, a in seen if t == "m3") == [1, 2]
    assert sorted(t for t, _ in seen) == sorted([f"m{i}" for i in range(10)] + ["m3"])
    assert node.broker.meta.pop.in_flight("g", "t") == 0


@pytest.mark.asyncio
async def test_a_run_ends_by_itself_when_idle_not_while_its_handlers_are_busy(node: Node) -> None:
    await _setup(node, "t", ["a", "b", "c"])
    waited = asyncio.Event()

    async def handler(m: PopMessage) -> None:
        if m.text == "a":  # busy longer than max_idle_s: the run goes on meanwhile
            await until(lambda: c.stats.extended >= 1, what="one extension")
        waited.set()

    async with _pop(node) as c:
        stats = await asyncio.wait_for(
            c.run(handler, concurrency=1, max_idle_s=0.2, wait_ms=50, invisible_ms=500), 10
        )
    assert waited.is_set()
    assert (stats.received, stats.acked, stats.abandoned) == (3, 3, 0)


@pytest.mark.asyncio
async def test_run_extends_a_handler_that_outlasts_the_invisible_time(node: Node) -> None:
    """A handler runs three half-lives of its invisible time past the end of the first;
    a second consumer long-polls all the while and gets nothing (the group redelivers at
    once what is not extended: its retry delay is 0)."""
    await _setup(node, "t", ["slow"], queues=1)
    release = asyncio.Event()
    attempts: list[int] = []

    async def handler(m: PopMessage) -> None:
        attempts.append(m.delivery_attempt)
        await release.wait()

    async with _pop(node) as a, _pop(node) as b:
        run = asyncio.create_task(a.run(handler, invisible_ms=300, wait_ms=200))
        others: list[PopMessage] = []

        async def poll_other() -> None:
            while not release.is_set():
                others.extend(await b.receive(wait_ms=100, invisible_ms=100))

        other = asyncio.create_task(poll_other())
        await until(lambda: a.stats.extended >= 4 or a.stats.stale or others, what="4 extends")
        assert (others, a.stats.stale) == ([], 0)
        release.set()
        await until(lambda: a.stats.acked == 1, what="the ack")
        await asyncio.wait_for(other, 10)
        a.stop()
        stats = await asyncio.wait_for(run, 10)
    assert others == [] and attempts == [1]
    assert (stats.received, stats.acked, stats.stale) == (1, 1, 0)


@pytest.mark.asyncio
async def test_stop_waits_for_running_handlers_and_settles_them(node: Node) -> None:
    await _setup(node, "t", [f"m{i}" for i in range(8)])
    release = asyncio.Event()
    running: list[str] = []
    finished: list[str] = []

    async def handler(m: PopMessage) -> None:
        running.append(m.text)
        await release.wait()
        finished.append(m.text)

    async with _pop(node) as c:
        run = asyncio.create_task(c.run(handler, concurrency=4, wait_ms=200))
        await until(lambda: len(running) == 4, what="four handlers running")
        c.stop()
        release.set()  # after stop(): the run ends only once they did
        stats = await asyncio.wait_for(run, 10)
        assert (stats.received, stats.acked, stats.abandoned) == (4, 4, 0)
        assert sorted(finished) == sorted(running)
        rest = await c.receive(10)  # the others were never received
        assert sorted(m.text for m in rest) == sorted({f"m{i}" for i in range(8)} - set(running))


@pytest.mark.asyncio
async def test_stop_is_bounded_by_stop_timeout(node: Node) -> None:
    await _setup(node, "t", ["stuck"], queues=1)
    cancelled = asyncio.Event()

    async def handler(m: PopMessage) -> None:
        try:
            await asyncio.Event().wait()  # never returns
        finally:
            cancelled.set()

    async with _pop(node) as c:
        run = asyncio.create_task(c.run(handler, stop_timeout_s=0.1, wait_ms=200))
        await until(lambda: c.stats.received == 1, what="the message received")
        c.stop()
        stats = await asyncio.wait_for(run, 10)
    assert (stats.acked, stats.nacked, stats.abandoned) == (0, 0, 1)
    assert cancelled.is_set()
    assert node.broker.meta.pop.in_flight("g", "t") == 1  # back after its invisible time


# ---- blocking, over a served node ----------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving(node_settings(tmp_path / "n0")) as node:
        yield node


def test_the_blocking_consumer_runs_handlers_in_threads(served: Served) -> None:
    with Admin(served.url) as admin:
        admin.create_topic("t", 2)
        admin.configure_group("g", start="earliest", retry=NO_DELAY)
    with Producer(served.url) as p:
        p.send("t", [f"m{i}" for i in range(20)])
    threads: set[str] = set()
    lock = threading.Lock()

    def handler(m: PopMessage) -> None:
        with lock:
            threads.add(threading.current_thread().name)
        if m.text == "m7" and m.delivery_attempt == 1:
            raise ValueError("fails once")

    with PopConsumer(served.url, "g", "t") as c:
        result: list[RunStats] = []
        runner = threading.Thread(
            target=lambda: result.append(c.run(handler, concurrency=4, wait_ms=200))
        )
        runner.start()
        wait_until(lambda: c.stats.acked == 20, what="twenty acks")
        c.stop()
        runner.join(10)
        assert not runner.is_alive()
    [stats] = result
    assert (stats.received, stats.acked, stats.nacked) == (21, 20, 1)
    assert threads and all(t.startswith("ledgermq-pop") for t in threads)


def test_blocking_receive_nack_and_extend(served: Served) -> None:
    with Admin(served.url) as admin:
        admin.create_topic("t", 1)
        admin.configure_group("g", start="earliest", retry=NO_DELAY)
    with Producer(served.url) as p:
        p.send("t", ["a", "b"])
    with PopConsumer(served.url, "g", "t") as c:
        a, b = c.receive(2)
        [r] = c.nack([a], delay_ms=0)
        assert r.ok
        [again] = c.receive(wait_ms=1000)
        assert (again.text, again.delivery_attempt) == ("a", 2)
        handle = c.extend(b, 60_000)
        assert handle != b.receipt_handle
        assert [r.ok for r in c.ack([handle, again, b])] == [True, True, False]
