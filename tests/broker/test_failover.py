"""Three brokers in one process over real TCP on 127.0.0.1: every node serves committed
reads, the master fails over, offsets continue without gap or duplicate, consumer
offsets and producer sessions survive, slaves refuse writes with the master's address,
a retried session batch is never appended twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker import errors
from broker.broker import Broker, NewMessage
from broker.gate import NO_LEADER_RETRY_AFTER_MS, PROMOTING_RETRY_AFTER_MS, BrokerRole
from dledger.core.messages import PushEntryRequest
from dledger.core.settings import CoreSettings
from tests.broker.harness import BrokerCluster
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _bodies(c: BrokerCluster, node: str, topic: str, qid: int) -> list[bytes]:
    b = c.brokers[node]
    out: list[bytes] = []
    for _ in range(100):  # bounded
        r = await b.reads.pull(b.reads.pulled_message, topic, qid, len(out), max_messages=1000)
        if r.status != "FOUND":
            return out
        assert [m.queue_offset for m in r.messages] == list(range(len(out), r.next_offset))
        out.extend(m.body for m in r.messages)
    return out


@pytest.mark.parametrize("batch_records", [True, False], ids=["batch-records", "single-records"])
async def test_failover_keeps_queue_offsets_contiguous_and_group_offsets(
    tmp_path: Path, batch_records: bool
) -> None:
    c = BrokerCluster(tmp_path, n=3, batch_records=batch_records)
    await c.start_all()
    try:
        m = await c.master()
        await m.topics.create("t", 2)
        first = await m.producer.produce("t", [NewMessage(b"a%d" % i) for i in range(20)])
        # (within what each queue holds: batch records put a request in one queue)
        held = {q: sum(r.queue_id == q for r in first) for q in (0, 1)}
        committed = {q: min(n, held[q]) for q, n in ((0, 4), (1, 3))}
        await m.groups.commit_offsets("grp", "t", committed)
        [s] = await m.producer.produce("t", [NewMessage(b"s")], producer_id="p", sequence=1)
        in_q0 = sum(r.queue_id == 0 for r in [*first, s])
        await c.converged()
        for node, b in c.brokers.items():
            assert b.meta.committed_offset("grp", "t", 0) == committed[0], node
            assert len(await _bodies(c, node, "t", 0)) == in_q0, node
            if b is not m:
                with pytest.raises(errors.NotMasterError) as ei:
                    await b.producer.produce("t", [NewMessage(b"x")])
                assert ei.value.leader_id == m.settings.node_id
                assert ei.value.leader_addr == m.settings.peer_map[m.settings.node_id]
                # Every write redirects before it looks at its topic: a slave may not know
                # a topic the master just made (it answered 404, not 307), and creating
                # one that exists is a write too.
                for write in (
                    b.topics.create("t", 2),
                    b.topics.delete("not-here-yet"),
                    b.groups.commit_offsets("grp", "not-here-yet", {0: 1}),
                    b.groups.reset_offsets("grp", "not-here-yet", "earliest"),
                ):
                    with pytest.raises(errors.NotMasterError):
                        await write
        old = m.settings.node_id
        await c.stop(old)
        m2 = await c.master(timeout_s=30)
        assert m2.settings.node_id != old
        # the retried session batch is answered from the replicated session table
        again = await m2.producer.produce("t", [NewMessage(b"s")], producer_id="p", sequence=1)
        second = await m2.producer.produce("t", [NewMessage(b"b%d" % i) for i in range(20)])
        assert again == [s]
        q0 = [r.queue_offset for r in [*first, s, *second] if r.queue_id == 0]
        assert sorted(q0) == list(range(len(q0))) and len(q0) > in_q0  # no gap, no reuse
        assert m2.meta.committed_offset("grp", "t", 1) == committed[1]
        await c.start(old)
        await c.converged(timeout_s=30)
        bodies = {node: await _bodies(c, node, "t", 0) for node in c.brokers}
        assert len({tuple(v) for v in bodies.values()}) == 1
        assert len(bodies[old]) == len(q0) and len(set(bodies[old])) == len(q0)
    finally:
        await c.close()


async def test_consume_queue_files_are_byte_identical_on_every_replica(tmp_path: Path) -> None:
    c = BrokerCluster(tmp_path, n=3)
    await c.start_all()
    try:
        m = await c.master()
        await m.topics.create("t", 3)
        for i in range(10):
            await m.producer.produce("t", [NewMessage(b"x" * i, keys=[f"k{i}"])] * 30)
        await c.converged()
        for b in c.brokers.values():
            await b.dispatcher.checkpoint()
        files = {}
        for node in c.brokers:
            root = c.settings(node).data_dir / "consumequeue" / "g0" / "t"
            files[node] = {
                p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()
            }
        assert files["n0"] and files["n0"] == files["n1"] == files["n2"]
        for b in c.brokers.values():
            assert [x.body for x in b.reads.query_by_key(b.reads.pulled_message, "t", "k7")] == [
                b"x" * 7
            ] * 30
    finally:
        await c.close()


async def test_a_slave_without_a_known_leader_says_no_master(tmp_path: Path) -> None:
    c = BrokerCluster(tmp_path, n=3)
    await c.start("n0")  # alone: no quorum, no leader
    try:
        b = c.brokers["n0"]
        await until(lambda: b.server.core is not None)
        with pytest.raises(errors.NoMasterError) as ei:
            await b.topics.create("t", 1)
        assert ei.value.fields["retry_after_ms"] == NO_LEADER_RETRY_AFTER_MS
    finally:
        await c.close()


async def test_a_slave_redirects_to_the_new_master_the_moment_it_follows_it(
    tmp_path: Path,
) -> None:
    """Issue 18: the master stops (its connections close: the early pre-vote elects a
    new leader); a slave that follows the new leader answers NOT_MASTER (307) naming it
    at once, before that leader is even MASTER; the new leader says NO_MASTER with a
    short Retry-After until its promotion is done."""
    c = BrokerCluster(tmp_path, n=3)
    await c.start_all()
    try:
        old = await c.master()
        await old.topics.create("t", 1)
        await c.converged()
        old_id = old.settings.node_id
        await c.stop(old_id)
        rest = [b for b in c.brokers.values() if b.settings.node_id != old_id]

        def new_leader() -> str | None:
            ids = {b.server.core.member_state.leader_id for b in rest if b.server.core is not None}
            return ids.pop() if len(ids) == 1 and not ids & {None, old_id} else None

        new = await until(new_leader, what="both survivors follow one new leader")
        slave = next(b for b in rest if b.settings.node_id != new)
        with pytest.raises(errors.NotMasterError) as ei:
            await slave.producer.produce("t", [NewMessage(b"x")])
        assert ei.value.leader_id == new
        assert ei.value.leader_url == slave.settings.peer_urls.get(new)
        leader = c.brokers[new]
        if leader.gate.role is not BrokerRole.MASTER:  # still promoting (a few ms)
            with pytest.raises(errors.NoMasterError) as nm:
                await leader.producer.produce("t", [NewMessage(b"x")])
            assert nm.value.fields["retry_after_ms"] == PROMOTING_RETRY_AFTER_MS
        await until(lambda: leader.gate.role is BrokerRole.MASTER, what="the new MASTER")
        assert leader.role_handler.last_promotion["promotion_total_ms"] >= 0
        assert "promotion_noop_ms" in leader.status().stats
    finally:
        await c.close()


async def test_a_retry_after_a_settle_timeout_never_appends_the_batch_again(
    tmp_path: Path,
) -> None:
    """settle-timeout-duplicate (the broker simulation, seed 15): the master cannot commit
    (its followers drop appends but answer heartbeats, so it stays master in its term);
    the produce times out with an unknown outcome while its entries stay in the log; a
    retry must wait for those entries, not append a second copy that commits too."""
    c = BrokerCluster(tmp_path, n=3, append_timeout_ms=300, core=CoreSettings(max_wait_ack_ms=300))
    await c.start_all()
    try:
        m = await c.master()
        await m.topics.create("t", 1)
        first = await m.producer.produce("t", [NewMessage(b"a")], producer_id="p", sequence=0)
        term = m.gate.role_term
        followers = [b for b in c.brokers.values() if b is not m]
        blocked = _drop_appends(followers)
        with pytest.raises(errors.UnknownOutcomeError):
            await m.producer.produce("t", [NewMessage(b"b")], producer_id="p", sequence=1)
        end = m.store.ledger_end_index
        with pytest.raises(errors.UnknownOutcomeError) as retry:
            await m.producer.produce("t", [NewMessage(b"b")], producer_id="p", sequence=1)
        assert m.store.ledger_end_index == end, "the retry appended the batch again"
        assert "not settled yet" in str(retry.value)
        blocked.clear()  # the followers take appends again: the first copy commits
        # (the leader re-pushes after max_wait_ack_ms; on a loaded machine that may take
        # longer than one settle wait, so wait for it rather than race it)
        await until(
            lambda: m.dispatcher.dispatched_index >= end, what="the first copy is dispatched"
        )
        again = await m.producer.produce("t", [NewMessage(b"b")], producer_id="p", sequence=1)
        assert (m.gate.role_term, m.is_master) == (term, True), "the test needs one master term"
        assert again[0].queue_offset == first[0].queue_offset + 1
        await c.converged()
        assert [b.reads.queue_bounds("t", 0) for b in c.brokers.values()] == [(0, 2)] * 3
    finally:
        await c.close()


def _drop_appends(brokers: list[Broker]) -> set[str]:
    """Make ``brokers`` drop every append push (heartbeats still pass) while the returned
    set is not empty."""
    blocked = {b.settings.node_id for b in brokers}
    for b in brokers:
        transport = b.server.transport
        assert transport is not None
        deliver = transport._on_peer

        def on_peer(msg: Any, deliver: Any = deliver, node: str = b.settings.node_id) -> None:
            if node in blocked and isinstance(msg, PushEntryRequest):
                return
            deliver(msg)

        transport._on_peer = on_peer
    return blocked
