"""The asyncio TCP transport: frames in, frames out (docs/architecture.md ``dledger/runtime``).

- Every node listens on its Raft address. A peer sends everything it has for us
  (requests and responses) over *its* outbound connection, so each direction of a pair
  is one FIFO stream; clients send requests and read responses on their own connection.
- ``PeerLink``: the outbound connection to one peer, with reconnect and capped
  exponential backoff, and a bounded outbox. When the outbox is full, or the connection
  fails, queued messages are dropped: Raft resends what matters (pushes on timeout,
  heartbeats every interval), and a dead peer must not hold unbounded memory.
- A frame that does not parse closes that connection and is logged; nothing else
  happens (the decoder is unusable after an error, so the stream cannot resync).
- With ``peer_secret`` set (docs/operations.md), every connection starts with the handshake of
  ``peer_auth``, in both directions: the listening side closes a connection that fails
  it before reading a single frame byte, so nothing an unauthenticated process sends
  reaches the decoder or the core. Without a secret there is no handshake and the bytes
  on the wire are exactly what they were before the option existed.
- A peer frame (vote, heartbeat, push, snapshot, transfer) is taken only from a member:
  of our group, addressed to us, from a configured peer other than ourselves, and every
  frame of one connection from the same peer, whose first one came from an address of
  that peer's configured host (``check_peer_address``; loopback counts for loopback).
  Anything else closes the connection before the frame reaches the core. Without a
  peer secret this stops strangers who do not forge a member's identity and address;
  the secret stops the rest.
- A member's connection that ends, inbound (EOF or reset after its frames) or outbound
  (a failed write, or a connect refused), is reported (``on_peer_lost(peer_id)``; issue
  18): a crashed peer's kernel closes its sockets, and the core decides what that means.
  Silence (a paused or partitioned peer) is not reported: nothing closes. Neither is a
  connection this node closes itself (shutdown, a refused stranger, a limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..core.messages import HeartBeatRequest, InstallSnapshotRequest, PushEntryRequest
from .peer_auth import (
    CLIENT_PROOF_BYTES,
    HELLO_BYTES,
    MAGIC,
    SERVER_PROOF_BYTES,
    ClientHandshake,
    PeerAuthError,
    ServerHandshake,
    check_magic,
)
from .wire import FrameDecoder, FrameError, WireMessage, encode_parts

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
AUTH_LOG_INTERVAL_S = 1.0  # at most one line per second about refused connections


@dataclass(frozen=True, slots=True)
class TransportSettings:
    max_frame_bytes: int = 64 << 20
    max_outbox_bytes: int = 128 << 20  # per peer
    max_outbox_messages: int = 100_000
    connect_timeout_ms: int = 1000
    reconnect_min_ms: int = 20
    reconnect_max_ms: int = 1000
    max_client_requests_per_connection: int = 1024
    # docs/operations.md: None = no handshake at all (the wire is unchanged). Kept out of repr so
    # that a logged settings object does not print it.
    peer_secret: bytes | None = field(default=None, repr=False)
    auth_timeout_ms: int = 2000  # the whole handshake, from accept/connect
    # Connections in the handshake at once; more are refused at once. Each one holds a
    # socket and a read buffer until its timeout, so a flood must not hold unbounded
    # memory; peers retry with backoff.
    max_handshakes_in_flight: int = 128
    # A member's frames must come from an address its configured host resolves to (or
    # any loopback address when it is loopback). Off for networks that rewrite source
    # addresses (NAT between members); the peer secret is the real authentication.
    check_peer_address: bool = True
    # How long a resolved member host is trusted before it is looked up again.
    peer_address_ttl_ms: int = 30_000
    # Inbound connections (peers, clients and anybody else) at once. At the limit a new
    # one takes the place of the longest-idle connection that is not a member's (so
    # strangers holding sockets cannot lock peers out), or is closed if all are members'.
    max_inbound_connections: int = 64
    # Bytes all inbound connections may hold in partial frames together: a connection
    # whose read would pass it is closed (a flood of 64 MiB half-frames otherwise holds
    # 64 MiB each). Room for a snapshot chunk (snapshot_chunk_bytes) and pushes.
    max_inbound_buffer_bytes: int = 256 << 20
    # A frame that has begun must be complete within this (a slow-loris holding a
    # buffer), whoever sends it: a 4 MiB snapshot chunk at 10 Mbit/s takes about 3.4 s.
    partial_frame_timeout_ms: int = 60_000
    # A connection that sends client requests is closed after this long without one.
    client_idle_timeout_ms: int = 300_000
    # A client that does not read its answers: the answer's write waits this long.
    client_write_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.peer_secret is not None and not self.peer_secret:
            raise ValueError("peer_secret must not be empty (None disables it)")
        for name in (
            "auth_timeout_ms",
            "max_handshakes_in_flight",
            "max_inbound_connections",
            "max_inbound_buffer_bytes",
            "partial_frame_timeout_ms",
            "client_idle_timeout_ms",
            "client_write_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


LEADER_FRAMES = (HeartBeatRequest, PushEntryRequest, InstallSnapshotRequest)


def _leader_addr(m: WireMessage) -> str | None:
    """The Raft address a leader's frame says its sender has (a leader added while this
    node was behind, so not configured here yet: the core decides whether to follow
    it, ``DLedgerCore._follows_stranger``); None for any other frame."""
    addr = getattr(m, "leader_addr", "") if isinstance(m, LEADER_FRAMES) else ""
    if not addr:
        return None
    try:
        parse_address(addr)
    except ValueError:
        return None
    return str(addr)


def _address(peername: object) -> str:
    """``('127.0.0.1', 5000)`` (or an IPv6 4-tuple) → ``127.0.0.1:5000``."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername)


def parse_address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}: want host:port")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether a listening host is loopback only (``localhost``, 127.0.0.0/8, ``::1``,
    bracketed or not); a name other than ``localhost`` may resolve to anything: no."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _handshake_failure(e: BaseException, timeout_s: float, waiting_for: str) -> PeerAuthError:
    if isinstance(e, TimeoutError):
        hint = " (a node without a peer secret sends none)" if waiting_for == "hello" else ""
        return PeerAuthError(f"no {waiting_for} within {timeout_s * 1000:.0f} ms{hint}")
    if isinstance(e, asyncio.IncompleteReadError):
        return PeerAuthError(
            f"connection closed in the handshake ({len(e.partial)} of {e.expected} bytes)"
        )
    if isinstance(e, PeerAuthError):
        return e
    return PeerAuthError(f"handshake failed: {e!r}")


async def accept_peer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    secret: bytes,
    node_id: str,
    timeout_s: float,
) -> None:
    """The listening side of the handshake (``peer_auth``); ``PeerAuthError`` on any
    failure. Reads exactly the handshake's bytes and nothing after them."""
    hs = ServerHandshake(secret, node_id)
    try:
        # asyncio.timeout, never wait_for: see PeerLink._connect.
        async with asyncio.timeout(timeout_s):
            writer.write(hs.hello())
            # The magic first: a peer without a secret is told apart at once (it sends a
            # frame here) instead of when its frames have filled a whole proof.
            head = await reader.readexactly(len(MAGIC))
            check_magic(head, "client")
            rest = await reader.readexactly(CLIENT_PROOF_BYTES - len(MAGIC))
            writer.write(hs.check_client_proof(head + rest))
            await writer.drain()
    except (OSError, EOFError, TimeoutError) as e:  # PeerAuthError is an OSError
        raise _handshake_failure(e, timeout_s, "client proof") from None


async def authenticate_to(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    secret: bytes,
    node_id: str,
    timeout_s: float,
) -> None:
    """The connecting side of the handshake with node ``node_id``; ``PeerAuthError`` on
    any failure, including a server that does not prove it holds the secret."""
    hs = ClientHandshake(secret, node_id)
    waiting_for = "hello"
    try:
        async with asyncio.timeout(timeout_s):
            hello = await reader.readexactly(HELLO_BYTES)
            writer.write(hs.answer(hello))
            waiting_for = "server proof"
            hs.check_server_proof(await reader.readexactly(SERVER_PROOF_BYTES))
    except (OSError, EOFError, TimeoutError) as e:
        raise _handshake_failure(e, timeout_s, waiting_for) from None


class PeerLink:
    """Outbound frames to one peer, in order, over one reconnecting TCP connection."""

    def __init__(
        self,
        peer_id: str,
        address: str,
        settings: TransportSettings,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.peer_id = peer_id
        self._on_lost = on_lost  # the connection failed or ended (see the module doc)
        self.addr = address
        self.host, self.port = parse_address(address)
        self.settings = settings
        self._queue: deque[list[bytes]] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False  # and authenticated, with a peer secret
        self.dropped = 0
        self.sent = 0
        self.connect_failures = 0  # connects (or handshakes) that failed, in total
        self.auth_failures = 0  # handshakes that failed, in total
        self._failed_handshakes = 0  # in a row; the first one is logged

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"peer-link-{self.peer_id}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def send(self, msg: WireMessage) -> None:
        parts = encode_parts(msg)
        size = sum(map(len, parts))
        s = self.settings
        if (
            self._queued_bytes + size > s.max_outbox_bytes
            or len(self._queue) >= s.max_outbox_messages
        ):
            self.dropped += 1
            return
        self._queue.append(parts)
        self._queued_bytes += size
        self._wakeup.set()

    def _clear(self) -> None:
        self.dropped += len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0

    async def _run(self) -> None:
        s = self.settings
        backoff = s.reconnect_min_ms
        while True:
            conn = await self._connect()
            if conn is None:
                self.connect_failures += 1
                self._lost()
                self._clear()
                await asyncio.sleep(backoff / 1000)
                backoff = min(backoff * 2, s.reconnect_max_ms)
                continue
            backoff = s.reconnect_min_ms
            self.connected = True
            reader, writer = conn
            # The peer never writes on our connection (after the handshake): a read that
            # returns is its end (EOF or reset), seen at once, not at our next write (a
            # restarted peer would otherwise get its first answers into the dead one).
            closed = asyncio.create_task(reader.read(1))
            closed.add_done_callback(lambda _: self._wakeup.set())  # the write loop sees it
            try:
                await self._write_loop(writer, closed)
            except Exception as e:
                log.info("link to %s lost: %r", self.peer_id, e)
                self._lost()
            finally:
                self.connected = False
                self._clear()
                closed.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await closed
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    def _lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost(self.peer_id)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the peer, authenticated when there is a secret; None when
        the connect or the handshake fails (the caller backs off and retries)."""
        s = self.settings
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a
            # cancellation that races with the connect failing (close() then waited
            # on this loop forever).
            async with asyncio.timeout(s.connect_timeout_ms / 1000):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError):
            return None
        if s.peer_secret is None:
            return reader, writer
        ok = False
        try:
            await authenticate_to(
                reader,
                writer,
                secret=s.peer_secret,
                node_id=self.peer_id,
                timeout_s=s.auth_timeout_ms / 1000,
            )
            ok = True
        except PeerAuthError as e:
            self.auth_failures += 1
            self._failed_handshakes += 1
            if self._failed_handshakes == 1:  # once per streak: a retry a second is noise
                log.warning(
                    "link to %s (%s:%d): %s; retrying quietly",
                    self.peer_id,
                    self.host,
                    self.port,
                    e,
                )
            return None
        finally:
            if not ok:  # failed or cancelled: do not leak the socket
                writer.close()
        if self._failed_handshakes:
            log.info(
                "link to %s authenticated after %d failed handshakes",
                self.peer_id,
                self._failed_handshakes,
            )
            self._failed_handshakes = 0
        return reader, writer

    async def _write_loop(self, writer: asyncio.StreamWriter, closed: asyncio.Task[bytes]) -> None:
        while True:
            if not self._queue and not closed.done():
                self._wakeup.clear()  # set again by a send, or by ``closed`` ending
                await self._wakeup.wait()
            if closed.done():
                raise ConnectionResetError("closed by the peer")
            batch: list[bytes] = []
            while self._queue and len(batch) < 4096:
                parts = self._queue.popleft()
                batch.extend(parts)
                self.sent += 1
            self._queued_bytes -= sum(map(len, batch))
            writer.writelines(batch)
            await writer.drain()


PeerHandler = Callable[[WireMessage], None]
ClientHandler = Callable[[WireMessage], Awaitable[WireMessage | None]]


_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> _IPAddress | None:
    try:
        a = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return a.ipv4_mapped
    return a


@dataclass(slots=True)
class _Inbound:
    """One inbound connection: what the limits see of it, and what its serving task keeps."""

    writer: asyncio.StreamWriter
    peer: object  # its peername
    last_active: float  # monotonic time of its last complete frame (or its accept)
    member: str | None = None  # the member it speaks for, once it sent a member's frame
    client: bool = False  # it sent client requests
    pending: set[asyncio.Task[None]] = field(default_factory=set)  # client answers in flight


class Transport:
    """Listens on the node's address; owns one ``PeerLink`` per other peer."""

    def __init__(
        self,
        self_id: str,
        peers: dict[str, str],
        *,
        group: str | None = None,
        on_peer_message: PeerHandler,
        on_client_request: ClientHandler,
        is_peer_message: Callable[[WireMessage], bool],
        settings: TransportSettings | None = None,
        listen: str | None = None,
        on_peer_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.self_id = self_id
        self.group = group  # None: frames of any group reach the core (which checks)
        self.peers = dict(peers)
        self.settings = settings or TransportSettings()
        self.listen = listen or peers[self_id]
        self._on_peer_lost = on_peer_lost
        self._closing = False
        self.links = {
            p: PeerLink(p, addr, self.settings, self._peer_lost)
            for p, addr in sorted(peers.items())
            if p != self_id
        }
        self._on_peer = on_peer_message
        self._on_client = on_client_request
        self._is_peer = is_peer_message
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], _Inbound] = {}
        self.bad_frames = 0
        self.stranger_frames = 0  # peer frames refused: not from a member (see module doc)
        self.limited = 0  # inbound connections closed by a limit (count, bytes, time)
        self._buffered: dict[asyncio.Task[None], int] = {}  # partial-frame bytes held
        self._resolved: dict[str, tuple[float, frozenset[_IPAddress]]] = {}
        self.auth_failures = 0  # inbound connections refused by the handshake
        self._handshakes = 0  # inbound connections in the handshake now
        self._auth_logged_at = -AUTH_LOG_INTERVAL_S
        self._auth_failures_logged = 0
        self._closing_links: set[asyncio.Future[None]] = set()  # removed members' links

    async def start(self) -> None:
        host, port = parse_address(self.listen)
        self._server = await asyncio.start_server(self._serve, host, port, limit=READ_CHUNK)
        for link in self.links.values():
            link.start()

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for link in self.links.values():
            await link.close()
        if self._closing_links:
            await asyncio.wait(list(self._closing_links), timeout=2.0)
        for c in list(self._conns.values()):
            c.writer.close()  # the serving task sees EOF and returns
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def set_peers(self, peers: dict[str, str]) -> None:
        """The configuration changed (``membership``): a link to each new member, none
        to a removed one (its link closes), a moved member's link anew. Frames from a
        member no longer listed are refused from now on (``_stranger``). Call on the
        transport's loop, after ``start``."""
        peers = {p: a for p, a in peers.items() if p != self.self_id}
        for p, link in list(self.links.items()):
            if peers.get(p) != link.addr:
                del self.links[p]
                self._resolved.pop(p, None)
                task = asyncio.ensure_future(link.close())
                self._closing_links.add(task)
                task.add_done_callback(self._closing_links.discard)
        for p, addr in sorted(peers.items()):
            if p not in self.links:
                self.links[p] = PeerLink(p, addr, self.settings, self._peer_lost)
                if self._server is not None:
                    self.links[p].start()
        self.peers = {**peers, self.self_id: self.listen}

    def _peer_lost(self, peer_id: str) -> None:
        """A member's connection ended or failed (not by our own doing): report it."""
        if self._on_peer_lost is not None and not self._closing:
            self._on_peer_lost(peer_id)

    def send(self, msg: WireMessage) -> None:
        link = self.links.get(msg.remote_id)
        if link is not None:
            link.send(msg)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection's whole life, in order: admission (the connection limit), the
        handshake, then its frames until EOF, an error or a limit closes it."""
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        if len(self._conns) >= self.settings.max_inbound_connections and not self._evict_one():
            self._limit(peer, f"{len(self._conns)} members' connections already")
            writer.close()
            return
        conn = self._conns[task] = _Inbound(writer, peer, time.monotonic())
        try:
            # Authenticate before the decoder exists: an unauthenticated peer's bytes
            # are never parsed, so no frame of theirs (a vote with a huge term, a bogus
            # append) can reach the core, and no decoder bug is reachable without the
            # secret.
            if self.settings.peer_secret is not None and not await self._authenticate(
                reader, writer, peer
            ):
                return
            await self._read_frames(reader, conn, task)
        except (ConnectionError, OSError):
            if conn.member is not None:
                self._peer_lost(conn.member)  # reset
            return
        except Exception:  # a bug: this connection ends, the node and its core go on
            log.exception("serving the connection from %s failed", _address(peer))
            return
        finally:
            self._conns.pop(task, None)
            self._buffered.pop(task, None)
            for t in conn.pending:
                t.cancel()
            writer.close()

    async def _read_frames(
        self, reader: asyncio.StreamReader, conn: _Inbound, task: asyncio.Task[None]
    ) -> None:
        """Decode the connection's bytes and take each message, until EOF, a bad frame,
        a stranger's frame or a limit ends it."""
        s = self.settings
        decoder = FrameDecoder(s.max_frame_bytes)
        while True:
            data = await self._read_chunk(reader, decoder, conn)
            if data is None:
                return
            if not data:
                if conn.member is not None:
                    self._peer_lost(conn.member)  # EOF: the peer closed (or died)
                return
            held = sum(self._buffered.values()) - self._buffered.get(task, 0)
            if held + decoder.buffered + len(data) > s.max_inbound_buffer_bytes:
                self._limit(conn.peer, f"partial frames would pass {s.max_inbound_buffer_bytes} B")
                return
            try:
                msgs = decoder.feed(data)
            except FrameError as e:
                self.bad_frames += 1
                log.warning("closing connection from %s: %s", conn.peer, e)
                return
            self._buffered[task] = decoder.buffered
            if msgs:
                conn.last_active = time.monotonic()
            for m in msgs:
                if not await self._take(m, conn):
                    return

    async def _read_chunk(
        self, reader: asyncio.StreamReader, decoder: FrameDecoder, conn: _Inbound
    ) -> bytes | None:
        """The next bytes (``b""`` at EOF); None when the connection waited too long for
        them (a frame begun and not finished, or a client idle) and a limit closes it."""
        s = self.settings
        if decoder.buffered:
            timeout_s: float | None = s.partial_frame_timeout_ms / 1000
        elif conn.client:
            timeout_s = s.client_idle_timeout_ms / 1000
        else:
            timeout_s = None  # a link may idle between terms (eviction bounds it)
        try:
            async with asyncio.timeout(timeout_s):
                return await reader.read(READ_CHUNK)
        except TimeoutError:
            what = "a frame begun and not finished" if decoder.buffered else "idle"
            self._limit(conn.peer, what)
            return None

    async def _take(self, m: WireMessage, conn: _Inbound) -> bool:
        """Route one message: a member's peer frame to the core, a client request to a
        task that answers it. False: the connection must close (a peer frame not from a
        member, or a client over its in-flight limit)."""
        if self._is_peer(m):
            why = await self._stranger(m, conn.member, conn.peer)
            if why is not None:
                self.stranger_frames += 1
                self._refused(conn.peer, why, counted=True)
                return False
            conn.member = m.local_id
            self._on_peer(m)
        elif len(conn.pending) >= self.settings.max_client_requests_per_connection:
            log.warning("client %s exceeds its in-flight limit; closing", conn.peer)
            return False
        else:
            conn.client = True
            t = asyncio.create_task(self._answer(m, conn.writer))
            conn.pending.add(t)
            t.add_done_callback(conn.pending.discard)
        return True

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> bool:
        s = self.settings
        assert s.peer_secret is not None
        if self._handshakes >= s.max_handshakes_in_flight:
            self._refused(peer, f"{self._handshakes} connections already in the handshake")
            return False
        self._handshakes += 1
        try:
            await accept_peer(
                reader,
                writer,
                secret=s.peer_secret,
                node_id=self.self_id,
                timeout_s=s.auth_timeout_ms / 1000,
            )
        except PeerAuthError as e:
            self._refused(peer, str(e))
            return False
        finally:
            self._handshakes -= 1
        return True

    async def _stranger(self, m: WireMessage, member: str | None, peer: object) -> str | None:
        """Why peer frame ``m`` on a connection bound to ``member`` (None: its first)
        does not come from a member of this group (see the module docstring); None when
        it does."""
        if self.group is not None and m.group != self.group:
            return f"a {type(m).__name__} of group {m.group!r}, not {self.group!r}"
        addr = self.peers.get(m.local_id) or _leader_addr(m)
        if addr is None or m.local_id == self.self_id:
            return f"a {type(m).__name__} from {m.local_id!r}, not a member"
        if m.remote_id != self.self_id:
            return f"a {type(m).__name__} addressed to {m.remote_id!r}, not {self.self_id!r}"
        if member is not None:
            if m.local_id != member:
                return f"a {type(m).__name__} as {m.local_id!r} on the connection of {member!r}"
            return None
        if self.settings.check_peer_address and not await self._from_host_of(
            m.local_id, addr, peer
        ):
            return (
                f"a {type(m).__name__} as {m.local_id!r} from {_address(peer)}, not an"
                f" address of {addr}"
            )
        return None

    async def _from_host_of(self, member: str, addr: str, peer: object) -> bool:
        """Does the connection's source address belong to ``member``'s host (``addr``,
        its configured address, or the one a leader not configured here says it has)?"""
        src = _ip(str(peer[0])) if isinstance(peer, tuple) and peer else None
        if src is None:
            return False  # a unix socket or an unknown family: not a configured member
        host, _ = parse_address(addr)
        addrs = await self._addresses_of(member, host, fresh=False)
        if src not in addrs and not (src.is_loopback and any(a.is_loopback for a in addrs)):
            # The host may have moved (a container restarted with a new address).
            addrs = await self._addresses_of(member, host, fresh=True)
        return src in addrs or (src.is_loopback and any(a.is_loopback for a in addrs))

    async def _addresses_of(self, member: str, host: str, *, fresh: bool) -> frozenset[_IPAddress]:
        literal = _ip(host)
        if literal is not None:
            return frozenset({literal})
        now = time.monotonic()
        cached = self._resolved.get(member)
        ttl_s = self.settings.peer_address_ttl_ms / 1000
        if cached is not None and now - cached[0] < (1.0 if fresh else ttl_s):
            return cached[1]
        try:
            async with asyncio.timeout(2.0):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, None, type=socket.SOCK_STREAM
                )
        except (OSError, TimeoutError) as e:
            log.warning("cannot resolve %s (member %s): %s", host, member, e)
            return cached[1] if cached is not None else frozenset()
        addrs = frozenset(a for info in infos if (a := _ip(str(info[4][0]))) is not None)
        self._resolved[member] = (now, addrs)
        return addrs

    def _evict_one(self) -> bool:
        """Close the longest-idle inbound connection that is not a member's; False if
        there is none."""
        idle = [(c.last_active, t) for t, c in self._conns.items() if c.member is None]
        if not idle:
            return False
        _, victim = min(idle, key=lambda x: x[0])
        c = self._conns.pop(victim)
        self._buffered.pop(victim, None)
        self._limit(c.writer.get_extra_info("peername"), "evicted for a new connection")
        c.writer.close()
        return True

    def _limit(self, peer: object, reason: str) -> None:
        """A connection closed by one of the inbound limits: counted, logged rarely."""
        self.limited += 1
        self._refused(peer, f"a limit: {reason}", counted=True)

    def _refused(self, peer: object, reason: str, *, counted: bool = False) -> None:
        """Count a refused connection (unless ``counted``); log it, at most one line a
        second (a scanner or a misconfigured peer retrying must not flood the log), with
        what was not logged."""
        if not counted:
            self.auth_failures += 1
        now = time.monotonic()
        refusals = self.auth_failures + self.stranger_frames + self.limited
        if now - self._auth_logged_at < AUTH_LOG_INTERVAL_S:
            return
        unlogged = refusals - self._auth_failures_logged - 1
        log.warning(
            "refused Raft connection from %s: %s%s",
            _address(peer),
            reason,
            f" (and {unlogged} more since the last report)" if unlogged else "",
        )
        self._auth_logged_at = now
        self._auth_failures_logged = refusals

    async def _answer(self, m: WireMessage, writer: asyncio.StreamWriter) -> None:
        try:
            resp = await self._on_client(m)
        except Exception:
            log.exception("client request %s failed", type(m).__name__)
            return
        if resp is not None and not writer.is_closing():
            writer.writelines(encode_parts(resp))
            try:  # a client that does not read must not grow our buffer without end
                async with asyncio.timeout(self.settings.client_write_timeout_ms / 1000):
                    await writer.drain()
            except TimeoutError:
                self._limit(writer.get_extra_info("peername"), "a client that does not read")
                writer.close()
            except (ConnectionError, OSError):
                writer.close()
