"""The send window (``broker/sendwindow.py``): a RocketMQ client's message id resent is
answered with the first send's result and stored once, on the master that took it and
after a failover; the window forgets by count and by log time, alike on every replica,
and travels in the metadata snapshot."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from broker.broker import Broker, NewMessage
from broker.dispatch.appliers import state_appliers
from broker.dispatch.snapshots import parse_snapshot, snapshot_bytes
from broker.metadata import MetadataState
from broker.sendwindow import SendWindow, is_send_id, send_session
from tests.broker.harness import BrokerCluster


def test_the_window_forgets_the_oldest_ids_by_count_and_by_log_time() -> None:
    w = SendWindow(max_ids=3, max_age_ms=1000)
    for i, ts in enumerate((100, 200, 300)):
        w.record(f"%id%m{i}", 0, 0, 1, ts, (0, i, i * 10))
    assert list(w) == ["%id%m0", "%id%m1", "%id%m2"] and w["%id%m1"].results == [(0, 1, 10)]
    w.record("%id%m3", 0, 0, 1, 400, (0, 3, 30))  # a fourth: the oldest goes
    assert list(w) == ["%id%m1", "%id%m2", "%id%m3"]
    w.record("%id%m4", 0, 0, 1, 1250, (0, 4, 40))  # log time 1250: what is before 250 goes
    assert list(w) == ["%id%m2", "%id%m3", "%id%m4"]
    w.record("%id%m5", 0, 0, 1, 2400, (0, 5, 50))
    assert list(w) == ["%id%m5"] and w.evicted == 5
    # a batch's messages complete it in order; a repeated index is not counted twice
    w.record("%id%b", 0, 0, 2, 2500, (1, 0, 60))
    w.record("%id%b", 0, 0, 2, 2500, (1, 0, 60))
    assert not w["%id%b"].complete
    w.record("%id%b", 0, 1, 2, 2500, (1, 1, 61))
    assert w["%id%b"].complete and w["%id%b"].results == [(1, 0, 60), (1, 1, 61)]


def test_send_ids_are_not_producer_ids() -> None:
    pid, seq = send_session("0102FC000000012FF00B1A327800000000")
    assert (pid, seq) == ("%id%0102FC000000012FF00B1A327800000000", 0) and is_send_id(pid)
    assert not is_send_id("p-1") and not is_send_id("%id%") and not is_send_id("%id%a\x01")
    assert not is_send_id("%id%" + "x" * 129)


def test_the_window_is_in_the_snapshot_and_an_older_snapshot_has_none() -> None:
    meta = MetadataState()
    meta.send_window.record("%id%a", 0, 0, 1, 5, (2, 7, 700))
    data = snapshot_bytes(meta, state_appliers(meta))
    assert orjson.loads(data)["send_window"] == [["%id%a", 5, 0, 1, [[2, 7, 700]]]]
    again = MetadataState()
    parse_snapshot(data, state_appliers(again)).adopt(again)
    assert again.send_window["%id%a"] == meta.send_window["%id%a"]
    doc = orjson.loads(data)
    del doc["send_window"]
    older = MetadataState()
    parse_snapshot(orjson.dumps(doc), state_appliers(older)).adopt(older)
    assert len(older.send_window) == 0
    doc["send_window"] = [["%id%a", "x", 0, 1, []]]
    with pytest.raises(ValueError, match="malformed"):
        parse_snapshot(orjson.dumps(doc), state_appliers(MetadataState()))


async def _count(b: Broker, topic: str) -> int:
    return sum(b.reads.queue_bounds(topic, q)[1] for q in range(b.meta.topics[topic].queues))


@pytest.mark.asyncio
async def test_a_resent_message_id_is_stored_once_and_after_a_failover_too(
    tmp_path: Path,
) -> None:
    c = BrokerCluster(tmp_path, n=3, send_window_ids=4)
    await c.start_all()
    try:
        m = await c.master()
        await m.topics.create("t", 2)
        pid, seq = send_session("ID-1")
        first = await m.producer.produce("t", [NewMessage(b"one")], pid, seq)
        again = await m.producer.produce("t", [NewMessage(b"one")], pid, seq)
        assert again == first and m.stats["deduplicated"] == 1
        # a delay message and a transaction are sends of their own ids, likewise
        dpid, _ = send_session("ID-delay")
        at = m.producer.clock() + 3_600_000
        [d1] = await m.timers.produce("t", [NewMessage(b"later", deliver_at_ms=at)], dpid, 0)
        [d2] = await m.timers.produce("t", [NewMessage(b"later", deliver_at_ms=at)], dpid, 0)
        assert d1.recall_handle == d2.recall_handle
        tpid, _ = send_session("ID-tx")
        t1 = await m.transactions.produce("t", [NewMessage(b"half")], "pg", tpid, 0)
        t2 = await m.transactions.produce("t", [NewMessage(b"half")], "pg", tpid, 0)
        assert t1.transaction_id == t2.transaction_id and len(m.meta.transactions.live) == 1
        await c.converged()
        for b in c.brokers.values():  # the window is replicated: every node has it
            assert b.meta.send_window[pid].results == [
                (first[0].queue_id, first[0].queue_offset, first[0].commitlog_offset)
            ]
            assert len(b.meta.send_window) == 3 and b.meta.sessions == {}
        assert await _count(m, "t") == 1
        old = m.settings.node_id
        await c.stop(old)
        m2 = await c.master(timeout_s=30)
        after = await m2.producer.produce("t", [NewMessage(b"one")], pid, seq)
        assert after == first and await _count(m2, "t") == 1
        # past the window (4 ids here), the id is forgotten: a resend is a new message
        for i in range(4):
            await m2.producer.produce("t", [NewMessage(b"n")], *send_session(f"other-{i}"))
        assert pid not in m2.meta.send_window
        late = await m2.producer.produce("t", [NewMessage(b"one")], pid, seq)
        assert late[0].commitlog_offset != first[0].commitlog_offset
        await c.start(old)
        await c.converged(timeout_s=30)
        windows = {n: list(b.meta.send_window.sent.items()) for n, b in c.brokers.items()}
        assert len({orjson.dumps(w) for w in windows.values()}) == 1, windows
    finally:
        await c.close()
