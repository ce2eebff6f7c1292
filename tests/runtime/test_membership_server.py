"""Membership changes between real servers over 127.0.0.1 sockets (issue 33): a node
joins as a learner, catches up, is promoted, a voter is removed, and the configuration
outlives a restart of every node."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.membership import AddLearner, Promote, Remove
from dledger.core.messages import Role
from dledger.runtime.server import DLedgerServer, NotLeaderError, ServerConfig
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until as _until

pytestmark = pytest.mark.asyncio


def _config(tmp_path: Path, node_id: str, peers: dict[str, str], **kw: object) -> ServerConfig:
    return ServerConfig(
        group="g0",
        self_id=node_id,
        peers=peers,
        data_dir=tmp_path / node_id,
        store=StoreSettings(data_file_size=1 << 20, index_file_size=32 * 1024),
        seed=int(node_id[1:]),
        **kw,  # type: ignore[arg-type]
    )


async def _leader(servers: dict[str, DLedgerServer]) -> DLedgerServer:
    await _until(
        lambda: sum(s.role is Role.LEADER for s in servers.values()) == 1, 15, "one leader"
    )
    return next(s for s in servers.values() if s.role is Role.LEADER)


async def _change(servers: dict[str, DLedgerServer], change: object) -> int:
    """Retry while the leader is not ready for a change (its term's first entry, or the
    previous change, not committed yet, a learner's acks not in yet); bounded."""
    for _ in range(100):
        leader = await _leader(servers)
        try:
            return await leader.change_membership(change)  # type: ignore[arg-type]
        except NotLeaderError:
            pass
        except DLedgerError as e:
            retry = (
                DLedgerCode.LEADER_NOT_READY,
                DLedgerCode.LEADER_PENDING_FULL,
                DLedgerCode.FALL_BEHIND_TOO_MUCH,  # a promotion: the learner's acks are coming
            )
            if e.code not in retry:
                raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"{change} was never taken")


async def test_grow_promote_remove_and_restart(tmp_path: Path) -> None:
    ports = free_ports(4)
    addr = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    three = {k: addr[k] for k in ("n0", "n1", "n2")}
    servers = {n: DLedgerServer(_config(tmp_path, n, three)) for n in three}
    for s in servers.values():
        await s.start()
    try:
        leader = await _leader(servers)
        for i in range(20):
            await leader.append([f"before {i}".encode()])
        # n3 joins: it knows the voters and itself as a learner
        joiner = DLedgerServer(
            _config(tmp_path, "n3", {**three, "n3": addr["n3"]}, learners=frozenset({"n3"}))
        )
        await joiner.start()
        servers["n3"] = joiner
        await _change(servers, AddLearner("n3", addr["n3"]))
        leader = await _leader(servers)
        end = leader.ledger_end_index
        await _until(lambda: joiner.ledger_end_index >= end, 15, "the learner caught up")
        assert joiner.role is not Role.LEADER and joiner.get(0) is not None
        await _change(servers, Promote("n3"))
        await _until(
            lambda: all(s.members["members"]["n3"]["voter"] for s in servers.values()),
            15,
            "every node sees n3 vote",
        )
        # remove a voter that does not lead; the others carry on without it
        leader = await _leader(servers)
        gone = next(n for n in ("n0", "n1", "n2") if servers[n] is not leader)
        await _change(servers, Remove(gone))
        await servers.pop(gone).stop()
        leader = await _leader(servers)
        ((index, _),) = await leader.append([b"after the changes"])
        await _until(
            lambda: all(s.committed_index >= index for s in servers.values()), 15, "replicated"
        )
        # every node restarts with its old --peers; the log's configuration rules
        for n, s in list(servers.items()):
            await s.stop()
            servers[n] = DLedgerServer(replace(s.config))
        for s in servers.values():
            await s.start()
        leader = await _leader(servers)
        want = sorted(set(addr) - {gone})
        assert sorted(leader.members["members"]) == want
        ((index, _),) = await leader.append([b"after the restart"])
        assert leader.get(index).body == b"after the restart"
    finally:
        for s in servers.values():
            await s.stop()


async def test_a_learner_follows_a_leader_added_after_it_joined(tmp_path: Path) -> None:
    """n3 is added while it is down, with ``--peers`` of that moment; n4 joins after it,
    becomes a voter and takes leadership. n3, started then, has never heard of n4: it
    follows it all the same (the leader's frames say where it is) and catches up."""
    ports = free_ports(5)
    addr = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    three = {k: addr[k] for k in ("n0", "n1", "n2")}
    servers = {n: DLedgerServer(_config(tmp_path, n, three)) for n in three}
    for s in servers.values():
        await s.start()
    late: DLedgerServer | None = None
    try:
        await _change(servers, AddLearner("n3", addr["n3"]))  # n3 not started yet
        n4 = DLedgerServer(
            _config(
                tmp_path,
                "n4",
                {**three, "n3": addr["n3"], "n4": addr["n4"]},
                learners=frozenset({"n3", "n4"}),
            )
        )
        await n4.start()
        servers["n4"] = n4
        await _change(servers, AddLearner("n4", addr["n4"]))
        await _change(servers, Promote("n4"))
        leader = await _leader(servers)
        done = await leader.transfer_leadership("n4", timeout_s=10)
        assert done.code is DLedgerCode.SUCCESS, done
        await _until(lambda: n4.role is Role.LEADER, 15, "n4 leads")
        ((index, _),) = await n4.append([b"from n4"])
        # n3 as it was added: --peers naming n0..n2 and itself, no n4
        late = DLedgerServer(
            _config(tmp_path, "n3", {**three, "n3": addr["n3"]}, learners=frozenset({"n3"}))
        )
        await late.start()
        await _until(lambda: late.committed_index >= index, 20, "n3 caught up from n4")
        assert late.get(index).body == b"from n4"
        assert late.status()["leader_id"] == "n4"
    finally:
        if late is not None:
            await late.stop()
        for s in servers.values():
            await s.stop()
