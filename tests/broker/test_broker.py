"""The ``Broker`` facade on a single-node group (real files, real sockets): topics,
produce, pull with tags and long polling, groups, producer sessions, queries, restart."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker import errors
from broker.broker import Broker, NewMessage
from broker.settings import Limits
from tests.broker.harness import BrokerCluster
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _single(tmp_path: Path, **overrides: object) -> tuple[BrokerCluster, Broker]:
    c = BrokerCluster(tmp_path, n=1, **overrides)
    await c.start_all()
    return c, await c.master()


async def test_produce_then_pull_in_queue_order(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        t, created = await b.topics.create("orders", 2)
        assert created and t.queues == 2
        assert (await b.topics.create("orders", 2))[1] is False
        with pytest.raises(errors.TopicConflictError):
            await b.topics.create("orders", 3)
        msgs = [NewMessage(f"m{i}".encode(), tags="A" if i % 2 else "B") for i in range(10)]
        results = [(await b.producer.produce("orders", [m]))[0] for m in msgs]
        assert [r.queue_id for r in results] == [0, 1] * 5  # round-robin
        assert [r.queue_offset for r in results if r.queue_id == 0] == [0, 1, 2, 3, 4]
        r = await b.reads.pull(b.reads.pulled_message, "orders", 0, 0, max_messages=32)
        assert r.status == "FOUND" and r.next_offset == 5 and (r.min_offset, r.max_offset) == (0, 5)
        assert [m.body for m in r.messages] == [b"m0", b"m2", b"m4", b"m6", b"m8"]
        assert [m.queue_offset for m in r.messages] == list(range(5))
        for m, res in zip(r.messages, results[::2], strict=True):
            assert m.msg_id == res.msg_id and m.commitlog_offset == res.commitlog_offset
            assert b.reads.get_message(b.reads.pulled_message, m.msg_id).body == m.body
        assert (await b.reads.pull(b.reads.pulled_message, "orders", 0, 5)).status == "NO_NEW_MSG"
        ill = await b.reads.pull(b.reads.pulled_message, "orders", 0, 6)
        assert ill.status == "OFFSET_ILLEGAL" and ill.next_offset == 5
    finally:
        await c.close()


async def test_physical_offset_is_the_position_in_the_dledger_files(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        [res] = await b.producer.produce("t", [NewMessage(b"hello", keys=["k1"])])
        entry = b.store.get(b.dispatcher.dispatched_index)
        assert entry.pos + 48 == res.commitlog_offset
        raw = b.store.read(res.commitlog_offset, len(entry.body))
        assert raw == bytes(entry.body)
        assert int.from_bytes(raw[28:36], "big") == res.commitlog_offset  # PHYSICALOFFSET
    finally:
        await c.close()


async def test_tag_filter_sharding_key_and_pinned_queue(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 4)
        msgs = [NewMessage(b"%d" % i, tags=("TagA", "TagB", "TagC")[i % 3]) for i in range(9)]
        await b.producer.produce("t", [NewMessage(m.body, m.tags, queue_id=2) for m in msgs])
        r = await b.reads.pull(
            b.reads.pulled_message, "t", 2, 0, max_messages=32, tags="TagA||TagC"
        )
        assert [m.tags for m in r.messages] == ["TagA", "TagC"] * 3
        none = await b.reads.pull(b.reads.pulled_message, "t", 2, 0, max_messages=32, tags="TagZ")
        assert none.status == "NO_MATCHED_MSG" and none.next_offset == 9
        res = await b.producer.produce("t", [NewMessage(b"x", sharding_key="order-42")] * 5)
        assert len({x.queue_id for x in res}) == 1
        with pytest.raises(errors.InvalidArgumentError):
            await b.producer.produce("t", [NewMessage(b"x", queue_id=4)])
    finally:
        await c.close()


async def test_long_poll_is_woken_by_dispatch(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        started = time.monotonic()
        waiter = asyncio.ensure_future(
            b.reads.pull(b.reads.pulled_message, "t", 0, 0, max_messages=10, wait_ms=10_000)
        )
        await asyncio.sleep(0)
        assert not waiter.done()
        await b.producer.produce("t", [NewMessage(b"late")])
        r = await asyncio.wait_for(waiter, 5)
        assert r.status == "FOUND" and r.messages[0].body == b"late"
        assert time.monotonic() - started < 5
        timed = await b.reads.pull(b.reads.pulled_message, "t", 0, 1, max_messages=10, wait_ms=50)
        assert timed.status == "NO_NEW_MSG"
    finally:
        await c.close()


async def test_a_long_poll_across_a_topic_delete_waits_for_the_new_incarnation(
    tmp_path: Path,
) -> None:
    """``wait_queue`` is for a queue by name: its deletion sends the queue's next offset
    back to 0 and the waiter waits on, until the topic made again reaches its offset."""
    c, b = await _single(tmp_path)

    async def still_waiting(w: asyncio.Future[bool]) -> bool:
        for _ in range(5):
            await asyncio.sleep(0)
        return not w.done()

    try:
        await b.topics.create("t", 1)
        await b.producer.produce("t", [NewMessage(b"first")])
        waiter = asyncio.ensure_future(b.dispatcher.wait_queue("t", 0, 1, 30))
        assert await still_waiting(waiter) and b.dispatcher.arrivals.waiting_on("t", 0) == 1
        await b.topics.delete("t")
        assert await still_waiting(waiter)
        await b.topics.create("t", 1)
        await b.producer.produce("t", [NewMessage(b"again")])  # queue offset 0 of the new one
        assert await still_waiting(waiter)
        await b.producer.produce("t", [NewMessage(b"wanted")])
        assert await asyncio.wait_for(waiter, 5)
        assert b.dispatcher.arrivals.waiting_on("t", 0) == 0
    finally:
        await c.close()


async def test_producer_session_answers_a_retry_with_the_original_results(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        batch = [NewMessage(b"a"), NewMessage(b"b")]
        first = await b.producer.produce("t", batch, producer_id="p1", sequence=7)
        again = await b.producer.produce("t", batch, producer_id="p1", sequence=7)
        assert again == first
        both = await asyncio.gather(
            b.producer.produce("t", batch, producer_id="p1", sequence=8),
            b.producer.produce("t", batch, producer_id="p1", sequence=8),
        )
        assert both[0] == both[1]
        with pytest.raises(errors.SequenceTooOldError):
            await b.producer.produce("t", batch, producer_id="p1", sequence=6)
        total = sum(b.reads.queue_bounds("t", q)[1] for q in range(8))
        assert total == 4  # two batches, each appended once
    finally:
        await c.close()


async def test_group_offsets_commit_reset_and_group_pull(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 2)
        await b.producer.produce("t", [NewMessage(b"%d" % i) for i in range(6)])
        r = await b.groups.group_pull(
            b.reads.pulled_message, "g", "t", max_messages=4, auto_commit=True
        )
        assert len(r.messages) == 4
        rest = await b.groups.group_pull(
            b.reads.pulled_message, "g", "t", max_messages=10, auto_commit=True
        )
        assert len(rest.messages) == 2
        assert {m.body for m in r.messages + rest.messages} == {b"%d" % i for i in range(6)}
        lag = {o["queue_id"]: o["lag"] for o in b.groups.group_offsets("g", "t")}
        assert lag == {0: 0, 1: 0}
        await b.groups.reset_offsets("g", "t", "earliest")
        assert [o["committed_offset"] for o in b.groups.group_offsets("g", "t")] == [0, 0]
        q = max(range(2), key=lambda q: b.reads.queue_bounds("t", q)[1])  # (it holds 3 or more)
        await b.groups.commit_offsets("g", "t", {q: 2})
        assert b.meta.committed_offset("g", "t", q) == 2
        with pytest.raises(errors.InvalidArgumentError, match="past its max offset"):
            await b.groups.commit_offsets("g", "t", {q: 7})
        assert b.groups.list_groups() == ["g"]
        with pytest.raises(errors.InvalidArgumentError):
            await b.groups.commit_offsets("g", "t", {5: 1})
        with pytest.raises(errors.GroupNotFoundError):
            b.groups.group_offsets("nobody")
    finally:
        await c.close()


async def test_a_commit_not_applied_here_in_time_answers_unknown_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer says where the group stands after the commit: when the entry is not
    applied here within the append timeout, the node cannot know that, and says so
    rather than answering the state before the commit."""
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        await b.producer.produce("t", [NewMessage(b"%d" % i) for i in range(3)])

        class Behind:  # dispatch as the groups see it, stuck before every entry
            dispatched_index = -1

            def __getattr__(self, name: str) -> Any:
                return getattr(b.dispatch, name)

        monkeypatch.setattr(b.groups, "dispatch", Behind())
        with pytest.raises(errors.UnknownOutcomeError, match="not applied here yet"):
            await b.groups.commit_offsets("g", "t", {0: 2})
        monkeypatch.undo()
        assert b.meta.committed_offset("g", "t", 0) == 2  # it was committed all the same
        assert await b.groups.commit_offsets("g", "t", {0: 1}) == {0: 2}  # stale: stays
    finally:
        await c.close()


async def test_query_by_key_skips_a_deleted_incarnation_of_the_topic(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        await b.producer.produce("t", [NewMessage(b"old", keys=["k"])])
        await b.topics.delete("t")
        await b.topics.create("t", 2)
        assert b.reads.query_by_key(b.reads.pulled_message, "t", "k") == []
        await b.producer.produce("t", [NewMessage(b"new", keys=["k"])])
        assert [m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", "k")] == [b"new"]
    finally:
        await c.close()


async def test_query_by_key_and_offset_by_time(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        before = int(time.time() * 1000) - 1
        await b.producer.produce("t", [NewMessage(b"a", keys=["order-1"])])
        await b.producer.produce("t", [NewMessage(b"b")])
        found = b.reads.query_by_key(b.reads.pulled_message, "t", "order-1")
        assert [m.body for m in found] == [b"a"]
        uniq = found[0].uniq_key
        assert uniq and [
            m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", uniq)
        ] == [b"a"]
        assert b.reads.query_by_key(b.reads.pulled_message, "t", "missing") == []
        assert b.reads.offset_for_time("t", 0, before) == 0
        assert b.reads.offset_for_time("t", 0, int(time.time() * 1000) + 60_000) == 2
        with pytest.raises(errors.MessageNotFoundError):
            b.reads.get_message(b.reads.pulled_message, found[0].msg_id[:-16] + "0" * 16)
        with pytest.raises(errors.InvalidArgumentError):
            b.reads.get_message(b.reads.pulled_message, "not-an-id")
    finally:
        await c.close()


async def test_bad_input_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    c, b = await _single(tmp_path, auto_create_topics=False)
    try:
        end = b.store.ledger_end_index
        with pytest.raises(errors.TopicNotFoundError):
            await b.producer.produce("nope", [NewMessage(b"x")])
        with pytest.raises(errors.InvalidArgumentError):
            await b.topics.create("%SYS%mine", 1)
        with pytest.raises(errors.InvalidArgumentError):
            await b.topics.create("bad/name", 1)
        await b.topics.create("t", 1)
        end = b.store.ledger_end_index
        lim = b.settings.limits
        with pytest.raises(errors.PayloadTooLargeError):
            await b.producer.produce("t", [NewMessage(b"x" * (lim.max_body_bytes + 1))])
        with pytest.raises(errors.PayloadTooLargeError):
            await b.producer.produce("t", [NewMessage(b"x")] * (lim.max_messages_per_request + 1))
        with pytest.raises(errors.InvalidArgumentError):
            await b.producer.produce("t", [NewMessage(b"x", properties={"TAGS": "sneaky"})])
        with pytest.raises(errors.InvalidArgumentError):
            await b.producer.produce("t", [NewMessage(b"x", properties={"a\x01": "b"})])
        with pytest.raises(errors.InvalidArgumentError):
            await b.producer.produce("t", [NewMessage(b"x")], producer_id="p")
        assert b.store.ledger_end_index == end
    finally:
        await c.close()


async def test_topic_delete_drops_queues_and_recreate_starts_at_zero(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        await b.producer.produce("t", [NewMessage(b"old")] * 3)
        await b.groups.commit_offsets("g", "t", {0: 2})
        await b.topics.delete("t")
        assert "t" not in {t.name for t in b.topics.all()}
        with pytest.raises(errors.TopicNotFoundError):
            await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        await b.topics.create("t", 1)
        [res] = await b.producer.produce("t", [NewMessage(b"new")])
        assert res.queue_offset == 0
        assert b.meta.committed_offset("g", "t", 0) is None
    finally:
        await c.close()


async def test_restart_rebuilds_deleted_consume_queues_identically(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 3)
        held = [0, 0, 0]  # each queue's messages
        for i in range(5):
            for r in await b.producer.produce("t", [NewMessage(b"%d" % i, keys=[f"k{i}"])] * 50):
                held[r.queue_id] += 1
        await b.groups.commit_offsets("g", "t", {0: 10})
        cq_dir = c.settings("n0").data_dir / "consumequeue"
        await c.stop("n0")
        before = {p.relative_to(cq_dir): p.read_bytes() for p in cq_dir.rglob("*") if p.is_file()}
        c.wipe_consume_queues("n0")
        b = await c.start("n0")
        await until(lambda: b.is_master, what="master again")
        await until(lambda: b.dispatcher.dispatched_index == b.store.committed_index)
        assert b.dispatcher.stats["rebuilds"] == 1
        for qid in range(3):
            assert b.reads.queue_bounds("t", qid)[1] == held[qid]
        await c.stop("n0")
        after = {p.relative_to(cq_dir): p.read_bytes() for p in cq_dir.rglob("*") if p.is_file()}
        for name, data in before.items():
            if not name.name.startswith("checkpoint"):
                assert after[name] == data, name
        b = await c.start("n0")
        await until(lambda: b.is_master, what="master again")
        assert b.meta.committed_offset("g", "t", 0) == 10
        assert [m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", "k3")] == [
            b"3"
        ] * 50
        [res] = await b.producer.produce(
            "t",
            [NewMessage(b"next")],
        )
        assert res.queue_offset == held[res.queue_id]
    finally:
        await c.close()


async def test_retention_moves_min_offsets_never_past_dispatch(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 2)
        for i in range(30):
            await b.producer.produce("t", [NewMessage(b"%04d" % i + b"x" * 1020)] * 100)
        store = b.store
        # Nothing is deleted while neither a checkpoint nor a snapshot covers the head.
        b.dispatcher.snapshot_manager.snapshot_index = -1
        store.set_retention_floor(store.ledger_begin_pos)
        assert await asyncio.to_thread(store.clean, True) == 0
        await b.dispatcher.snapshot()
        await b.dispatcher.checkpoint()
        deleted = await asyncio.to_thread(store.clean, True)
        assert deleted >= 1 and store.ledger_begin_index > 0
        await until(lambda: b.reads.queue_bounds("t", 0)[0] > 0, what="min offset moved")
        lo, hi = b.reads.queue_bounds("t", 0)
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        assert r.status == "OFFSET_ILLEGAL" and r.next_offset == lo and r.min_offset == lo
        first = await b.reads.pull(b.reads.pulled_message, "t", 0, lo, max_messages=1)
        assert first.status == "FOUND"
        assert first.messages[0].commitlog_offset >= store.ledger_begin_pos
        await b.groups.commit_offsets("g", "t", {0: 0})
        reset = await b.groups.reset_offsets("g", "t", "earliest")
        assert reset[0] == lo
        await c.stop("n0")
        b = await c.start("n0")
        await until(lambda: b.is_master, what="master after restart")
        assert b.reads.queue_bounds("t", 0) == (lo, hi)
        [res] = await b.producer.produce(
            "t",
            [NewMessage(b"after")],
        )
        assert res.queue_offset == b.reads.queue_bounds("t", res.queue_id)[1] - 1
    finally:
        await c.close()


async def test_a_pull_that_races_retention_answers_offset_illegal(tmp_path: Path) -> None:
    """Retention deletes the log head between a pull's bounds check and its read, before
    the dispatcher's beat moved the queues' min offsets: the pull moves them itself and
    answers OFFSET_ILLEGAL from the new head (it raised INDEX_OUT_OF_RANGE before)."""
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        for i in range(30):
            await b.producer.produce("t", [NewMessage(b"%04d" % i + b"x" * 1020)] * 100)
        await b.dispatcher.snapshot()
        await b.dispatcher.checkpoint()
        store = b.store
        # On the loop, so no beat runs between the deletion and the pull's bounds check.
        assert store.clean(True) >= 1 and store.ledger_begin_index > 0
        assert b.reads.queue_bounds("t", 0)[0] == 0, "the min offset moved before the pull"
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        lo = b.reads.queue_bounds("t", 0)[0]
        assert lo > 0
        assert (r.status, r.next_offset, r.min_offset) == ("OFFSET_ILLEGAL", lo, lo)
        first = await b.reads.pull(b.reads.pulled_message, "t", 0, lo, max_messages=1)
        assert first.status == "FOUND"
        assert first.messages[0].commitlog_offset >= store.ledger_begin_pos
    finally:
        await c.close()


async def test_a_tag_filter_that_matches_nothing_scans_a_bounded_backlog(
    tmp_path: Path,
) -> None:
    """Before: the pull scanned the whole backlog (and again up to wait_ms) without
    yielding, long enough for the node to miss its heartbeats. Now at most
    max_filter_scan_units per pull, in chunks between which the loop runs."""
    c, b = await _single(tmp_path, limits=replace(Limits(), max_filter_scan_units=3000))
    try:
        await b.topics.create("t", 1)
        for _batch in range(10):
            await b.producer.produce("t", [NewMessage(b"m", tags="A") for _ in range(1000)])
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        try:
            r = await b.reads.pull(
                b.reads.pulled_message, "t", 0, 0, max_messages=32, wait_ms=2000, tags="B"
            )
        finally:
            t.cancel()
        assert r.status == "NO_MATCHED_MSG" and r.messages == []
        assert 3000 <= r.next_offset < 10_000  # stopped at the bound, not at the end
        assert ticks >= 2  # the loop ran between the chunks
        r2 = await b.reads.pull(
            b.reads.pulled_message, "t", 0, r.next_offset, max_messages=32, tags="B"
        )
        assert r2.next_offset > r.next_offset  # the client goes on from there
        b.dispatcher.installing = True  # a snapshot install in progress: reads wait
        with pytest.raises(errors.BusyError, match="installing a snapshot"):
            await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        b.dispatcher.installing = False
    finally:
        await c.close()
