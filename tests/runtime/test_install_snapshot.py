"""INSTALL_SNAPSHOT over TCP: three in-process ``DLedgerServer``s on 127.0.0.1 with real
files. A follower stopped while the leader rolls segments, snapshots and deletes its log
head catches up through the application's snapshot, and its data files from its new
begin position on are byte-identical to the leader's (docs/formats.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.core.messages import Role
from dledger.runtime.server import DLedgerServer, ServerConfig
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until as _until

pytestmark = pytest.mark.asyncio

SEGMENT = 4096
STORE = StoreSettings(data_file_size=SEGMENT, index_file_size=32 * 64, clean_interval_ms=3_600_000)


def _configs(tmp_path: Path) -> dict[str, ServerConfig]:
    ports = free_ports(3)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    return {
        n: ServerConfig(group="g0", self_id=n, peers=peers, data_dir=tmp_path, store=STORE, seed=i)
        for i, n in enumerate(peers)
    }


def _leader(servers: dict[str, DLedgerServer]) -> DLedgerServer | None:
    leads = [s for s in servers.values() if s.core is not None and s.role is Role.LEADER]
    return leads[0] if len(leads) == 1 else None


def _data_from(server: DLedgerServer, pos: int, end: int) -> bytes:
    """The bytes of the data files at positions [pos, end)."""
    assert server.store is not None
    out = bytearray()
    for f in server.store.data_files():
        start = int(f.name)
        raw = f.read_bytes()
        lo, hi = max(pos - start, 0), min(end - start, len(raw))
        if lo < hi:
            assert start + lo == pos + len(out), "segments are contiguous"
            out += raw[lo:hi]
    return bytes(out)


@pytest.mark.parametrize("kind", ["coroutine", "thread", "failing"])
async def test_a_follower_behind_the_log_head_catches_up_through_a_snapshot(
    tmp_path: Path, kind: str
) -> None:
    cfgs = _configs(tmp_path)
    servers = {n: DLedgerServer(c) for n, c in cfgs.items()}
    for s in servers.values():
        await s.start()
    try:
        await _until(lambda: _leader(servers) is not None)
        lead = _leader(servers)
        assert lead is not None
        await lead.append([b"before-%d" % i for i in range(3)])
        lag_id = next(n for n in servers if servers[n] is not lead)
        lagging = servers[lag_id]
        await _until(lambda: lagging.committed_index == lead.committed_index)
        await lagging.stop()
        assert lagging.store is not None
        lag_end = lagging.store.ledger_end_index

        for k in range(20):  # ~ 11 segments of 4 KiB while it is down
            await lead.append([bytes([65 + k % 26]) * 200 for _ in range(10)])
        assert lead.store is not None and len(lead.store.data_files()) >= 8
        # Both live nodes snapshot and drop their log heads: on a loaded machine the
        # other one may win an election meanwhile, and a leader that kept its head
        # would catch the follower up without a snapshot (CI saw it).
        last = lead.committed_index
        live = [s for n, s in servers.items() if n != lag_id]
        await _until(lambda: all(s.committed_index >= last for s in live))
        state = b"app state after %d" % last
        for s in live:
            snap = s.set_snapshot(last, state)
            assert s.store is not None
            s.store.set_retention_floor(snap.next_pos)
            assert s.store.clean(force=True) > 0
            head = s.store.ledger_begin_index
            assert head > lag_end + 1, "the follower's next entry is gone from the leader"
            assert head - 1 <= snap.last_index

        installed: list[tuple[int, bytes]] = []

        async def on_loop(last_index: int, data: bytes) -> None:
            await asyncio.sleep(0)  # runs on the event loop, awaited before the answer
            installed.append((last_index, data))

        def in_thread(last_index: int, data: bytes) -> None:
            assert restarted.store is not None
            assert restarted.store.ledger_begin_index == 0  # the log is reset after this
            installed.append((last_index, data))

        def failing(last_index: int, data: bytes) -> None:
            raise OSError("disk on fire")

        restarted = DLedgerServer(cfgs[lag_id])
        restarted.set_snapshot_installer(
            {"coroutine": on_loop, "thread": in_thread, "failing": failing}[kind]
        )
        servers[lag_id] = restarted
        await restarted.start()
        if kind == "failing":  # the node stops: no answer, no reset, the leader retries
            await _until(lambda: restarted.failed is not None)
            assert restarted.store is not None and restarted.store.ledger_begin_index == 0
            assert "disk on fire" in restarted.status()["failed"]
            await _until(lambda: _leader(servers) is not None)
            lead = _leader(servers)
            assert lead is not None
            assert lead.status()["peers"][lag_id]["state"] == "INSTALL_SNAPSHOT"
            return
        await _until(lambda: restarted.committed_index >= snap.last_index)
        assert installed == [(snap.last_index, state)]
        assert restarted.store is not None
        assert restarted.store.ledger_begin_index == snap.last_index + 1
        # The install runs in a thread and the store's reset moves the commit index
        # there; the loop counts the install once the thread has returned.
        await _until(lambda: restarted.status()["stats"]["snapshot_installs"] == 1)
        await _until(lambda: _leader(servers) is not None)
        lead = _leader(servers)
        assert lead is not None and lead.store is not None
        await _until(lambda: lead.status()["peers"][lag_id]["state"] == "APPEND")
        assert sum(s.status()["snapshots_sent"] for s in live) >= 1  # whoever led then

        (last, _), *_ = reversed(await lead.append([b"after-1", b"after-2"]))
        await _until(lambda: restarted.committed_index >= last)
        assert restarted.get(last).body == b"after-2"
        begin_pos = restarted.store.ledger_begin_pos
        assert begin_pos == snap.next_pos
        end_pos = lead.store.ledger_end_pos
        assert restarted.store.ledger_end_pos == end_pos
        mine, theirs = (
            _data_from(restarted, begin_pos, end_pos),
            _data_from(lead, begin_pos, end_pos),
        )
        assert len(mine) == end_pos - begin_pos > 0
        assert mine == theirs
    finally:
        for s in servers.values():
            await s.stop()
