"""``--peer-secret`` (docs/operations.md): Raft connections start with a mutual HMAC
challenge, and a connection that fails it is closed before any frame is read.

The handshake itself in memory (``peer_auth``), then in-process ``DLedgerServer`` groups
on 127.0.0.1 (real sockets, real files): a group with one secret works; an outsider with
a wrong or no secret gets nothing and changes nothing; raw sockets that skip, garble,
stall or reflect the handshake are closed while the node keeps serving; the client; the
command line. A local cluster of processes with a secret is
``tests/process/test_peer_secret.py``. Every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import Role, VoteRequest
from dledger.runtime import cli
from dledger.runtime.client import DLedgerClient
from dledger.runtime.peer_auth import (
    CLIENT_PROOF_BYTES,
    HELLO_BYTES,
    MAGIC,
    NONCE_BYTES,
    SERVER_PROOF_BYTES,
    ClientHandshake,
    PeerAuthError,
    ServerHandshake,
    client_mac,
    load_peer_secret,
    server_mac,
)
from dledger.runtime.server import DLedgerServer, ServerConfig
from dledger.runtime.transport import PeerLink, TransportSettings, authenticate_to
from dledger.runtime.wire import encode
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until as _until

SECRET = b"correct horse battery staple"
OTHER = b"incorrect horse"
AUTH_MS = 300  # short, so that stalls and silent peers fail fast
STORE = StoreSettings(data_file_size=1 << 20, index_file_size=32 * 1024)
HUGE_TERM = 10**6  # within CoreSettings.max_term_jump, so the control shows it moving


def _settings(secret: bytes | None, **kw: int) -> TransportSettings:
    return TransportSettings(peer_secret=secret, **({"auth_timeout_ms": AUTH_MS} | kw))


@asynccontextmanager
async def _group(
    tmp_path: Path, secrets: list[bytes | None], **transport: int
) -> AsyncIterator[dict[str, DLedgerServer]]:
    """Nodes n0.. of one group, node ``i`` with ``secrets[i]``, started and stopped."""
    ports = free_ports(len(secrets))
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    servers = {
        n: DLedgerServer(
            ServerConfig(
                group="g0",
                self_id=n,
                peers=peers,
                data_dir=tmp_path,
                store=STORE,
                transport=_settings(secret, **transport),
                seed=i,
            )
        )
        for i, (n, secret) in enumerate(zip(peers, secrets, strict=True))
    }
    started: list[DLedgerServer] = []
    try:
        for s in servers.values():
            await s.start()
            started.append(s)
        yield servers
    finally:
        for s in started:
            await s.stop()


def _leader(servers: dict[str, DLedgerServer]) -> DLedgerServer | None:
    leads = [s for s in servers.values() if s.core is not None and s.role is Role.LEADER]
    return leads[0] if len(leads) == 1 else None


async def _wait_leader(servers: dict[str, DLedgerServer]) -> DLedgerServer:
    await _until(lambda: _leader(servers) is not None, what="one leader")
    lead = _leader(servers)
    assert lead is not None
    return lead


def _addr(server: DLedgerServer) -> tuple[str, int]:
    host, port = server.config.peers[server.config.self_id].split(":")
    return host, int(port)


def _max_term(server: DLedgerServer) -> int:
    """The highest term the node knows of: its own, or one it will campaign in."""
    assert server.core is not None
    return max(server.core.member_state.curr_term, server.core.member_state.known_max_term)


def _refused(server: DLedgerServer) -> int:
    assert server.transport is not None
    return server.transport.auth_failures


async def _hello(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        return await reader.readexactly(HELLO_BYTES)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close our end and wait until the transport is gone: a transport left to the
    garbage collector warns (ResourceWarning) in whichever test runs next."""
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


async def _until_closed(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> bytes:
    """Everything the node sends until it closes the connection (a reset, which closing
    with unread bytes may cause, counts as closed); bounded."""
    out = bytearray()
    async with asyncio.timeout(timeout_s):
        try:
            while chunk := await reader.read(4096):
                out += chunk
        except ConnectionResetError:
            pass
    return bytes(out)


def _vote_from_n1(term: int) -> bytes:
    """A well-formed VOTE frame from peer n1 to n0 with ``term``: a node that reads it
    adopts the term as the one it campaigns for next (``known_max_term``)."""
    return encode(
        VoteRequest(
            group="g0",
            local_id="n1",
            remote_id="n0",
            term=term,
            req_id=1,
            leader_id="n1",
            ledger_end_index=10**6,
            ledger_end_term=term,
        )
    )


# ---- the handshake in memory ------------------------------------------------------------


def test_the_handshake_completes_with_one_secret_on_both_sides() -> None:
    server, client = ServerHandshake(SECRET, "n0"), ClientHandshake(SECRET, "n0")
    hello = server.hello()
    assert len(hello) == HELLO_BYTES and hello.startswith(MAGIC)
    proof = client.answer(hello)
    assert len(proof) == CLIENT_PROOF_BYTES
    answer = server.check_client_proof(proof)
    assert len(answer) == SERVER_PROOF_BYTES
    client.check_server_proof(answer)  # no exception: both sides know the other has it


def test_a_wrong_secret_fails_on_whichever_side_checks_it() -> None:
    server = ServerHandshake(SECRET, "n0")
    with pytest.raises(PeerAuthError, match="client proof does not verify"):
        server.check_client_proof(ClientHandshake(OTHER, "n0").answer(server.hello()))
    # An impostor server: it cannot make a proof for the client's nonce.
    client = ClientHandshake(SECRET, "n0")
    impostor = ServerHandshake(OTHER, "n0")
    proof = client.answer(impostor.hello())
    with pytest.raises(PeerAuthError, match="server proof does not verify"):
        client.check_server_proof(server_mac(OTHER, "n0", impostor.nonce, proof[8:40]))


def test_a_proof_for_one_node_does_not_open_another() -> None:
    server = ServerHandshake(SECRET, "n0")
    with pytest.raises(PeerAuthError):
        server.check_client_proof(ClientHandshake(SECRET, "n1").answer(server.hello()))


def test_the_two_directions_never_share_a_mac() -> None:
    """Domain separation: with the same nonces, in either order, the client's and the
    server's MACs differ, so neither can stand in for the other (reflection)."""
    a, b = os.urandom(NONCE_BYTES), os.urandom(NONCE_BYTES)
    client_side = {client_mac(SECRET, "n0", a, b), client_mac(SECRET, "n0", b, a)}
    server_side = {server_mac(SECRET, "n0", a, b), server_mac(SECRET, "n0", b, a)}
    assert not client_side & server_side
    client = ClientHandshake(SECRET, "n0")
    own = client.answer(ServerHandshake(SECRET, "n0").hello())[-32:]
    with pytest.raises(PeerAuthError):
        client.check_server_proof(own)  # its own MAC handed back


def test_wrong_magic_and_wrong_sizes_are_refused() -> None:
    server = ServerHandshake(SECRET, "n0")
    with pytest.raises(PeerAuthError, match="no handshake"):
        server.check_client_proof(b"X" * CLIENT_PROOF_BYTES)
    with pytest.raises(PeerAuthError, match="bytes"):
        server.check_client_proof(MAGIC)
    with pytest.raises(PeerAuthError, match="no handshake"):
        ClientHandshake(SECRET, "n0").answer(b"Y" * HELLO_BYTES)
    # A release of another Raft protocol: said as such, not taken for a missing secret.
    other = MAGIC[:-1] + bytes([MAGIC[-1] + 1])
    with pytest.raises(PeerAuthError, match=f"version {MAGIC[-1] + 1}, this node {MAGIC[-1]}"):
        ClientHandshake(SECRET, "n0").answer(other + b"N" * NONCE_BYTES)


def test_settings_refuse_an_empty_secret_and_do_not_print_it() -> None:
    with pytest.raises(ValueError, match="empty"):
        TransportSettings(peer_secret=b"")
    with pytest.raises(ValueError, match="empty"):
        DLedgerClient({"n0": "127.0.0.1:1"}, "g0", peer_secret=b"")
    assert SECRET.decode() not in repr(TransportSettings(peer_secret=SECRET))
    assert SECRET.decode() not in repr(ServerHandshake(SECRET, "n0"))


# ---- groups of in-process nodes ---------------------------------------------------------


@pytest.mark.asyncio
async def test_a_group_with_one_secret_elects_a_leader_and_commits(tmp_path: Path) -> None:
    async with _group(tmp_path, [SECRET] * 3) as servers:
        lead = await _wait_leader(servers)
        peers = {n: s.config.peers[n] for n, s in servers.items()}
        async with DLedgerClient(peers, "g0", peer_secret=SECRET) as client:
            r = await client.append([b"a", b"b", b"c"], timeout_s=20)
            assert r.code is DLedgerCode.SUCCESS
            end = r.first_index + 2
        await _until(lambda: all(s.committed_index >= end for s in servers.values()))
        assert [lead.get(i).body for i in range(r.first_index, end + 1)] == [b"a", b"b", b"c"]
        links = [link for s in servers.values() for link in s.transport.links.values()]  # type: ignore[union-attr]
        await _until(lambda: all(link.connected for link in links), what="all links up")
        for s in servers.values():
            assert s.transport is not None
            assert s.transport.auth_failures == 0
            assert all(link.auth_failures == 0 for link in s.transport.links.values())
            assert s.status()["refused"] == {
                "bad_frames": 0,
                "auth_failures": 0,
                "stranger_frames": 0,
                "client_requests": 0,
                "limited": 0,
            }


@pytest.mark.asyncio
@pytest.mark.parametrize("outsider_secret", [OTHER, None], ids=["wrong-secret", "no-secret"])
async def test_a_node_without_the_secret_cannot_join(
    tmp_path: Path, outsider_secret: bytes | None
) -> None:
    async with _group(tmp_path, [SECRET, SECRET, outsider_secret]) as servers:
        members = {n: servers[n] for n in ("n0", "n1")}
        outsider = servers["n2"]
        lead = await _wait_leader(members)
        peers = {n: s.config.peers[n] for n, s in members.items()}
        async with DLedgerClient(peers, "g0", peer_secret=SECRET) as client:
            for i in range(5):  # the majority still commits
                await client.append([b"x%d" % i], timeout_s=20)
        await _until(
            lambda: min(s.committed_index for s in members.values()) == lead.committed_index
        )
        # The outsider's connections to the members are refused at the door, counted...
        await _until(
            lambda: _refused(servers["n0"]) > 0 and _refused(servers["n1"]) > 0,
            what="members refuse the outsider",
        )
        for s in members.values():
            assert s.transport is not None
            link = s.transport.links["n2"]
            # ... and theirs to it never authenticate (wrong proof, or no hello at all).
            await _until(lambda link=link: link.auth_failures > 0, what="link to n2 fails")
            assert not link.connected
            assert s.status()["links"]["n2"]["auth_failures"] > 0
        assert outsider.store is not None
        assert outsider.store.ledger_end_index == -1  # not one entry, not even the NOOP
        assert outsider.role is not Role.LEADER
        assert outsider.transport is not None
        if outsider_secret is not None:
            assert not any(link.connected for link in outsider.transport.links.values())
            assert _refused(outsider) > 0  # it refuses the members in turn


@pytest.mark.asyncio
@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "control-no-secret"])
async def test_a_raw_frame_without_the_handshake_is_never_processed(
    tmp_path: Path, secret: bytes | None
) -> None:
    """A valid VOTE frame with a huge term, sent without the handshake: with a secret the
    connection is closed before the frame is read and no term moves; the control (the
    same bytes to a node without a secret) shows the frame would have moved the term."""
    async with _group(tmp_path, [secret, secret, secret]) as servers:
        await _wait_leader(servers)
        n0 = servers["n0"]
        assert n0.core is not None
        reader, writer = await asyncio.open_connection(*_addr(n0))
        try:
            if secret is not None:
                assert (await _hello(reader)).startswith(MAGIC)
            writer.write(_vote_from_n1(HUGE_TERM))
            await writer.drain()
            if secret is None:
                await _until(lambda: _max_term(n0) >= HUGE_TERM, what="the control's frame")
                return
            assert await _until_closed(reader) == b""  # nothing after the hello: closed
        finally:
            await _close(writer)
        assert _refused(n0) == 1
        assert all(_max_term(s) < HUGE_TERM for s in servers.values())
        assert n0.transport is not None and n0.transport.bad_frames == 0  # never decoded


async def _bad_client(
    server: DLedgerServer, send: bytes, *, half_close: bool = False
) -> tuple[bytes, float]:
    """Connect, take the hello, send ``send`` (maybe nothing), read until the node
    closes: (what came after the hello, seconds from the connect)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(*_addr(server))
    try:
        assert (await _hello(reader)).startswith(MAGIC)
        if send:
            writer.write(send)
            await writer.drain()
        if half_close:
            writer.write_eof()
        got = await _until_closed(reader)
    finally:
        await _close(writer)
    return got, time.monotonic() - started


@pytest.mark.asyncio
async def test_bad_or_slow_handshakes_are_cut_off_and_the_node_keeps_serving(
    tmp_path: Path,
) -> None:
    async with _group(tmp_path, [SECRET]) as servers:
        node = await _wait_leader(servers)
        cases = {
            "garbage": (os.urandom(CLIENT_PROOF_BYTES), False),
            "magic, then a bad MAC": (MAGIC + os.urandom(CLIENT_PROOF_BYTES - len(MAGIC)), False),
            "short, then closed": (MAGIC + b"\x00" * 5, True),
            "short, then silent": (MAGIC + b"\x00" * 5, False),
            "silent": (b"", False),
        }
        for i, (name, (send, half_close)) in enumerate(cases.items(), start=1):
            got, took_s = await _bad_client(node, send, half_close=half_close)
            assert got == b"", name  # no server proof, no answer: closed
            assert _refused(node) == i, name
            if name.endswith("silent"):  # cut off by the handshake timeout, not sooner
                assert AUTH_MS / 1000 * 0.8 <= took_s < AUTH_MS / 1000 + 5, (name, took_s)
        async with DLedgerClient(node.config.peers, "g0", peer_secret=SECRET) as client:
            r = await client.append([b"still serving"], timeout_s=10)
            assert r.code is DLedgerCode.SUCCESS
        assert _refused(node) == len(cases)
        assert node.transport is not None and node.transport.bad_frames == 0


@pytest.mark.asyncio
async def test_connections_in_the_handshake_are_bounded(tmp_path: Path) -> None:
    # A longer timeout than elsewhere: the two stalled connections must still be in the
    # handshake when the third arrives, even on a slow machine.
    async with _group(
        tmp_path, [SECRET], max_handshakes_in_flight=2, auth_timeout_ms=2000
    ) as servers:
        node = await _wait_leader(servers)
        stalled = [await asyncio.open_connection(*_addr(node)) for _ in range(2)]
        for r, _ in stalled:  # both are in the handshake once their hello arrived
            await _hello(r)
        reader, writer = await asyncio.open_connection(*_addr(node))
        assert await _until_closed(reader) == b""  # over the bound: closed without a hello
        await _close(writer)
        for r, w in stalled:
            assert await _until_closed(r) == b""  # the stalled ones time out in turn
            await _close(w)
        assert _refused(node) == 3
        async with DLedgerClient(node.config.peers, "g0", peer_secret=SECRET) as client:
            await client.append([b"after the flood"], timeout_s=10)


@pytest.mark.asyncio
async def test_a_proof_made_for_the_other_direction_or_node_is_refused(tmp_path: Path) -> None:
    """Even with the secret, a MAC under the server's label (what a node would send back)
    or for another node id does not open a connection."""
    async with _group(tmp_path, [SECRET]) as servers:
        node = await _wait_leader(servers)
        for make in (
            lambda ns, nc: server_mac(SECRET, "n0", ns, nc),  # reflected direction
            lambda ns, nc: client_mac(SECRET, "n1", ns, nc),  # another node
        ):
            reader, writer = await asyncio.open_connection(*_addr(node))
            try:
                hello = await _hello(reader)
                nc = os.urandom(NONCE_BYTES)
                writer.write(MAGIC + nc + make(hello[len(MAGIC) :], nc))
                assert await _until_closed(reader) == b""  # no server proof: closed
            finally:
                await _close(writer)
        assert _refused(node) == 2


@pytest.mark.asyncio
async def test_an_impostor_that_reflects_the_clients_mac_gets_no_raft_data() -> None:
    """A server without the secret hands the client its own MAC back as the server proof.
    The client (a peer link or the dledger client) refuses it and never sends a frame."""
    received: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(ServerHandshake(OTHER, "n1").hello())
        try:
            proof = await reader.readexactly(CLIENT_PROOF_BYTES)
            writer.write(proof[-32:])  # reflection
            async with asyncio.timeout(10):
                received.append(proof + await reader.read())  # all until the client closes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await _close(writer)

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(PeerAuthError, match="server proof does not verify"):
            await authenticate_to(reader, writer, secret=SECRET, node_id="n1", timeout_s=5)
        await _close(writer)

        link = PeerLink("n1", f"127.0.0.1:{port}", _settings(SECRET, reconnect_min_ms=1))
        link.start()
        for _ in range(10):
            link.send(_vote_message())
        try:
            await _until(lambda: link.auth_failures >= 2, what="the link refuses twice")
            assert not link.connected and link.sent == 0
        finally:
            await link.close()

        async with DLedgerClient({"n1": f"127.0.0.1:{port}"}, "g0", peer_secret=SECRET) as c:
            with pytest.raises(PeerAuthError):
                await c.status("n1", timeout_s=5)
        await _until(lambda: len(received) >= 3, what="the impostor saw the clients close")
        assert all(len(r) == CLIENT_PROOF_BYTES for r in received)  # never a frame
    finally:
        server.close()
        await server.wait_closed()


def _vote_message() -> VoteRequest:
    return VoteRequest(
        group="g0",
        local_id="n0",
        remote_id="n1",
        term=1,
        req_id=1,
        leader_id="n0",
        ledger_end_index=-1,
        ledger_end_term=-1,
    )


# ---- the dledger client ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_client_needs_the_same_secret(tmp_path: Path) -> None:
    async with _group(tmp_path, [SECRET]) as servers:
        node = await _wait_leader(servers)
        peers = node.config.peers
        async with DLedgerClient(peers, "g0", peer_secret=SECRET) as good:
            await good.append([b"ok"], timeout_s=10)
            assert (await good.status("n0"))["role"] == "LEADER"
        async with DLedgerClient(peers, "g0") as none:
            with pytest.raises(PeerAuthError, match="wants a peer secret"):
                await none.status("n0")
            with pytest.raises(DLedgerError) as e:
                await none.append([b"never"], timeout_s=1)
            assert e.value.code is DLedgerCode.TIMEOUT
        async with DLedgerClient(peers, "g0", peer_secret=OTHER, auth_timeout_s=1) as wrong:
            with pytest.raises(PeerAuthError):
                await wrong.status("n0")
        bodies = [node.get(i).body for i in range(node.committed_index + 1)]
        assert [b for b in bodies if b] == [b"ok"]  # besides the leader's NOOP, only "ok"
    async with _group(tmp_path / "open", [None]) as servers:
        node = await _wait_leader(servers)
        async with DLedgerClient(
            node.config.peers, "g0", peer_secret=SECRET, auth_timeout_s=0.5
        ) as c:
            with pytest.raises(PeerAuthError, match="no hello"):
                await c.status("n0")


# ---- the command line and processes -----------------------------------------------------


def test_load_peer_secret(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    assert load_peer_secret(None, f) == SECRET
    f.write_bytes(SECRET + b"\r\n")
    assert load_peer_secret(None, str(f)) == SECRET
    assert load_peer_secret(SECRET.decode(), None) == SECRET
    assert load_peer_secret(None, None) is None
    f.write_bytes(b"\n")
    with pytest.raises(ValueError, match="empty"):
        load_peer_secret(None, f)
    with pytest.raises(ValueError, match="empty"):
        load_peer_secret("", None)
    with pytest.raises(ValueError, match="not both"):
        load_peer_secret("x", f)
    with pytest.raises(ValueError, match="missing"):
        load_peer_secret(None, tmp_path / "missing")


def test_python_m_dledger_takes_the_secret_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--id", "n0", "--peers", "n0-127.0.0.1:1", "--data-dir", str(tmp_path)]
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    monkeypatch.delenv("LEDGERMQ_PEER_SECRET", raising=False)
    monkeypatch.delenv("LEDGERMQ_PEER_SECRET_FILE", raising=False)
    parse = cli._node_parser().parse_args
    assert cli.settings_from_args(parse(base)).transport.peer_secret is None
    cfg = cli.settings_from_args(parse([*base, "--peer-secret-file", str(f)]))
    assert cfg.transport.peer_secret == b"from-file"
    assert "from-file" not in repr(cfg)
    monkeypatch.setenv("LEDGERMQ_PEER_SECRET", "from-env")
    assert cli.settings_from_args(cli._node_parser().parse_args(base)).transport.peer_secret == (
        b"from-env"
    )
    monkeypatch.setenv("LEDGERMQ_PEER_SECRET", "")
    with pytest.raises(SystemExit, match="empty"):
        cli.settings_from_args(cli._node_parser().parse_args(base))
