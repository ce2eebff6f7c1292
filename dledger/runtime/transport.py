"""The asyncio TCP transport: frames in, frames out (DESIGN §2 ``dledger/runtime``).

- Every node listens on its Raft address. A peer sends everything it has for us
  (requests and responses) over *its* outbound connection, so each direction of a pair
  is one FIFO stream; clients send requests and read responses on their own connection.
- ``PeerLink``: the outbound connection to one peer, with reconnect and capped
  exponential backoff, and a bounded outbox. When the outbox is full, or the connection
  fails, queued messages are dropped: Raft resends what matters (pushes on timeout,
  heartbeats every interval), and a dead peer must not hold unbounded memory.
- A frame that does not parse closes that connection and is logged; nothing else
  happens (the decoder is unusable after an error, so the stream cannot resync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .wire import FrameDecoder, FrameError, WireMessage, encode_parts

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class TransportSettings:
    max_frame_bytes: int = 64 << 20
    max_outbox_bytes: int = 128 << 20  # per peer
    max_outbox_messages: int = 100_000
    connect_timeout_ms: int = 1000
    reconnect_min_ms: int = 20
    reconnect_max_ms: int = 1000
    max_client_requests_per_connection: int = 1024


def parse_address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}: want host:port")
    return host, int(port)


class PeerLink:
    """Outbound frames to one peer, in order, over one reconnecting TCP connection."""

    def __init__(self, peer_id: str, address: str, settings: TransportSettings) -> None:
        self.peer_id = peer_id
        self.host, self.port = parse_address(address)
        self.settings = settings
        self._queue: deque[list[bytes]] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.dropped = 0
        self.sent = 0

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
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a
                # cancellation that races with the connect failing (close() then waited
                # on this loop forever).
                async with asyncio.timeout(s.connect_timeout_ms / 1000):
                    _, writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, TimeoutError):
                self._clear()
                await asyncio.sleep(backoff / 1000)
                backoff = min(backoff * 2, s.reconnect_max_ms)
                continue
            backoff = s.reconnect_min_ms
            self.connected = True
            try:
                await self._write_loop(writer)
            except Exception as e:
                log.info("link to %s lost: %r", self.peer_id, e)
            finally:
                self.connected = False
                self._clear()
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _write_loop(self, writer: asyncio.StreamWriter) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
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


class Transport:
    """Listens on the node's address; owns one ``PeerLink`` per other peer."""

    def __init__(
        self,
        self_id: str,
        peers: dict[str, str],
        *,
        on_peer_message: PeerHandler,
        on_client_request: ClientHandler,
        is_peer_message: Callable[[WireMessage], bool],
        settings: TransportSettings | None = None,
        listen: str | None = None,
    ) -> None:
        self.self_id = self_id
        self.settings = settings or TransportSettings()
        self.listen = listen or peers[self_id]
        self.links = {
            p: PeerLink(p, addr, self.settings) for p, addr in sorted(peers.items()) if p != self_id
        }
        self._on_peer = on_peer_message
        self._on_client = on_client_request
        self._is_peer = is_peer_message
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.bad_frames = 0

    async def start(self) -> None:
        host, port = parse_address(self.listen)
        self._server = await asyncio.start_server(self._serve, host, port, limit=READ_CHUNK)
        for link in self.links.values():
            link.start()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self.links.values():
            await link.close()
        for w in list(self._conns.values()):
            w.close()  # the serving task sees EOF and returns
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def send(self, msg: WireMessage) -> None:
        link = self.links.get(msg.remote_id)
        if link is not None:
            link.send(msg)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        decoder = FrameDecoder(self.settings.max_frame_bytes)
        pending: set[asyncio.Task[None]] = set()
        peer = writer.get_extra_info("peername")
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    return
                try:
                    msgs = decoder.feed(data)
                except FrameError as e:
                    self.bad_frames += 1
                    log.warning("closing connection from %s: %s", peer, e)
                    return
                for m in msgs:
                    if self._is_peer(m):
                        self._on_peer(m)
                    elif len(pending) >= self.settings.max_client_requests_per_connection:
                        log.warning("client %s exceeds its in-flight limit; closing", peer)
                        return
                    else:
                        t = asyncio.create_task(self._answer(m, writer))
                        pending.add(t)
                        t.add_done_callback(pending.discard)
        except (ConnectionError, OSError):
            return
        finally:
            self._conns.pop(task, None)
            for t in pending:
                t.cancel()
            writer.close()

    async def _answer(self, m: WireMessage, writer: asyncio.StreamWriter) -> None:
        try:
            resp = await self._on_client(m)
        except Exception:
            log.exception("client request %s failed", type(m).__name__)
            return
        if resp is not None and not writer.is_closing():
            writer.writelines(encode_parts(resp))
