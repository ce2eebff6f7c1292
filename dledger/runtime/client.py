"""A small asyncio client of the DLedger client protocol (APPEND, GET, METADATA).

It finds the leader itself: it asks the node it believes leads, follows the
``leader_id`` a NOT_LEADER answer names, and tries the other nodes when none is known.
Tests and the benchmark use it; the broker embeds :class:`DLedgerServer` instead.
With ``peer_secret`` it runs the nodes' handshake (``peer_auth``, docs/operations.md) on every
connection before its first request, as a peer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from ..codes import DLedgerCode, DLedgerError
from ..core.messages import (
    AppendRequest,
    AppendResponse,
    GetRequest,
    GetResponse,
    MetadataRequest,
    MetadataResponse,
)
from ..store.entry import Entry, decode_entry
from .peer_auth import MAGIC, PeerAuthError
from .transport import authenticate_to, parse_address
from .wire import FrameDecoder, FrameError, WireMessage, encode_parts

RETRYABLE = {
    DLedgerCode.NOT_LEADER,
    DLedgerCode.LEADER_TRANSFERRING,
    DLedgerCode.LEADER_PENDING_FULL,
    DLedgerCode.ILLEGAL_MEMBER_STATE,
}
UNKNOWN_OUTCOME = {DLedgerCode.TERM_CHANGED, DLedgerCode.WAIT_QUORUM_ACK_TIMEOUT}


async def _back_off(backoff_s: float, deadline: float) -> float:
    """Sleep ``backoff_s`` (never past ``deadline``); return the next, doubled, capped."""
    await asyncio.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))
    return min(backoff_s * 2, 0.05)


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[WireMessage]] = {}
        self.task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder()
        needs_secret = False  # the node greeted us with a handshake's hello
        first = True
        try:
            while data := await reader.read(1 << 20):
                needs_secret = needs_secret or (first and data.startswith(MAGIC))
                first = False
                for m in decoder.feed(data):
                    fut = self.waiting.pop(m.req_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(m)
        except (ConnectionError, OSError, FrameError):
            pass
        finally:
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(
                        PeerAuthError("the node wants a peer secret; this client has none")
                        if needs_secret
                        else ConnectionError("connection closed")
                    )
            self.waiting.clear()

    @property
    def closed(self) -> bool:
        return self.task.done() or self.writer.is_closing()

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class DLedgerClient:
    def __init__(
        self,
        peers: dict[str, str],
        group: str,
        *,
        client_id: str | None = None,
        peer_secret: bytes | None = None,
        auth_timeout_s: float = 2.0,
    ):
        if peer_secret is not None and not peer_secret:
            raise ValueError("peer_secret must not be empty (None disables it)")
        self.peers = dict(sorted(peers.items()))
        self.group = group
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:8]}"
        self.peer_secret = peer_secret
        self.auth_timeout_s = auth_timeout_s
        self.leader: str | None = None
        self._conns: dict[str, _Conn] = {}
        self._seq = itertools.count(1)

    async def close(self) -> None:
        for c in self._conns.values():
            await c.close()
        self._conns.clear()

    async def __aenter__(self) -> DLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _conn(self, node: str, timeout_s: float) -> _Conn:
        c = self._conns.get(node)
        if c is None or c.closed:
            if c is not None:
                await c.close()
            host, port = parse_address(self.peers[node])
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
                if self.peer_secret is not None:
                    try:  # PeerAuthError is a ConnectionError: retried like a refused connect
                        await authenticate_to(
                            reader,
                            writer,
                            secret=self.peer_secret,
                            node_id=node,
                            timeout_s=min(self.auth_timeout_s, timeout_s),
                        )
                    except BaseException:
                        writer.close()
                        raise
            c = self._conns[node] = _Conn(reader, writer)
        return c

    async def request(self, node: str, msg_kind: type, timeout_s: float, **fields: Any) -> Any:
        c = await self._conn(node, timeout_s)
        req_id = next(self._seq)
        msg = msg_kind(
            group=self.group,
            local_id=self.client_id,
            remote_id=node,
            term=-1,
            req_id=req_id,
            **fields,
        )
        fut: asyncio.Future[WireMessage] = asyncio.get_running_loop().create_future()
        c.waiting[req_id] = fut
        c.writer.writelines(encode_parts(msg))
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        finally:
            c.waiting.pop(req_id, None)

    async def append(self, bodies: Sequence[bytes], *, timeout_s: float = 10.0) -> AppendResponse:
        """Append to the leader; returns the SUCCESS answer. Raises DLedgerError with the
        code when the outcome is unknown (TERM_CHANGED, WAIT_QUORUM_ACK_TIMEOUT) or the
        deadline passes without a leader."""
        deadline = time.monotonic() + timeout_s
        order = itertools.cycle(self.peers)
        backoff = 0.005
        last = "no attempt"
        while (left := deadline - time.monotonic()) > 0:
            node = self.leader or next(order)
            try:
                resp: AppendResponse = await self.request(
                    node, AppendRequest, min(left, 5.0), bodies=tuple(bodies)
                )
            except (OSError, ConnectionError, TimeoutError) as e:
                last = f"{node}: {e!r}"
                self.leader = None
                backoff = await _back_off(backoff, deadline)
                continue
            if resp.code is DLedgerCode.SUCCESS:
                self.leader = node
                return resp
            if resp.code in UNKNOWN_OUTCOME:
                self.leader = None
                raise DLedgerError(resp.code, f"append to {node}: outcome unknown")
            if resp.code not in RETRYABLE:
                raise DLedgerError(resp.code, f"append to {node} refused")
            last = f"{node}: {resp.code.name}"
            self.leader = (
                resp.leader_id if resp.leader_id in self.peers and resp.leader_id != node else None
            )
            if self.leader is None:
                backoff = await _back_off(backoff, deadline)
        raise DLedgerError(
            DLedgerCode.TIMEOUT, f"no leader took the append in {timeout_s}s ({last})"
        )

    async def get(
        self, node: str, index: int, max_count: int = 1, timeout_s: float = 5.0
    ) -> list[Entry]:
        resp: GetResponse = await self.request(
            node, GetRequest, timeout_s, index=index, max_count=max_count
        )
        if resp.code is not DLedgerCode.SUCCESS:
            raise DLedgerError(resp.code, f"get {index} from {node}")
        out, view, off = [], memoryview(resp.entries), 0
        while off < len(view):
            size = int.from_bytes(view[off + 4 : off + 8], "big")
            out.append(decode_entry(bytes(view[off : off + size])))
            off += size
        return out

    async def status(self, node: str, timeout_s: float = 2.0) -> dict[str, Any]:
        resp: MetadataResponse = await self.request(node, MetadataRequest, timeout_s)
        result: dict[str, Any] = orjson.loads(resp.status_json)
        return result
