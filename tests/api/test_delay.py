"""Delay messages over HTTP on one in-process node (docs/producing.md, "Delay messages"):
invisible to every consumer before their time, delivered once after it with their queue
offset assigned then, cancelled by their recall handle, refused when malformed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from broker.gate import BrokerRole
from broker.metadata import TIMER_TOPIC
from ledgermq.client import AlreadyDeliveredError, AsyncProducer, Message
from tests.api.conftest import Node, node_settings, running_node
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _send(node: Node, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = await node.http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = orjson.loads(r.content)["results"]
    return results


async def _pull(node: Node, topic: str, queue_id: int = 0) -> list[dict[str, Any]]:
    r = await node.http.get(f"/v1/topics/{topic}/queues/{queue_id}/messages?offset=0")
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = orjson.loads(r.content)["messages"]
    return messages


def _now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_delay_message_is_invisible_before_its_time_then_delivered_once(
    node: Node,
) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await _send(node, "t", [{"body": "before"}])
    sent_at = _now_ms()
    [r] = await _send(
        node,
        "t",
        [{"body": "later", "delay_ms": 800, "key": "k1", "tags": "A", "properties": {"p": "1"}}],
    )
    assert r["queue_id"] is None and r["queue_offset"] is None
    assert r["recall_handle"].startswith("t1:")
    assert sent_at + 800 <= r["deliver_at_ms"] <= _now_ms() + 800
    await _send(node, "t", [{"body": "after"}])
    # Not visible: the later message took the next offset, the delayed one none yet.
    assert [m["body"] for m in await _pull(node, "t")] == ["before", "after"]
    await until(lambda: node.broker.meta.timers.stats["delivered"] == 1, timeout_s=10, what="due")
    got = await _pull(node, "t")
    assert [m["body"] for m in got] == ["before", "after", "later"]
    late = got[2]
    assert late["queue_offset"] == 2 and late["keys"] == ["k1"] and late["tags"] == "A"
    assert late["properties"]["p"] == "1"
    assert int(late["properties"]["TIMER_DELIVER_MS"]) == r["deliver_at_ms"]
    assert late["store_timestamp"] >= r["deliver_at_ms"], "never before its time"
    assert "REAL_TOPIC" not in late["properties"]
    # Delivered once: nothing else comes, and the timer is done.
    timers = node.broker.meta.timers
    assert (timers.pending, timers.floor, timers.end) == (0, 1, 1)
    r2 = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
    assert (
        r2.status_code == 409 and orjson.loads(r2.content)["error"]["code"] == "ALREADY_DELIVERED"
    )


async def test_a_recalled_message_is_never_delivered(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    at = _now_ms() + 500
    keep, drop = await _send(
        node, "t", [{"body": "keep", "deliver_at_ms": at}, {"body": "drop", "deliver_at_ms": at}]
    )
    r = await node.http.delete(f"/v1/delayed/{drop['recall_handle']}")
    assert r.status_code == 200, r.text
    again = await node.http.delete(f"/v1/delayed/{drop['recall_handle']}")
    assert again.status_code == 200, "a repeat answers the same"
    await until(lambda: node.broker.meta.timers.pending == 0, timeout_s=10, what="done")
    assert [m["body"] for m in await _pull(node, "t")] == ["keep"]
    assert node.broker.meta.timers.stats == {
        "scheduled": 2,
        "delivered": 1,
        "cancelled": 1,
        "dropped": 0,
    }
    assert keep["recall_handle"] != drop["recall_handle"]


async def test_timers_due_together_each_deliver_their_own_message(node: Node) -> None:
    """The release reads a run of consecutive timers' records with one read (a cancelled
    one splits the run): each copy still carries its own body, key, tags and origin."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    at = _now_ms() + 400
    sent = await _send(
        node,
        "t",
        [{"body": f"m{i}", "key": f"k{i}", "tags": f"T{i}", "deliver_at_ms": at} for i in range(7)],
    )
    r = await node.http.delete(f"/v1/delayed/{sent[3]['recall_handle']}")
    assert r.status_code == 200, r.text
    await until(lambda: node.broker.meta.timers.pending == 0, timeout_s=10, what="all due")
    got = await _pull(node, "t")
    assert [(m["body"], m["key"], m["tags"]) for m in got] == [
        (f"m{i}", f"k{i}", f"T{i}") for i in (0, 1, 2, 4, 5, 6)
    ]
    handles = [sent[i]["recall_handle"] for i in (0, 1, 2, 4, 5, 6)]
    assert [f"t1:{m['properties']['TIMER_ORIGIN']}" for m in got] == handles
    # A run whose consume-queue units do not match is read record by record (None: none).
    assert node.broker.timers._records([(0, 1)]) == [(0, None)]


async def test_a_time_in_the_past_is_now_and_pinned_queues_hold(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 4})
    [r] = await _send(node, "t", [{"body": "now", "deliver_at_ms": 1, "queue_id": 3}])
    assert r["recall_handle"]
    await until(lambda: node.broker.meta.timers.stats["delivered"] == 1, timeout_s=10, what="due")
    [m] = await _pull(node, "t", 3)
    assert m["body"] == "now"


async def test_a_retried_delay_produce_answers_the_time_its_first_attempt_stored(
    node: Node,
) -> None:
    """A retry under the producer session is answered from its first attempt (nothing
    stored twice), and so is the time: it said the retry's ``now + delay_ms`` (or its
    now, for a time past), later than the one stored, and the message came before the
    time its producer was told (found by the chaos checker's rule, tests/chaos)."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    body = {
        "messages": [{"body": "rel", "delay_ms": 500}, {"body": "past", "deliver_at_ms": 1}],
        "producer_id": "p",
        "sequence": 0,
    }
    first = await _send_body(node, "t", body)
    sent = _now_ms()
    await until(lambda: _now_ms() >= sent + 50, what="the clock moves on")  # (a retry later)
    again = await _send_body(node, "t", body)
    assert again == first, "the retry says what the first attempt stored"
    await until(lambda: node.broker.meta.timers.pending == 0, timeout_s=10, what="delivered")
    got = {m["body"]: m for m in await _pull(node, "t")}
    for r, name in zip(first, ("rel", "past"), strict=True):
        assert got[name]["properties"]["TIMER_DELIVER_MS"] == str(r["deliver_at_ms"])
        assert got[name]["store_timestamp"] >= r["deliver_at_ms"]


async def _send_body(node: Node, topic: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = await node.http.post(f"/v1/topics/{topic}/messages", json=body)
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = orjson.loads(r.content)["results"]
    return results


async def test_a_recall_racing_the_delivery_cancels_it_or_is_refused_never_both(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release checked that the timer was pending, then appended its copy; a cancel
    that came in between was appended first and answered 200, and the copy still went
    into the topic (found by the chaos checker, tests/chaos). Releases and cancels now
    take turns: here the release was first, so the recall is refused."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    [r] = await _send(node, "t", [{"body": "raced", "delay_ms": 100}])
    entered, go = asyncio.Event(), asyncio.Event()
    produce_to = b.timers.producer.produce_to

    async def held(topic: Any, messages: Any, producer_id: Any, sequence: Any) -> Any:
        if topic.name == "t":  # the copy, held between the release's check and its append
            entered.set()
            await go.wait()
        return await produce_to(topic, messages, producer_id, sequence)

    monkeypatch.setattr(b.timers.producer, "produce_to", held)
    await until(entered.is_set, timeout_s=10, what="the release under way")
    recall = asyncio.create_task(node.http.delete(f"/v1/delayed/{r['recall_handle']}"))
    # The recall's chance to overtake the copy (it took a few milliseconds before).
    await asyncio.wait({recall}, timeout=0.3)
    go.set()
    answer = await recall
    await until(lambda: b.timers.released == 1, timeout_s=10, what="the copy appended")
    assert b.meta.timers.pending == 0
    assert [m["body"] for m in await _pull(node, "t")] == ["raced"]
    assert answer.status_code == 409, answer.text
    assert orjson.loads(answer.content)["error"]["code"] == "ALREADY_DELIVERED"
    assert b.meta.timers.stats["cancelled"] == 0


async def test_a_cancel_not_applied_yet_is_an_unknown_outcome(node: Node) -> None:
    """A cancel whose operation is not applied when its append returns (the wait for it
    timed out) may still cancel the message: it answered ALREADY_DELIVERED, and the
    message was then never delivered. Now 503 UNKNOWN_OUTCOME (a retry says which)."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    [r] = await _send(node, "t", [{"body": "slow", "delay_ms": 60_000}])

    async def timed_out(op: Any) -> int:
        return -1  # (an index whose outcome is not known here)

    metalog = b.timers.metalog
    metalog.append = timed_out  # type: ignore[method-assign]
    try:
        answer = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
    finally:
        del metalog.append
    assert answer.status_code == 503, answer.text
    assert orjson.loads(answer.content)["error"]["code"] == "UNKNOWN_OUTCOME"
    again = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
    assert again.status_code == 200, again.text


async def test_a_node_stops_at_once_after_a_recall(tmp_path: Path) -> None:
    """A recall wakes the release loop; it waited with ``asyncio.wait_for``, which on
    Python 3.11 swallows a cancel that comes as the wait ends, so a stop right after a
    recall hung for ever (the loop's task cancelled and looping on). ``asyncio.timeout``
    now, as every bounded wait of the broker."""
    async with asyncio.timeout(30):  # (a hang fails here, not at the suite's timeout)
        async with running_node(node_settings(tmp_path / "n0")) as node:
            await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
            [r] = await _send(node, "t", [{"body": "x", "delay_ms": 60_000}])
            answer = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
            assert answer.status_code == 200, answer.text


async def test_a_repeated_recall_still_answers_200_once_its_timer_is_trimmed(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    [r] = await _send(node, "t", [{"body": "c", "delay_ms": 60_000}])
    handle = r["recall_handle"]
    assert (await node.http.delete(f"/v1/delayed/{handle}")).status_code == 200
    await _send(node, "t", [{"body": f"d{i}", "delay_ms": 0} for i in range(7)])
    await until(lambda: node.broker.meta.timers.pending == 0, timeout_s=10, what="done")
    assert node.broker.meta.timers.base == 8  # timers 0-7 done: their byte trimmed
    again = await node.http.delete(f"/v1/delayed/{handle}")
    assert again.status_code == 200, again.text  # (409 ALREADY_DELIVERED before the fix)


async def test_bad_delay_input_changes_nothing(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    before = node.log_state()
    bad: list[Any] = [
        [{"body": "x", "delay_ms": 5, "deliver_at_ms": _now_ms() + 5}],  # both
        [{"body": "x", "delay_ms": 4 * 24 * 3_600_000}],  # over max_delay_ms
        [{"body": "x", "delay_ms": -1}],
        [{"body": "x", "delay_ms": "soon"}],
        [{"body": "x", "delay_ms": 100}, {"body": "y"}],  # some delayed, some not
        [{"body": "x", "delay_ms": 100, "properties": {"TIMER_ORIGIN": "0"}}],  # reserved
    ]
    for messages in bad:
        r = await node.http.post("/v1/topics/t/messages", json={"messages": messages})
        assert r.status_code == 422, (messages, r.text)
    r = await node.http.post(
        "/v1/topics/t/messages",
        json={"messages": [{"body": "x", "properties": {"REAL_TOPIC": "u"}}]},
    )
    assert r.status_code == 422, "a producer never sets what the broker's copies carry"
    assert node.log_state() == before
    for handle in ("t1:99", "nope", "t1:x"):
        r = await node.http.delete(f"/v1/delayed/{handle}")
        assert r.status_code == 404, r.text
    # The timer topic is nobody's: not listed, not readable, not writable by name.
    await _send(node, "t", [{"body": "d", "delay_ms": 60_000}])
    r = await node.http.get("/v1/topics")
    assert TIMER_TOPIC not in [t["name"] for t in orjson.loads(r.content)["topics"]]
    r = await node.http.get(f"/v1/topics/{TIMER_TOPIC}/queues/0/messages")
    assert r.status_code in (404, 422), r.text


async def test_timers_past_the_window_and_across_a_restart_are_delivered_once(
    tmp_path: Path,
) -> None:
    """With a 300 ms window, a message 1.5 s away waits in the log, not in memory, until
    a refill reads it from the timer queue; a restart in between forgets nothing (the
    state from the snapshot or the log, the heap refilled) and delivers nothing twice."""
    settings = node_settings(tmp_path / "n0", timer_window_ms=300)
    async with running_node(settings) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        first, second = await _send(
            node,
            "t",
            [{"body": "soon", "delay_ms": 100}, {"body": "later", "delay_ms": 1500}],
        )
        await until(lambda: node.broker.meta.timers.stats["delivered"] == 1, what="soon due")
        assert node.broker.meta.timers.pending == 1
        assert 1 not in node.broker.timers._in_heap, "outside the window: not in memory"
    async with running_node(settings) as node:
        await until(lambda: node.broker.meta.timers.pending == 0, what="later due")
        got = await _pull(node, "t")
        assert [m["body"] for m in got] == ["soon", "later"]
        assert got[1]["store_timestamp"] >= second["deliver_at_ms"]
        assert node.broker.meta.timers.stats["delivered"] == 2
        assert first["recall_handle"] != second["recall_handle"]


async def test_a_pending_delay_message_holds_retention_and_snapshots_back(node: Node) -> None:
    """The first pending timer's entry is the pin: retention keeps it, and a snapshot
    taken after it is not handed to Raft (a follower that installed it could not read
    the timer's record); once delivered, the newest snapshot goes to Raft again."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    [r] = await _send(node, "t", [{"body": "pinned", "delay_ms": 1500}])
    pinned = b.timers.pinned_entry_pos()
    assert pinned is not None and pinned == r["commitlog_offset"] - 48
    await _send(node, "t", [{"body": "more"}])
    await b.dispatcher.snapshot()  # a snapshot past the pin: kept on disk, not served
    snaps = b.dispatcher.snapshot_manager
    assert snaps.snapshot_index > snaps.served_index and snaps.unserved
    assert b.store._retention_floor is not None and b.store._retention_floor <= pinned
    await until(lambda: b.meta.timers.pending == 0, what="delivered")
    assert b.timers.pinned_entry_pos() is None
    await b.dispatcher.snapshot()
    assert snaps.served_index == snaps.snapshot_index == b.meta.applied_index


async def test_the_client_sends_delay_messages_and_recalls_one(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    async with AsyncProducer("http://node", transport=httpx.ASGITransport(app=node.app)) as p:
        soon, later = await p.send(
            "t", [Message("soon", delay_ms=200), Message("later", delay_ms=60_000)]
        )
        assert (soon.queue_id, soon.queue_offset) == (-1, -1) and soon.recall_handle
        assert later.deliver_at_ms is not None and later.recall_handle
        await p.recall(later.recall_handle)
        await until(lambda: node.broker.meta.timers.pending == 0, what="done")
        with pytest.raises(AlreadyDeliveredError):
            await p.recall(soon.recall_handle)
    assert [m["body"] for m in await _pull(node, "t")] == ["soon"]


async def test_a_dead_lettered_delay_message_carries_no_origin(node: Node) -> None:
    """A copy of a copy (here a delay message dead-lettered by a POP group) drops the
    origin its first copy ended: the timer applier sees no second delivery."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _send(node, "t", [{"body": "late", "delay_ms": 0}])
    await until(lambda: node.broker.meta.timers.pending == 0, what="delivered")
    r = await node.http.post("/v1/groups/g/receive", json={"topic": "t", "invisible_ms": 60_000})
    [m] = orjson.loads(r.content)["messages"]
    assert "TIMER_ORIGIN" in m["properties"]
    r = await node.http.post(
        "/v1/groups/g/dlq", json={"topic": "t", "receipt_handles": [m["receipt_handle"]]}
    )
    assert orjson.loads(r.content)["results"][0]["status"] == "OK"
    r = await node.http.get("/v1/topics/%25DLQ%25g/queues/0/messages?offset=0")
    [dead] = orjson.loads(r.content)["messages"]
    assert "TIMER_ORIGIN" not in dead["properties"]
    assert dead["properties"]["TIMER_DELIVER_MS"] == m["properties"]["TIMER_DELIVER_MS"]
    assert node.broker.meta.timers.stats["delivered"] == 1


async def test_a_recall_while_a_release_waits_either_cancels_or_finds_it_delivered(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the broker simulation (with the fix undone, seed 150 fails: PLANTED_DELAY
    in tests/sim/test_broker_simulation.py): a release reads the log end, waits until
    it is applied here, checks the timer is pending and appends its copy. A cancel
    appended during that wait came before the copy in the log: the recall was answered
    200 and the copy delivered the message anyway. A cancel now waits for the release."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    [r] = await _send(node, "t", [{"body": "raced", "delay_ms": 300}])
    real = b.dispatcher.wait_dispatched
    recall: list[asyncio.Task[httpx.Response]] = []

    async def wait_dispatched(index: int, timeout_s: float) -> bool:
        if not recall:  # the release's wait (the first after the produce): recall now
            recall.append(
                asyncio.create_task(node.http.delete(f"/v1/delayed/{r['recall_handle']}"))
            )
            # The log end the release waits for is applied just after the cancel is
            # appended (if it is not held back), before the cancel is applied.
            for _ in range(200):
                await asyncio.sleep(0.001)
                if b.server.ledger_end_index > index:
                    break
        return await real(index, timeout_s)

    monkeypatch.setattr(b.dispatcher, "wait_dispatched", wait_dispatched)
    await until(lambda: bool(recall) and recall[0].done(), what="the recall answered")
    await until(lambda: b.meta.timers.pending == 0, what="done")
    answer = recall[0].result()
    delivered = [m["body"] for m in await _pull(node, "t")]
    assert (answer.status_code, delivered) in ((200, []), (409, ["raced"])), answer.text
    assert b.meta.timers.stats["delivered"] + b.meta.timers.stats["cancelled"] == 1


async def test_a_retried_produce_answers_the_time_its_timer_holds(node: Node) -> None:
    """Found by the broker simulation (with the fix undone, seed 27 fails): a retry
    answered from the producer-session table reported its own "now" as the time of a
    message sent with a time in the past, not the first attempt's, which its timer
    holds."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    body = {"messages": [{"body": "past", "deliver_at_ms": 1}], "producer_id": "p", "sequence": 0}
    first = orjson.loads((await node.http.post("/v1/topics/t/messages", json=body)).content)
    await asyncio.sleep(0.01)  # (the retry's now is later)
    again = orjson.loads((await node.http.post("/v1/topics/t/messages", json=body)).content)
    assert again["results"] == first["results"]


async def test_a_message_pinned_to_a_queue_its_topic_lost_is_dropped_not_stuck(
    node: Node,
) -> None:
    """Found by the broker simulation (with the fix undone, seed 442 fails): a delay
    message pinned to a queue that its topic no longer had (deleted and made again with
    fewer queues) made every release of its batch fail, again and again: it and the
    messages due with it were never delivered. It is dropped now, as one whose topic is
    gone."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 4})
    at = _now_ms() + 400
    pinned = {"body": "pinned", "deliver_at_ms": at, "queue_id": 3}
    await _send(node, "t", [pinned, {"body": "free", "deliver_at_ms": at}])
    assert (await node.http.delete("/v1/topics/t")).status_code in (200, 204)
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await until(lambda: node.broker.meta.timers.pending == 0, timeout_s=10, what="done")
    assert [m["body"] for m in await _pull(node, "t")] == ["free"]
    assert node.broker.meta.timers.stats["dropped"] == 1


async def test_a_cancel_not_applied_in_time_is_no_already_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel committed but not applied here within ``append_timeout_ms`` was answered
    409 ALREADY_DELIVERED (its outcome not known, the timer not cancelled yet), and then
    cancelled the message: it answers 503 UNKNOWN_OUTCOME now, and a retry 200."""
    async with running_node(node_settings(tmp_path / "n0", append_timeout_ms=300)) as node:
        b = node.broker
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        [r] = await _send(node, "t", [{"body": "later", "delay_ms": 60_000}])

        async def idle(force: bool = False) -> None:
            await asyncio.sleep(0.01)

        with monkeypatch.context() as m:  # a dispatcher behind (its loop idles meanwhile)
            m.setattr(b.dispatcher, "dispatch_some", lambda _max: 0)
            m.setattr(b.dispatcher, "housekeep", idle)
            first = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
        assert first.status_code == 503, first.text
        await _send(node, "t", [{"body": "more"}])  # (a commit: the dispatcher goes on)
        await until(lambda: b.meta.timers.pending == 0, what="cancelled")
        again = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
        assert again.status_code == 200, again.text
        assert b.meta.timers.stats["cancelled"] == 1


async def test_a_deposed_master_does_not_spin_on_the_timers_it_held(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that stops being master keeps its near window, where timers fall due that
    only a master releases. Its release loop waited until the first of them was due: 0 s
    once it was, so it turned again at once, for as long as it stayed a slave (found
    while making the loop a ``step`` the simulation drives; with the fix undone, seed 15
    fails). A slave's loop waits ``IDLE_S`` now."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await until(lambda: b.timers._window_end > 0, what="the loop's first turn as master")
    await _send(node, "t", [{"body": "held", "delay_ms": 300}])
    assert b.timers._heap, "in the near window"
    turns = 0
    step = b.timers.step

    async def counted() -> float | None:
        nonlocal turns
        turns += 1
        assert turns < 100, "the release loop spins"  # (ends it: the node fails)
        return await step()

    monkeypatch.setattr(b.timers, "step", counted)
    b.gate.set_role(BrokerRole.SLAVE, b.gate.role_term, "a test: deposed")
    b.timers._wake.set()  # (the loop takes a turn now, as a slave)
    await asyncio.sleep(0.6)  # the timer falls due meanwhile
    assert turns <= 3 and b.meta.timers.pending == 1
    b.gate.set_role(BrokerRole.MASTER, b.gate.role_term, "a test: master again")
    b.timers._wake.set()
    await until(lambda: b.meta.timers.pending == 0, what="delivered by the master")
    assert [m["body"] for m in await _pull(node, "t")] == ["held"]


async def test_a_delay_message_pinned_to_a_queue_its_topic_has_not_is_refused(
    node: Node,
) -> None:
    """A plain produce refuses a queue_id its topic has not (422) when it encodes; a
    delay message's record goes to the timer topic's one queue, so its queue_id went
    unchecked: it was stored, and dropped at its time (found by the broker simulation,
    seed 404: a produce pinned to a queue of a topic made again with fewer queues in
    the meantime). It is refused as a plain produce is, and nothing is written."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 2})
    before = node.log_state()
    for delayed in ({"delay_ms": 100}, {}):
        r = await node.http.post(
            "/v1/topics/t/messages", json={"messages": [{"body": "x", "queue_id": 2, **delayed}]}
        )
        assert r.status_code == 422 and "queue_id 2 is not in 0..1" in r.text, r.text
    assert node.log_state() == before


async def test_a_recall_right_after_its_produce_finds_it_while_the_dispatcher_lags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A produce is answered once committed, and waits for dispatch only a while: a
    recall right after it, on a master whose dispatcher lagged, answered 404 (the timer
    beyond ``end``). Found by the broker simulation (seed 887). It waits until what is
    committed is applied now (and a slave sends it to the master)."""
    async with running_node(node_settings(tmp_path / "n0", append_timeout_ms=300)) as node:
        b = node.broker
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        await _send(node, "t", [{"body": "first", "delay_ms": 60_000}])  # (the timer topic)

        async def idle(force: bool = False) -> None:
            await asyncio.sleep(0.01)

        with monkeypatch.context() as m:  # a dispatcher behind (its loop idles meanwhile)
            m.setattr(b.dispatcher, "dispatch_some", lambda _max: 0)
            m.setattr(b.dispatcher, "housekeep", idle)
            [r] = await _send(node, "t", [{"body": "lagged", "delay_ms": 60_000}])
        assert b.meta.timers.end == 1, "committed, answered, not applied yet"
        answer = await node.http.delete(f"/v1/delayed/{r['recall_handle']}")
        assert answer.status_code == 200, answer.text
        assert b.meta.timers.stats["cancelled"] == 1
