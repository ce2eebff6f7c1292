"""The Raft port without a peer secret, against a stranger who can reach it (issue 17, "The
Raft port"). Before: one VOTE frame with term 2**63 - 1 moved every node there, where the
next election's term + 1 did not encode and every node's ready loop died (for good: the
term was saved); and one raw AppendRequest put a record with a wrong queue offset into
every replica's log, stopping dispatch everywhere.

Now: the wire refuses terms and indexes out of bounds, the core drops a term jump no live
group makes, a frame must come from a member (of the group, addressed to us, from that
member's host, one member per connection), a broker node serves no client append or
read, and a node that listens beyond loopback without a secret says so at start.
In-process ``DLedgerServer`` groups on 127.0.0.1, real sockets and files; bounded waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

import pytest

from broker.settings import BrokerSettings
from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import MAX_TERM, GetRequest, VoteRequest
from dledger.core.settings import CoreSettings
from dledger.runtime.client import DLedgerClient
from dledger.runtime.server import DLedgerServer, ServerConfig
from dledger.runtime.transport import TransportSettings
from dledger.runtime.wire import encode
from ledgermq.processes import free_ports
from tests.waiting import until as _until

from .test_peer_secret import STORE, _addr, _group, _max_term, _until_closed, _wait_leader


def _vote(term: int, *, sender: str = "n1", to: str = "n0", group: str = "g0") -> bytes:
    return encode(
        VoteRequest(
            group=group,
            local_id=sender,
            remote_id=to,
            term=term,
            req_id=1,
            leader_id=sender,
            ledger_end_index=10**6,
            ledger_end_term=min(term, MAX_TERM),
        )
    )


async def _send_raw(server: DLedgerServer, *frames: bytes) -> bytes:
    """Send ``frames`` on one fresh connection; what came back before it closed (or
    after 2 s of silence)."""
    reader, writer = await asyncio.open_connection(*_addr(server))
    try:
        for f in frames:
            writer.write(f)
        await writer.drain()
        try:
            return await _until_closed(reader, timeout_s=2.0)
        except TimeoutError:
            return b"<open>"
    finally:
        writer.close()


async def _commit_one(servers: dict[str, DLedgerServer]) -> None:
    lead = await _wait_leader(servers)
    [(index, _pos)] = await asyncio.wait_for(lead.append([b"still alive"]), 20)
    await _until(lambda: all(s.committed_index >= index for s in servers.values()))


@pytest.mark.asyncio
async def test_a_term_that_cannot_be_incremented_is_refused_and_the_group_lives_on(
    tmp_path: Path,
) -> None:
    async with _group(tmp_path, [None, None, None]) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.transport is not None
        assert await _send_raw(n0, _vote(2**63 - 1)) == b""  # closed at the bad frame
        assert n0.transport.bad_frames == 1
        assert all(_max_term(s) < 10**6 for s in servers.values())
        await _commit_one(servers)  # every ready loop still runs
        assert all(s.failed is None for s in servers.values())


@pytest.mark.asyncio
async def test_a_term_jump_no_live_group_makes_is_dropped(tmp_path: Path) -> None:
    async with _group(tmp_path, [None, None, None]) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        jump = n0.config.core.max_term_jump
        term = _max_term(n0) + jump + 1  # decodes (below MAX_TERM), but no group gets here
        assert await _send_raw(n0, _vote(term)) == b"<open>"  # a member's frame: kept open
        await _commit_one(servers)
        assert all(_max_term(s) < term for s in servers.values())


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (_vote(5, sender="mallory"), "not a member"),
        (_vote(5, sender="n0"), "not a member"),  # ourselves: no peer sends as us
        (_vote(5, group="other"), "group"),
        (_vote(5, to="n2"), "addressed to"),
        (_vote(5) + _vote(5, sender="n2"), "on the connection of"),
    ],
    ids=["stranger", "self", "other-group", "not-for-us", "two-members-one-connection"],
)
async def test_a_frame_not_from_a_member_closes_the_connection(
    tmp_path: Path, frame: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _group(tmp_path, [None, None, None]) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.transport is not None
        terms = {n: _max_term(s) for n, s in servers.items()}
        with caplog.at_level(logging.WARNING, "dledger.runtime.transport"):
            assert await _send_raw(n0, frame) == b""
        assert n0.transport.stranger_frames == 1
        assert why in caplog.text
        assert n0.status()["refused"]["stranger_frames"] == 1
        if why != "on the connection of":  # the first (good) vote of that one counts
            assert {n: _max_term(s) for n, s in servers.items()} == terms


@pytest.mark.asyncio
async def test_a_member_frame_from_another_host_is_refused(tmp_path: Path) -> None:
    """n1's configured host is 192.0.2.1 (TEST-NET-1, never routed): a frame as n1 from
    127.0.0.1 is a stranger's. With the check off (NAT between members) it is taken."""
    port = free_ports(1)[0]
    peers = {"n0": f"127.0.0.1:{port}", "n1": "192.0.2.1:9", "n2": "192.0.2.2:9"}
    for check in (True, False):
        cfg = ServerConfig(
            group="g0",
            self_id="n0",
            peers=peers,
            data_dir=tmp_path / str(check),
            store=STORE,
            transport=TransportSettings(check_peer_address=check, connect_timeout_ms=100),
            seed=1,
        )
        async with DLedgerServer(cfg) as n0:
            assert n0.transport is not None
            got = await _send_raw(n0, _vote(1000))
            if check:
                assert got == b"" and n0.transport.stranger_frames == 1
                assert _max_term(n0) < 1000
            else:
                assert n0.transport.stranger_frames == 0
                await _until(lambda n=n0: _max_term(n) >= 1000, what="the vote taken")


@pytest.mark.asyncio
async def test_a_broker_node_serves_no_client_appends_or_reads(tmp_path: Path) -> None:
    """The broker's log is written only through the broker: a raw AppendRequest (a record
    with any queue offset) and a GetRequest (reads past the HTTP tokens) get UNSUPPORTED
    and change nothing; status still answers."""
    port = free_ports(1)[0]
    cfg = BrokerSettings(
        node_id="n0", peers=f"n0-127.0.0.1:{port}", data_dir=tmp_path, store=STORE
    ).server_config()
    async with DLedgerServer(cfg) as server:
        await _until(lambda: server.committed_index >= 0, what="the single node's NOOP")
        end = server.store.ledger_end_index if server.store else -2
        async with DLedgerClient({"n0": f"127.0.0.1:{port}"}, "g0") as client:
            with pytest.raises(DLedgerError) as refused:
                await client.append([b"forged record"], timeout_s=10)
            assert refused.value.code is DLedgerCode.UNSUPPORTED
            with pytest.raises(DLedgerError) as refused:
                await client.get("n0", 0, timeout_s=10)
            assert refused.value.code is DLedgerCode.UNSUPPORTED
            status = await client.status("n0", timeout_s=10)
            assert status["role"] == "LEADER"
        assert server.store is not None and server.store.ledger_end_index == end
        assert server.status()["refused"]["client_requests"] == 2


def test_a_node_beyond_loopback_without_a_secret_warns_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def config(host: str, secret: bytes | None) -> ServerConfig:
        return ServerConfig(
            group="g0",
            self_id="n0",
            peers={"n0": f"{host}:9080"},
            data_dir=tmp_path,
            transport=TransportSettings(peer_secret=secret),
            core=dataclasses.replace(CoreSettings()),
        )

    for host, secret, warns in [
        ("10.0.0.5", None, True),
        ("broker0", None, True),
        ("10.0.0.5", b"s3cret", False),
        ("127.0.0.1", None, False),
        ("localhost", None, False),
        ("[::1]", None, False),
    ]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, "dledger.runtime.server"):
            DLedgerServer(config(host, secret))._warn_if_exposed()
        assert ("without a peer secret" in caplog.text) is warns, (host, secret)


# ---- inbound limits: count, bytes, time ---------------------------------------------------


async def _closed_by_node(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> bool:
    """Whether the node closes this connection within ``timeout_s`` (bounded)."""
    try:
        await _until_closed(reader, timeout_s=timeout_s)
    except TimeoutError:
        return False
    return True


@pytest.mark.asyncio
async def test_strangers_holding_sockets_cannot_lock_the_members_out(tmp_path: Path) -> None:
    """At max_inbound_connections a new connection takes the place of the longest-idle
    one that is not a member's: twenty idle sockets later the group still commits."""
    async with _group(tmp_path, [None, None, None], max_inbound_connections=4) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.transport is not None
        conns = [await asyncio.open_connection(*_addr(n0)) for _ in range(20)]
        try:
            closed = [await _closed_by_node(r, 0.5) for r, _ in conns[:-2]]
            assert sum(closed) >= 16  # the early ones were evicted
            assert n0.transport.limited >= 16
            await _commit_one(servers)  # the members' links were never the victims
        finally:
            for _, w in conns:
                w.close()


@pytest.mark.asyncio
async def test_a_frame_begun_and_not_finished_is_closed_in_time(tmp_path: Path) -> None:
    async with _group(tmp_path, [None, None, None], partial_frame_timeout_ms=300) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.transport is not None
        reader, writer = await asyncio.open_connection(*_addr(n0))
        try:
            writer.write((1 << 20).to_bytes(4, "big") + b"\x00" * 100)  # 1 MiB announced
            await writer.drain()
            assert await _closed_by_node(reader, 10.0)
            assert n0.transport.limited == 1
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_partial_frames_together_stay_within_the_byte_budget(tmp_path: Path) -> None:
    async with _group(tmp_path, [None, None, None], max_inbound_buffer_bytes=2 << 20) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.transport is not None
        conns = [await asyncio.open_connection(*_addr(n0)) for _ in range(4)]
        try:
            for _, w in conns:  # each announces 8 MiB and sends 900 KiB of it
                w.write((8 << 20).to_bytes(4, "big") + b"\x01" * (900 << 10))
                with contextlib.suppress(ConnectionError):
                    await w.drain()
            await _until(lambda: n0.transport is not None and n0.transport.limited >= 2)
            assert sum(n0.transport._buffered.values()) <= 2 << 20
            await _commit_one(servers)
        finally:
            for _, w in conns:
                w.close()


@pytest.mark.asyncio
async def test_an_idle_client_is_closed_and_comes_back(tmp_path: Path) -> None:
    async with _group(tmp_path, [None, None, None], client_idle_timeout_ms=300) as servers:
        lead = await _wait_leader(servers)
        peers = {n: s.config.peers[n] for n, s in servers.items()}
        async with DLedgerClient(peers, "g0") as client:
            node = lead.config.self_id
            assert (await client.status(node, timeout_s=10))["role"] == "LEADER"
            conn = client._conns[node]
            await _until(lambda: conn.closed, what="the idle client closed")
            assert (await client.status(node, timeout_s=10))["role"] == "LEADER"  # reconnects
        assert lead.transport is not None and lead.transport.limited >= 1


@pytest.mark.asyncio
async def test_a_client_that_does_not_read_its_answers_is_closed(tmp_path: Path) -> None:
    async with _group(tmp_path, [None, None, None], client_write_timeout_ms=300) as servers:
        lead = await _wait_leader(servers)
        for _ in range(8):  # ~4 MiB of entries to read back
            await asyncio.wait_for(lead.append([b"x" * 60_000] * 8), 20)
        _reader, writer = await asyncio.open_connection(*_addr(lead))
        try:
            for i in range(200):  # never read: the answers pile up in our receive window
                writer.write(
                    encode(GetRequest(group="g0", local_id="c", remote_id=lead.config.self_id,
                                      term=-1, req_id=i, index=0, max_count=64))
                )  # fmt: skip
            await writer.drain()
            assert lead.transport is not None
            await _until(lambda: lead.transport.limited >= 1, what="the writer gave up")
        finally:
            writer.close()
