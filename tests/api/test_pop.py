"""POP groups over HTTP on one in-process node (docs/consuming.md): a group shares a
topic's messages between its consumers, redelivers what was not acknowledged with the
next attempt, dead-letters what used up its attempts, and refuses stale handles."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.pop.applier import dlq_topic
from broker.pop.service import Received
from broker.reads import PulledMessage
from tests.api.conftest import TEST_LIMITS, Node, node_settings, running_node
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _produce(node: Node, topic: str, bodies: list[str], **extra: Any) -> None:
    r = await node.http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"body": b, **extra} for b in bodies]},
    )
    assert r.status_code == 200, r.text


async def _receive(node: Node, group: str, topic: str, **kw: Any) -> list[dict[str, Any]]:
    r = await node.http.post(f"/v1/groups/{group}/receive", json={"topic": topic, **kw})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = orjson.loads(r.content)["messages"]
    return messages


async def _ack(node: Node, group: str, topic: str, handles: list[str]) -> list[str]:
    r = await node.http.post(
        f"/v1/groups/{group}/ack", json={"topic": topic, "receipt_handles": handles}
    )
    assert r.status_code == 200, r.text
    return [x["status"] for x in orjson.loads(r.content)["results"]]


async def test_two_consumers_of_a_group_share_the_messages_and_acks_end_them(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "jobs", "queues": 4})
    r = await node.http.put("/v1/groups/workers", json={"start": "earliest"})
    assert r.status_code == 200, r.text
    assert orjson.loads(r.content)["max_delivery_attempts"] == 17
    await _produce(node, "jobs", [f"j{i}" for i in range(40)])
    a, b = await asyncio.gather(
        _receive(node, "workers", "jobs", max_messages=25),
        _receive(node, "workers", "jobs", max_messages=25),
    )
    bodies = [m["body"] for m in a + b]
    assert sorted(bodies) == sorted(f"j{i}" for i in range(40)), "each message to one of them"
    assert {m["delivery_attempt"] for m in a + b} == {1}
    assert await _receive(node, "workers", "jobs") == []  # all in flight
    statuses = await _ack(node, "workers", "jobs", [m["receipt_handle"] for m in a + b])
    assert statuses == ["OK"] * 40
    assert await _ack(node, "workers", "jobs", [a[0]["receipt_handle"]]) == [
        "INVALID_RECEIPT_HANDLE"
    ]
    r = await node.http.get("/v1/groups/workers")
    assert orjson.loads(r.content)["topics"] == [
        {
            "topic": "jobs",
            "in_flight": 0,
            "delivered": 40,
            "redelivered": 0,
            "acked": 40,
            "nacked": 0,
            "expired": 0,
            "dead_lettered": 0,
        }
    ]


async def test_an_unacked_message_comes_back_with_the_next_attempt_then_goes_to_the_dlq(
    node: Node,
) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    r = await node.http.put(
        "/v1/groups/g",
        json={
            "start": "earliest",
            "max_delivery_attempts": 2,
            "retry": {"policy": "list", "delays_ms": [0]},
        },
    )
    assert r.status_code == 200, r.text
    await _produce(node, "t", ["once"])
    [first] = await _receive(node, "g", "t", invisible_ms=200)
    assert first["delivery_attempt"] == 1
    [second] = await _receive(node, "g", "t", invisible_ms=200, wait_ms=3000)
    assert (second["delivery_attempt"], second["body"]) == (2, "once")
    assert second["receipt_handle"] != first["receipt_handle"]
    assert await _ack(node, "g", "t", [first["receipt_handle"]]) == ["INVALID_RECEIPT_HANDLE"]
    # The attempts are spent: the next receive dead-letters it instead of handing it out.
    assert await _receive(node, "g", "t", wait_ms=1000) == []
    dlq = dlq_topic("g")
    await until(lambda: node.broker.meta.pop.counts("g", "t")["dead_lettered"] == 1, what="dead")
    r = await node.http.get(f"/v1/topics/{dlq}/queues/0/messages", params={"offset": 0})
    [dead] = orjson.loads(r.content)["messages"]
    assert dead["body"] == "once"
    assert dead["properties"]["DLQ_ORIGIN_TOPIC"] == "t"
    assert dead["properties"]["DLQ_ORIGIN_MSG_ID"] == first["msg_id"]
    assert dead["properties"]["DELIVERY_ATTEMPTS"] == "2"
    counts = node.broker.meta.pop.counts("g", "t")
    assert (counts["delivered"], counts["redelivered"], counts["expired"]) == (2, 1, 2)


async def test_a_nack_and_a_changed_invisible_time(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "t", ["a", "b"])
    got = await _receive(node, "g", "t", invisible_ms=60_000)
    assert [m["body"] for m in got] == ["a", "b"]
    r = await node.http.post(
        "/v1/groups/g/nack",
        json={"topic": "t", "receipt_handles": [got[0]["receipt_handle"]], "delay_ms": 0},
    )
    assert orjson.loads(r.content)["results"][0]["status"] == "OK"
    [again] = await _receive(node, "g", "t")
    assert (again["body"], again["delivery_attempt"]) == ("a", 2)
    r = await node.http.post(
        "/v1/groups/g/invisible",
        json={"topic": "t", "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 5},
    )
    assert r.status_code == 200, r.text
    changed = orjson.loads(r.content)
    assert changed["receipt_handle"] != got[1]["receipt_handle"]
    r = await node.http.post(
        "/v1/groups/g/invisible",
        json={"topic": "t", "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 5},
    )
    assert (r.status_code, r.json()["error"]["code"]) == (409, "INVALID_RECEIPT_HANDLE")
    assert await _ack(node, "g", "t", [changed["receipt_handle"], again["receipt_handle"]]) == [
        "OK",
        "OK",
    ]


async def test_bad_input_changes_nothing(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    before = node.log_state()
    for body in (
        {"topic": "t", "receipt_handles": ["nope", "v1:0:0:99999", "v1:x:1:2"]},
        {"topic": "t", "receipt_handles": ["v1:0:0:1"] * 3},
    ):
        statuses = await _ack(node, "g", "t", body["receipt_handles"])
        assert set(statuses) == {"INVALID_RECEIPT_HANDLE"}
    for path, body in (
        ("receive", {"topic": "t", "invisible_ms": -1}),
        ("receive", {"topic": "t", "max_messages": 0}),
        ("ack", {"topic": "t", "receipt_handles": []}),
        ("nack", {"topic": "t", "receipt_handles": ["v1:0:0:1"], "delay_ms": -5}),
    ):
        r = await node.http.post(f"/v1/groups/g/{path}", json=body)
        assert r.status_code == 422, (path, r.text)
    r = await node.http.put("/v1/groups/g", json={"mode": "offsets"})
    assert r.status_code == 422
    r = await node.http.put("/v1/groups/g", json={"retry": {"policy": "list", "delays_ms": []}})
    assert r.status_code == 422
    assert node.log_state() == before
    # An offsets group stays one: it cannot become a POP group.
    await _produce(node, "t", ["x"])
    r = await node.http.put("/v1/groups/old/offsets", json={"topic": "t", "offsets": {"0": 1}})
    assert r.status_code == 200, r.text
    r = await node.http.put("/v1/groups/old", json={})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "GROUP_MODE_CONFLICT")


# ---- races and retention on the master's side (found by the broker simulation) -----------


async def _group_with_flights(
    node: Node, n: int, *, fifo: bool = False, attempts: int = 5
) -> list[Received[PulledMessage]]:
    """Topic ``t`` (one queue), group ``g`` (retry at once), ``n`` messages in flight for
    100 ms, received through ``PopGroups`` itself."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    r = await node.http.put(
        "/v1/groups/g",
        json={
            "start": "earliest",
            "fifo": fifo,
            "max_delivery_attempts": attempts,
            "retry": {"policy": "list", "delays_ms": [0]},
        },
    )
    assert r.status_code == 200, r.text
    await _produce(node, "t", [f"m{i}" for i in range(n)])
    pop = node.broker.pop
    got = await pop.receive(node.broker.reads.pulled_message, "g", "t", invisible_ms=100)
    assert [m.message.queue_offset for m in got] == list(range(n))
    await asyncio.sleep(0.15)  # due again
    return got


async def test_an_ack_that_lands_while_a_receive_reads_due_messages(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive reads the due messages one by one (each read lets the loop run); an ack
    applied meanwhile ends one it had not reached yet: it is left out, no KeyError."""
    first = await _group_with_flights(node, 3)
    pop = node.broker.pop
    real_one, acked = pop._one, []

    async def one(*args: Any) -> Any:
        if not acked:  # the first read: an ack of the last one lands meanwhile
            acked.append(await pop.ack("g", "t", [first[2].receipt_handle]))
        return await real_one(*args)

    monkeypatch.setattr(pop, "_one", one)
    got = await pop.receive(node.broker.reads.pulled_message, "g", "t", invisible_ms=100)
    assert acked == [[True]]
    assert [(m.message.queue_offset, m.delivery_attempt) for m in got] == [(0, 2), (1, 2)]


async def test_an_ack_appended_before_a_dead_letter_ends_the_message_without_a_copy(
    node: Node,
) -> None:
    """The ack of a due message whose attempts are spent is in the log, not applied yet,
    when a receive looks: the receive must not copy it into the dead letters (the copy
    would stay there, of a message acknowledged as done)."""
    [m] = await _group_with_flights(node, 1, attempts=1)
    pop = node.broker.pop
    ack = asyncio.ensure_future(pop.ack("g", "t", [m.receipt_handle]))
    await asyncio.sleep(0)  # the ack's entry is appended, not yet applied
    qs = node.broker.meta.pop.queue("g", "t", 0)
    assert qs is not None and 0 in qs.flights
    assert await pop.receive(node.broker.reads.pulled_message, "g", "t") == []
    assert await ack == [True]
    await until(lambda: not qs.flights, what="the ack applied")
    assert node.broker.meta.pop.counts("g", "t")["dead_lettered"] == 0
    dlq = dlq_topic("g")
    if dlq in node.broker.meta.topics:
        assert node.broker.reads.queue_bounds(dlq, 0) == (0, 0), "a dead letter of an acked one"


async def test_a_dead_letter_waits_for_an_ack_the_master_wrote_and_has_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master's own ack of a due message whose attempts are spent is in its log, not
    applied (its dispatcher lags), and its request gave up waiting (503): a receive then
    must not copy the message into the dead letters, as the state it reads still shows
    the flight. The dead letter waits for the master's writes to apply first (the guard
    the broker simulation found; its planted seed no longer catches it)."""
    async with running_node(node_settings(tmp_path / "n0", append_timeout_ms=300)) as node:
        [m] = await _group_with_flights(node, 1, attempts=1)
        b, pop = node.broker, node.broker.pop

        async def idle(force: bool = False) -> None:
            await asyncio.sleep(0.01)

        with monkeypatch.context() as mp:  # a dispatcher behind (its loop idles meanwhile)
            mp.setattr(b.dispatcher, "dispatch_some", lambda _max: 0)
            mp.setattr(b.dispatcher, "housekeep", idle)
            r = await node.http.post(
                "/v1/groups/g/ack", json={"topic": "t", "receipt_handles": [m.receipt_handle]}
            )
            assert r.status_code == 503, r.text  # appended, not applied in time
            qs = b.meta.pop.queue("g", "t", 0)
            assert qs is not None and 0 in qs.flights, "the ack is not applied yet"
            assert await pop.receive(b.reads.pulled_message, "g", "t") == []
        await until(lambda: not qs.flights, what="the ack applied")
        assert b.meta.pop.counts("g", "t")["dead_lettered"] == 0
        dlq = dlq_topic("g")
        if dlq in b.meta.topics:
            assert b.reads.queue_bounds(dlq, 0) == (0, 0), "a dead letter of an acked one"


@pytest.mark.parametrize("fifo", [False, True])
async def test_a_message_retention_deleted_in_flight_ends_and_frees_its_queue(
    node: Node, fifo: bool
) -> None:
    """Retention deletes the log head under a message in flight. Due again, it can be
    neither handed out nor copied to the dead letters: it is done for the group (as one
    never handed out before retention took it). Before: with its attempts spent every
    receive spun on it forever; in a FIFO group it held its queue for good."""
    [m] = await _group_with_flights(node, 1, fifo=fifo, attempts=1 if not fifo else 2)
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "filler", "queues": 1})
    for i in range(12):
        await _produce(node, "filler", [f"{i}-{k}-" + "x" * 60_000 for k in range(4)])
    await b.dispatcher.snapshot()
    await b.dispatcher.checkpoint()
    assert await asyncio.to_thread(b.store.clean, True) >= 1
    await until(lambda: b.reads.queue_bounds("t", 0) == (1, 1), what="message 0 deleted")
    receive = b.pop.receive(b.reads.pulled_message, "g", "t")
    assert await asyncio.wait_for(receive, timeout=5) == []
    await _produce(node, "t", ["late"])
    got = await asyncio.wait_for(b.pop.receive(b.reads.pulled_message, "g", "t"), timeout=5)
    assert [r.message.body for r in got] == [b"late"]
    qs = b.meta.pop.queue("g", "t", 0)
    assert qs is not None and 0 not in qs.flights
    assert await _ack(node, "g", "t", [m.receipt_handle]) == ["INVALID_RECEIPT_HANDLE"]


async def test_a_receive_with_tags_gets_past_a_long_backlog_that_does_not_match(
    tmp_path: Path,
) -> None:
    """A receive's filtered scan stops after ``max_filter_scan_units``. What it passed
    over is done for the group: next moves past it (an entry with no message), so the
    next receive goes on from there. Before: nothing was appended, next stayed, and every
    receive scanned the same units again: the matching message was never handed out."""
    limits = replace(TEST_LIMITS, max_filter_scan_units=50)
    async with running_node(node_settings(tmp_path / "n0", limits=limits)) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        await node.http.put("/v1/groups/g", json={"start": "earliest"})
        for k in range(11):  # more than one chunk of a filtered scan (1024 units)
            await _produce(node, "t", [f"x{k}-{i}" for i in range(100)], tags="x")
        await _produce(node, "t", ["wanted"], tags="y")
        got: list[dict[str, Any]] = []
        for _ in range(5):
            got = await _receive(node, "g", "t", tags="y")
            if got:
                break
        assert [m["body"] for m in got] == ["wanted"]
        r = await node.http.get("/v1/groups/g/offsets")
        [q] = orjson.loads(r.content)["offsets"]
        assert (q["next_offset"], q["lag"]) == (1101, 1)


async def test_a_receive_whose_topic_was_deleted_before_it_applies_hands_out_nothing(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic's delete reaches the log between a receive's selection and its entry.
    The receive hands out nothing and leaves no state for the topic: its next incarnation
    starts afresh. Before: the receive handed out the deleted topic's message and made
    its queue's state, whose next then skipped the new topic's first messages."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "t", ["old"])
    b = node.broker
    real_append = b.pop.metalog.append

    async def deleted_first(op: dict[str, Any]) -> int:
        if op["op"] == "pop.receive":
            await b.topics.delete("t")
        return await real_append(op)

    monkeypatch.setattr(b.pop.metalog, "append", deleted_first)
    assert await b.pop.receive(b.reads.pulled_message, "g", "t") == []
    assert b.meta.pop.queue("g", "t", 0) is None
    monkeypatch.undo()
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await _produce(node, "t", ["new"])
    assert [m["body"] for m in await _receive(node, "g", "t")] == ["new"]


async def test_a_long_poll_on_a_held_fifo_queue_waits_instead_of_spinning(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO queue whose first message is in flight holds the rest: a long poll waits for
    new messages, the flight falling due, or an ack. Before: it took the messages held
    behind the flight for new ones and looked again at once, until its wait ran out."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest", "fifo": True})
    await _produce(node, "t", ["first", "second"])
    b = node.broker
    [m] = await b.pop.receive(b.reads.pulled_message, "g", "t", max_messages=1)
    real_select, selects = b.pop._select, []

    async def counted(*args: Any) -> Any:
        selects.append(1)
        return await real_select(*args)

    monkeypatch.setattr(b.pop, "_select", counted)
    assert await b.pop.receive(b.reads.pulled_message, "g", "t", wait_ms=300) == []
    assert len(selects) <= 3, f"{len(selects)} selections in one long poll"
    assert await _ack(node, "g", "t", [m.receipt_handle]) == ["OK"]


async def _dead_letters(node: Node, group: str) -> list[dict[str, Any]]:
    r = await node.http.get(f"/v1/topics/{dlq_topic(group)}/queues/0/messages?offset=0")
    assert r.status_code == 200, r.text
    letters: list[dict[str, Any]] = orjson.loads(r.content)["messages"]
    return letters


async def test_a_consumer_dead_letters_a_message_at_once_and_its_handle_dies(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 2})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "t", ["poison", "fine"])
    got = {m["body"]: m for m in await _receive(node, "g", "t", invisible_ms=60_000)}
    handle = got["poison"]["receipt_handle"]
    r = await node.http.post(
        "/v1/groups/g/dlq", json={"topic": "t", "receipt_handles": [handle, "v1:0:999:1", "junk"]}
    )
    assert r.status_code == 200, r.text
    statuses = [x["status"] for x in orjson.loads(r.content)["results"]]
    assert statuses == ["OK", "INVALID_RECEIPT_HANDLE", "INVALID_RECEIPT_HANDLE"]
    [dead] = await _dead_letters(node, "g")
    assert dead["body"] == "poison"
    assert dead["properties"]["DLQ_ORIGIN_QUEUE_OFFSET"] == str(got["poison"]["queue_offset"])
    assert dead["properties"]["DELIVERY_ATTEMPTS"] == "1"
    # The handle is dead: no ack, no second dead letter; the other message is untouched.
    assert await _ack(node, "g", "t", [handle]) == ["INVALID_RECEIPT_HANDLE"]
    r = await node.http.post("/v1/groups/g/dlq", json={"topic": "t", "receipt_handles": [handle]})
    assert orjson.loads(r.content)["results"][0]["status"] == "INVALID_RECEIPT_HANDLE"
    assert len(await _dead_letters(node, "g")) == 1
    assert await _ack(node, "g", "t", [got["fine"]["receipt_handle"]]) == ["OK"]
    counts = node.broker.meta.pop.counts("g", "t")
    assert (counts["dead_lettered"], counts["acked"], counts["expired"]) == (1, 1, 0)
    r = await node.http.get("/v1/groups/g/offsets", params={"topic": "t"})
    assert sum(q["lag"] for q in orjson.loads(r.content)["offsets"]) == 0


async def _dead_letter_all(node: Node, group: str, topic: str, n: int) -> list[dict[str, Any]]:
    got = await _receive(node, group, topic, max_messages=n, invisible_ms=60_000)
    assert len(got) == n
    r = await node.http.post(
        f"/v1/groups/{group}/dlq",
        json={"topic": topic, "receipt_handles": [m["receipt_handle"] for m in got]},
    )
    assert [x["status"] for x in orjson.loads(r.content)["results"]] == ["OK"] * n
    return got


async def _redrive(node: Node, group: str, **body: Any) -> dict[str, int]:
    r = await node.http.post(f"/v1/groups/{group}/dlq/redrive", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, int] = orjson.loads(r.content)
    return answer


async def test_redrive_produces_dead_letters_back_once(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "a", "queues": 1})
    await node.http.post("/v1/topics", json={"name": "b", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "a", ["a0", "a1"], properties={"trace": "x"})
    await _produce(node, "b", ["b0"])
    await _dead_letter_all(node, "g", "a", 2)
    await _dead_letter_all(node, "g", "b", 1)
    assert await _redrive(node, "g", max_messages=2) == {
        "redriven": 2,
        "skipped": 0,
        "next_offset": 2,
    }
    assert await _redrive(node, "g") == {"redriven": 1, "skipped": 0, "next_offset": 3}
    assert await _redrive(node, "g") == {"redriven": 0, "skipped": 0, "next_offset": 3}
    # Back in their topics as they were produced (no dead-letter properties), after the
    # originals; the group receives them again as new messages.
    again = await _receive(node, "g", "a", max_messages=10)
    assert [m["body"] for m in again] == ["a0", "a1"]
    assert [m["queue_offset"] for m in again] == [2, 3]
    assert all(m["properties"] == {"trace": "x"} for m in again)
    assert [m["body"] for m in await _receive(node, "g", "b")] == ["b0"]
    r = await node.http.get("/v1/groups/g")
    assert orjson.loads(r.content)["redrive_next_offset"] == 3


async def test_a_redrive_that_lost_its_position_produces_nothing_twice(node: Node) -> None:
    """A failover between the copies and the position's entry: the copies' producer
    session answers the repeat (the position is reset here by hand to stand for it)."""
    await node.http.post("/v1/topics", json={"name": "a", "queues": 1})
    await node.http.post("/v1/topics", json={"name": "b", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "a", ["a0"])
    await _produce(node, "b", ["b0"])
    await _produce(node, "a", ["a1"])
    for topic in ("a", "b", "a"):  # dead letters a0, b0, a1: three runs
        [m] = await _receive(node, "g", topic, max_messages=1, invisible_ms=60_000)
        r = await node.http.post(
            "/v1/groups/g/dlq", json={"topic": topic, "receipt_handles": [m["receipt_handle"]]}
        )
        assert orjson.loads(r.content)["results"][0]["status"] == "OK"
    assert (await _redrive(node, "g"))["redriven"] == 3
    node.broker.meta.pop.redriven["g"] = 0
    assert (await _redrive(node, "g"))["next_offset"] == 3
    for topic, n in (("a", 4), ("b", 2)):
        _, hi = node.broker.reads.queue_bounds(topic, 0)
        assert hi == n, f"{topic}: each dead letter produced back once"


async def test_redrive_and_dlq_refuse_bad_input(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    r = await node.http.post("/v1/groups/nobody/dlq/redrive", json={})
    assert r.status_code == 404, r.text
    r = await node.http.post("/v1/groups/g/dlq/redrive", json={"max_messages": 0})
    assert r.status_code == 422, r.text
    await node.http.put("/v1/groups/g", json={})
    assert await _redrive(node, "g") == {"redriven": 0, "skipped": 0, "next_offset": 0}
    r = await node.http.post("/v1/groups/g/dlq", json={"topic": "t", "receipt_handles": []})
    assert r.status_code == 422, r.text
    r = await node.http.post(
        "/v1/groups/g/dlq", json={"topic": "nope", "receipt_handles": ["v1:0:0:1"]}
    )
    assert r.status_code == 404, r.text


async def test_metrics_show_pop_groups(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 2})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "t", ["a", "b", "c"])
    got = await _receive(node, "g", "t", max_messages=2, invisible_ms=60_000)
    await _ack(node, "g", "t", [got[0]["receipt_handle"]])
    text = (await node.http.get("/metrics")).text
    assert 'ledgermq_pop_in_flight{group="g",topic="t"} 1.0' in text
    assert 'ledgermq_pop_lag{group="g",topic="t"} 2.0' in text
    assert 'ledgermq_pop_messages_total{event="delivered",group="g",topic="t"} 2.0' in text
    assert 'ledgermq_pop_messages_total{event="acked",group="g",topic="t"} 1.0' in text
