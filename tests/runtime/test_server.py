"""``DLedgerServer`` in process: a single-node group on 127.0.0.1 (real sockets, real
files). The public surface of docs/architecture.md, and bad bytes on the wire."""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode
from dledger.core.messages import Role
from dledger.core.node import RoleChange
from dledger.runtime.client import DLedgerClient
from dledger.runtime.server import DLedgerServer, NotLeaderError, ServerConfig
from dledger.store import BODY_OFFSET, EntryMeta, StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until as _until

pytestmark = pytest.mark.asyncio


def _config(tmp_path: Path) -> ServerConfig:
    port = free_ports(1)[0]
    return ServerConfig(
        group="g0",
        self_id="n0",
        peers={"n0": f"127.0.0.1:{port}"},
        data_dir=tmp_path,
        store=StoreSettings(data_file_size=1 << 20, index_file_size=32 * 1024),
        seed=1,
    )


async def test_single_node_server_appends_reads_and_notifies(tmp_path: Path) -> None:
    server = DLedgerServer(_config(tmp_path))
    changes: list[RoleChange] = []
    hooked: list[int] = []

    def hook(meta: EntryMeta, buf: memoryview, body_offset: int) -> None:
        if body_offset < len(buf):  # the NOOP has no body
            hooked.append(meta.pos)
            buf[body_offset : body_offset + 8] = struct.pack(">q", meta.pos + BODY_OFFSET)

    server.add_role_change_handler(changes.append)
    server.add_append_hook(hook)
    async with server:
        await _until(lambda: server.role is Role.LEADER)
        result = await server.append([b"x" * 16, b"y" * 16])
        (i1, p1), (i2, p2) = result
        assert i2 == i1 + 1 and p2 > p1
        assert server.committed_index >= i2
        assert await server.wait_committed(i2, 1.0)
        assert not await server.wait_committed(i2 + 100, 0.05)
        e = server.get(i1)
        assert struct.unpack(">q", e.body[:8])[0] == p1 + BODY_OFFSET  # the hook's rewrite
        assert server.read(p1 + BODY_OFFSET + 8, 8) == b"x" * 8
        assert hooked == [p1, p2]
        assert changes and changes[-1].role is Role.LEADER
        assert server.status()["committed_index"] == server.committed_index


async def test_garbage_frame_closes_only_that_connection(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    async with DLedgerServer(cfg) as server:
        await _until(lambda: server.role is Role.LEADER)
        host, port = cfg.peers["n0"].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(struct.pack(">Ii", 5, 12345) + b"\x00")  # unknown request code
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the node
        writer.close()
        async with DLedgerClient(cfg.peers, "g0") as client:
            resp = await client.append([b"still fine"])
            assert resp.code is DLedgerCode.SUCCESS
            entries = await client.get("n0", resp.first_index)
            assert entries[0].body == b"still fine"
        assert server.transport is not None and server.transport.bad_frames == 1


async def test_append_on_a_non_leader_names_no_leader(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    peers = {**cfg.peers, "n1": f"127.0.0.1:{free_ports(1)[0]}"}  # n1 never starts
    cfg = ServerConfig(
        group="g0", self_id="n0", peers=peers, data_dir=tmp_path, store=cfg.store, seed=1
    )
    async with DLedgerServer(cfg) as server:
        with pytest.raises(NotLeaderError) as err:
            await server.append([b"nope"])
        assert err.value.code is DLedgerCode.NOT_LEADER
        assert err.value.leader_id is None


async def test_a_stalled_loop_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On the application's loop (``own_thread=False``, the default), something that
    holds the loop (here a blocking sleep of 250 ms) delays the node's beat: the tick
    after it counts a loop stall and logs ``loop_stall`` with how late it came, which is
    what explains a leader's step-down under load."""
    async with DLedgerServer(replace(_config(tmp_path), own_thread=False)) as server:
        await _until(lambda: server.stats["readies"] > 0, 10, "the node runs")
        before = server.stats["loop_stalls"]
        time.sleep(0.25)  # the stall under test
        await _until(lambda: server.stats["loop_stalls"] > before, 10, "the stall counted")
        assert server.stats["max_tick_late_ms"] >= 200
        assert any("loop_stall" in r.getMessage() for r in caplog.records)


async def test_on_its_own_thread_a_held_application_loop_costs_no_election(
    tmp_path: Path,
) -> None:
    """With ``own_thread`` (the broker's default) three nodes whose application loop
    (here one loop for all three) is held for 1.5 s, over twice the election timeout:
    their node loops beat on time (no loop stall counted), the leader's heartbeats keep
    coming, so nobody campaigns (the term stays), and an append afterwards commits."""
    ports = free_ports(3)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    servers = [
        DLedgerServer(
            replace(_config(tmp_path / n), self_id=n, peers=peers, seed=i, own_thread=True)
        )
        for i, n in enumerate(peers)
    ]
    for s in servers:
        await s.start()
    try:
        await _until(lambda: sum(s.role is Role.LEADER for s in servers) == 1, 10, "one leader")
        leader = next(s for s in servers if s.role is Role.LEADER)
        await leader.append([b"settled"])
        terms = [s.status()["term"] for s in servers]
        stalls = [s.stats["loop_stalls"] for s in servers]
        time.sleep(1.5)  # the hold under test: every home loop at once
        assert [s.status()["term"] for s in servers] == terms
        assert [s.stats["loop_stalls"] for s in servers] == stalls
        ((index, _pos),) = await leader.append([b"after"])
        assert leader.get(index).body == b"after"
    finally:
        for s in servers:
            await s.stop()
