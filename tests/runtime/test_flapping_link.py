"""Issue 18: a flapping link between one follower and a healthy leader under load changes
no leader. Three ``DLedgerServer``\\ s on 127.0.0.1 (the real runtime: transport, node
loop, files); every link between two nodes runs through a TCP forwarder of this test,
and the two forwarders between the leader and one follower reset their connections
again and again while the leader takes appends. The follower sees each reset as its
leader's connection closing: it pre-votes early once in the term, the other follower
(which hears the leader) refuses, and nothing else happens.

The election timeout is long here (15 missed heartbeats, 3 s): a machine slow enough to
starve the event loop past the default 600 ms would otherwise cause a real election,
which is not what this test is about. Only the early pre-vote can act within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from dledger.core.messages import Role
from dledger.core.settings import CoreSettings
from dledger.runtime.server import DLedgerServer, ServerConfig
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until

pytestmark = pytest.mark.asyncio

FLAPS = 25
IDS = ("n0", "n1", "n2")
SETTINGS = CoreSettings(max_heartbeat_leak=15)


class Forwarder:
    """A TCP forwarder from an ephemeral port on 127.0.0.1 to ``target_port``;
    ``flap()`` resets every connection through it (both sides see a reset); while
    ``down`` it resets new ones at once (a connect is refused, as by a dead peer)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.down = False

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        self.flap()

    def flap(self) -> None:
        for a, b in list(self.pairs):
            a.transport.abort()
            b.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            t_reader, t_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, t_writer)
        self.pairs.add(pair)
        try:
            await asyncio.gather(
                self._pipe(reader, t_writer), self._pipe(t_reader, writer), return_exceptions=True
            )
        finally:
            self.pairs.discard(pair)
            writer.transport.abort()
            t_writer.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()


async def _load(leader: DLedgerServer, stop: asyncio.Event, acked: list[int]) -> None:
    """Appends back to back until ``stop``; every one must succeed (no leader change)."""
    while not stop.is_set():
        result = await leader.append([b"m" * 512] * 20)
        acked.append(result[-1][0])


async def test_a_flapping_link_to_a_healthy_leader_under_load_changes_no_leader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dledger.runtime.server")
    ports = dict(zip(IDS, free_ports(len(IDS)), strict=True))
    links = {(a, b): Forwarder(ports[b]) for a in IDS for b in IDS if a != b}
    servers: dict[str, DLedgerServer] = {}
    stop = asyncio.Event()
    loads: list[asyncio.Task[None]] = []
    try:
        for fw in links.values():
            await fw.start()
        for i in IDS:
            peers = {p: f"127.0.0.1:{ports[i] if p == i else links[(i, p)].port}" for p in IDS}
            cfg = ServerConfig(
                group="g0",
                self_id=i,
                peers=peers,
                data_dir=tmp_path,
                core=SETTINGS,
                store=StoreSettings(data_file_size=8 << 20, index_file_size=256 * 1024),
                seed=IDS.index(i),
            )
            servers[i] = DLedgerServer(cfg)
            await servers[i].start()

        def one_leader() -> str | None:
            leads = [i for i, s in servers.items() if s.role is Role.LEADER]
            return leads[0] if len(leads) == 1 else None

        lead = await until(one_leader, what="a leader")
        await until(lambda: all(s.leader_id == lead for s in servers.values()), what="followers")
        term = servers[lead].status()["term"]
        f = next(i for i in IDS if i != lead)
        elector = servers[f].core.elector  # type: ignore[union-attr]

        def early_pre_votes() -> list[str]:
            return [r.getMessage() for r in caplog.records if "early_pre_vote" in r.getMessage()]

        # The first reset keeps the link down until the follower's early pre-vote is
        # over: the other follower, which hears the leader, refuses it (granted: 1).
        # Before the load, so that the logs are equal and only that refuses it (under
        # load the follower's log would be behind, which refuses it too).
        await until(
            lambda: len({s.status()["ledger_end_index"] for s in servers.values()}) == 1,
            what="equal logs",
        )
        links[(lead, f)].down = links[(f, lead)].down = True
        links[(lead, f)].flap()
        links[(f, lead)].flap()
        await until(early_pre_votes, what="the follower's early pre-vote")
        assert "'granted': 1" in early_pre_votes()[0]
        links[(lead, f)].down = links[(f, lead)].down = False
        acked: list[int] = []
        loads = [asyncio.create_task(_load(servers[lead], stop, acked)) for _ in range(4)]
        for _ in range(FLAPS):
            heard, done = elector.last_leader_heartbeat_ms, len(acked)
            links[(lead, f)].flap()
            links[(f, lead)].flap()
            # the follower hears its leader again over a new connection, and the load
            # goes on, before the next reset
            await until(lambda: elector.last_leader_heartbeat_ms > heard, what="heard again")  # noqa: B023
            await until(lambda: len(acked) > done + 4, what="appends go on")  # noqa: B023
        stop.set()
        await asyncio.gather(*loads)  # an append that failed raises here
        assert one_leader() == lead
        assert {s.status()["term"] for s in servers.values()} == {term}
        assert servers[f].role is Role.FOLLOWER and servers[f].leader_id == lead
        # one early pre-vote in the term, however often the link reset
        assert elector.early_pre_vote_spent == (term, lead)
        assert len(early_pre_votes()) == 1
    finally:
        stop.set()
        for t in loads:
            t.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        for s in servers.values():
            with contextlib.suppress(Exception):
                await s.stop()
        for fw in links.values():
            if fw.server is not None:
                await fw.close()
