"""The node's HTTP/1.1 connections: uvicorn's httptools protocol with the limits a port
shared with Raft needs against clients that send too much, too slowly, or nothing.

The node serves HTTP on the event loop that also runs Raft (``ledgermq.node``), so a request
that costs the loop a second costs an election (issue 32). uvicorn caps neither the
headers of a request nor the time a client takes to send them, and its
``limit_concurrency`` counts every open socket, silent ones included. ``guarded_protocol``
makes the class uvicorn instantiates per connection; what it adds:

- **The request head is capped as it arrives.** The bytes of a head (request line and
  headers) are counted in ``data_received`` before the parser sees them: the parser is
  fed at most ``max_header_bytes`` of a head, so a 64 MB header value costs one 64 KiB
  feed, not 64 MB of string concatenation; the headers are counted in ``on_header`` (one
  callback each, appending to uvicorn's list) and the first past ``max_header_count``
  stops the parser. Either way the answer is 431, then the connection is closed. (Bytes
  of a pipelined request that follows a body in the same read are counted from the next
  read on: at most one read, 256 KiB, escapes the byte cap; the count still holds.)
- **Read deadlines, one timer per connection.** A new connection must send its first
  byte within ``first_request_timeout_s`` (uvicorn's keep-alive timeout does the same
  between requests); from a head's first byte, the whole head must arrive within
  ``header_timeout_s`` (else 408); a body may not go silent for ``body_timeout_s``, nor,
  after ``body_rate_grace_s``, arrive slower on average than ``min_body_rate_bytes_s``
  (else 408). Time when the server itself holds the body back (flow control, a pending
  ``100-continue``) is not held against the client.
- **Connections are counted per client, and idle ones give way.** ``ConnectionTable``
  keeps the open connections, per peer address (the socket's, never a forwarded
  header), and those without a request in the app ("idle": not yet a complete head, or
  answered and kept alive). A new connection over ``max_connections_per_client`` (its
  address's) or over the node's ``max_connections`` first closes the idle connection
  that has waited longest (the client's own, for its cap); only when none is idle is
  it answered 503. Requests in flight are still capped at ``max_connections`` (503, as
  uvicorn's ``limit_concurrency``).

A refusal writes a short JSON error body (docs/http.md), then half-closes and reads and
drops what the client still sends (up to ``LINGER_S`` and ``LINGER_BYTES``) before
closing, so that a client that sends its whole request before reading reads the answer
instead of a reset. Every drop is counted by reason (``on_drop``: the
``ledgermq_http_connections_dropped_total`` series).

Why a subclass of the httptools protocol rather than uvicorn's h11 protocol with
``h11_max_incomplete_event_size`` (tests/process/http_protocol_bench.py, on 127.0.0.1): both
refuse the 3 million headers and the 64 MB value for ~1 ms of server CPU, but h11 parses
every request in Python, 169 us of CPU for an ordinary request against 74 us for
httptools and 77 us for this protocol; it has no header count cap (7,500 headers under
its 64 KiB cost 11 ms each, against 0.5 ms refused here); it answers 400, not 431, and
logs a warning per refusal. The checks here are a few attribute reads per read and one
``len`` per header, on the protocol uvicorn already runs.

Invariants: a connection is in ``ConnectionTable`` from its admission to its release
(its drop or loss, whichever comes first), and in its ``idle`` maps exactly while no
request of it is in the app; a connection has at most one read timer armed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from broker.errors import BrokerError

LINGER_S = 2.0  # how long a refused connection's input is still read (and dropped)
LINGER_BYTES = 1 << 20  # and how much of it: past either, the connection is reset
MIN_RECHECK_S = 0.05  # the body check never re-arms sooner than this


class HeadersTooLargeError(BrokerError):
    """The request line and headers are over a cap (the connection is closed)."""

    code = "HEADERS_TOO_LARGE"
    http_status = 431


class RequestTimeoutError(BrokerError):
    """The request's head or body arrived too slowly (the connection is closed)."""

    code = "REQUEST_TIMEOUT"
    http_status = 408


class TooManyConnectionsError(BrokerError):
    """No connection of this client (or of the node) is idle to make room: retry."""

    code = "TOO_MANY_CONNECTIONS"
    http_status = 503


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one client may hold and how slowly it may send (docs/http.md#limits)."""

    max_connections_per_client: int = 256  # open connections of one peer address
    max_header_count: int = 100  # headers of one request
    max_header_bytes: int = 64 * 1024  # request line and headers of one request
    first_request_timeout_s: float = 5.0  # connect to the first byte of a request
    header_timeout_s: float = 10.0  # a head's first byte to its end
    body_timeout_s: float = 10.0  # the longest silence inside a body
    min_body_rate_bytes_s: int = 1024  # a body's average rate once past the grace (0: off)
    body_rate_grace_s: float = 5.0  # a body's first seconds, exempt from the rate
    # A TLS connection's handshake (HTTPS): until it completes, the connection is the
    # event loop's, not ours (none of the limits above sees it); asyncio's own bound is 60 s.
    tls_handshake_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_connections_per_client", "max_header_count", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "first_request_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "tls_handshake_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0")
        if self.min_body_rate_bytes_s < 0 or self.body_rate_grace_s < 0:
            raise ValueError("min_body_rate_bytes_s and body_rate_grace_s must be >= 0")


def _first(conns: dict[GuardedHttpToolsProtocol, None] | None) -> GuardedHttpToolsProtocol | None:
    return next(iter(conns), None) if conns else None


class ConnectionTable:
    """One server's connections: how many are open, per peer address, and which are
    idle, longest idle first (dicts keep insertion order: a connection that turns idle
    again goes to the back)."""

    def __init__(
        self,
        max_connections: int,
        max_per_client: int,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.on_drop = on_drop
        self.open = 0
        self.per_client: dict[str, int] = {}
        self.idle: dict[GuardedHttpToolsProtocol, None] = {}
        self.idle_of: dict[str, dict[GuardedHttpToolsProtocol, None]] = {}

    def admit(self, conn: GuardedHttpToolsProtocol) -> str | None:
        """Take ``conn`` in (idle), closing the longest-idle connection it displaces;
        the reason it is refused when none can give way."""
        key = conn.client_key
        if self.per_client.get(key, 0) >= self.max_per_client:
            victim = _first(self.idle_of.get(key))
            if victim is None:
                return "client_connections"
            victim.drop("evicted_idle")
        if self.open >= self.max_connections:
            victim = _first(self.idle)
            if victim is None:
                return "connections"
            victim.drop("evicted_idle")
        self.open += 1
        self.per_client[key] = self.per_client.get(key, 0) + 1
        conn.admitted = True
        self.set_idle(conn)
        return None

    def set_idle(self, conn: GuardedHttpToolsProtocol) -> None:
        if not conn.admitted:
            return
        self.idle.pop(conn, None)  # to the back: idle from now
        self.idle[conn] = None
        mine = self.idle_of.setdefault(conn.client_key, {})
        mine.pop(conn, None)
        mine[conn] = None

    def set_busy(self, conn: GuardedHttpToolsProtocol) -> None:
        self.idle.pop(conn, None)
        mine = self.idle_of.get(conn.client_key)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.idle_of[conn.client_key]

    def release(self, conn: GuardedHttpToolsProtocol) -> None:
        if not conn.admitted:
            return
        conn.admitted = False
        self.set_busy(conn)
        self.open -= 1
        left = self.per_client[conn.client_key] - 1
        if left:
            self.per_client[conn.client_key] = left
        else:
            del self.per_client[conn.client_key]

    def dropped(self, reason: str) -> None:
        if self.on_drop is not None:
            self.on_drop(reason)


class _RefusedError(Exception):
    """Raised from a parser callback to stop the parser; the refusal is on the protocol."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the caps and deadlines of the module docstring.
    ``guarded_protocol`` binds ``limits`` and ``table`` in a subclass per server."""

    limits: ClassVar[ConnectionLimits]
    table: ClassVar[ConnectionTable]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # Requests in flight are capped here; open connections by the table (uvicorn's
        # own check would count every socket, idle ones included).
        self.max_in_flight = self.limit_concurrency
        self.limit_concurrency = None
        self.client_key = ""
        self.admitted = False
        self.lingering = False
        self._lingered_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True  # no complete head since the last message (or ever)
        self._head_bytes = 0
        self._refusal: tuple[BrokerError, str] | None = None  # what to answer, and why
        self._in_body = False
        self._body_bytes = 0
        self._body_started = 0.0
        self._body_last = 0.0

    # ---- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.client_key = self.client[0] if self.client else ""
        reason = self.table.admit(self)
        if reason is not None:
            self.refuse(TooManyConnectionsError("too many open connections"), reason)
            return
        self._arm(self.limits.first_request_timeout_s, self._first_request_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.table.release(self)
        super().connection_lost(exc)

    def drop(self, reason: str) -> None:
        """Close at once, sending nothing (an evicted idle connection, a silent one)."""
        self._cancel_timer()
        self.table.release(self)
        self.table.dropped(reason)
        self.transport.abort()

    def refuse(self, error: BrokerError, reason: str) -> None:
        """Answer ``error`` (its status, the error body) and close; what the client still
        sends is read and dropped for a while so that it reads the answer, not a reset."""
        self.table.dropped(reason)
        status = error.http_status
        body = orjson.dumps({"error": error.to_dict()})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\nconnection: close\r\n")
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.lingering = True
        self._in_body = False
        self._unset_keepalive_if_required()
        self.table.set_idle(self)  # nothing more to do for it: it may give way
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then FIN; reading goes on
            self._arm(LINGER_S, self._linger_over)
        else:  # TLS: no half-close
            self._cancel_timer()
            self.transport.close()

    def _linger_over(self) -> None:
        self._cancel_timer()
        self.transport.abort()

    # ---- reading ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # a refused client's remaining bytes: dropped unparsed
            self._lingered_bytes += len(data)
            if self._lingered_bytes > LINGER_BYTES:
                self._linger_over()
            return
        self._unset_keepalive_if_required()
        view = memoryview(data)
        if self._in_head:
            if self._head_bytes == 0:  # a request begins: the first request's timer is done
                self._cancel_timer()
            room = self.limits.max_header_bytes - self._head_bytes
            if len(view) > room:
                self._head_bytes += room
                if not self._feed(view[:room]):
                    return
                if self._head_unfinished():  # the parser had all the cap allows
                    cap = self.limits.max_header_bytes
                    message = f"request line and headers over {cap} bytes"
                    self.refuse(HeadersTooLargeError(message), "header_bytes")
                    return
                view = view[room:]
            else:
                self._head_bytes += len(view)
        if not self._feed(view) or self.lingering or self._timer is not None:
            return
        # Timers only for what this read left unfinished (most heads and bodies arrive
        # whole in one read): a head has header_timeout_s from about its first byte.
        if self._in_body:
            self._arm_body_check(self.loop.time())
        elif self._in_head and self._head_bytes:
            self._arm(self.limits.header_timeout_s, self._header_late)

    def _head_unfinished(self) -> bool:
        return self._in_head

    def _feed(self, data: memoryview) -> bool:
        """The parser over ``data``; False when the connection is being answered for an
        error (and must not be read further)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is not None:  # one of our callbacks stopped the parser
                self.refuse(*self._refusal)
            else:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return False
        return True

    # ---- parser callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.limits.max_header_count:  # this one is one too many
            message = f"more than {self.limits.max_header_count} headers"
            self._refusal = (HeadersTooLargeError(message), "header_count")
            raise _RefusedError(message)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_timer()
        self._in_head = False
        self._in_body = True
        self._body_bytes = 0
        self._body_started = self._body_last = self.loop.time()
        self.table.set_busy(self)
        if self.max_in_flight is not None and len(self.tasks) >= self.max_in_flight:
            app, self.app = self.app, service_unavailable  # uvicorn's own 503
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._body_last = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_body = False
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()
        if self.cycle.response_complete and self.timeout_keep_alive_task is None:
            # Answered before its body ended (413, 401): idle from now, as after any answer.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined:
            self.table.set_idle(self)

    # ---- deadlines ----------------------------------------------------------------------

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay_s, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _first_request_late(self) -> None:
        self._timer = None
        if self._in_head and self._head_bytes == 0:
            self.drop("first_request_timeout")

    def _header_late(self) -> None:
        self._timer = None
        if self._in_head and not self.lingering:
            limit = self.limits.header_timeout_s
            message = f"the request head took over {limit:g} s"
            self.refuse(RequestTimeoutError(message), "header_timeout")

    def _held_back(self) -> bool:
        """Is the server itself keeping the body from arriving?"""
        cycle = self.cycle
        return self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)

    def _arm_body_check(self, now: float) -> None:
        lim = self.limits
        at = self._body_last + lim.body_timeout_s
        if lim.min_body_rate_bytes_s > 0:
            rate_at = self._body_started + self._body_bytes / lim.min_body_rate_bytes_s
            at = min(at, max(self._body_started + lim.body_rate_grace_s, rate_at))
        self._arm(max(at - now, MIN_RECHECK_S), self._check_body)

    def _check_body(self) -> None:
        self._timer = None
        if not self._in_body or self.lingering:
            return
        lim = self.limits
        now = self.loop.time()
        if self._held_back():  # start counting again once the server reads on
            self._body_started = self._body_last = now
            self._body_bytes = 0
        elif now - self._body_last >= lim.body_timeout_s:
            self._cut_body(f"no body bytes for {lim.body_timeout_s:g} s", "body_timeout")
            return
        else:
            elapsed = now - self._body_started
            rate = lim.min_body_rate_bytes_s
            if elapsed >= lim.body_rate_grace_s and self._body_bytes < rate * elapsed:
                self._cut_body(f"the body arrives slower than {rate} bytes/s", "body_rate")
                return
        self._arm_body_check(now)

    def _cut_body(self, message: str, reason: str) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app reading the body sees the client gone (it answers no one); the
            # client gets the reason.
            cycle.disconnected = True
            cycle.message_event.set()
            self.refuse(RequestTimeoutError(message), reason)
        else:
            self.drop(reason)


def guarded_protocol(
    limits: ConnectionLimits,
    max_connections: int,
    on_drop: Callable[[str], None] | None = None,
) -> tuple[type[GuardedHttpToolsProtocol], ConnectionTable]:
    """The protocol class for one server (uvicorn's ``Config(http=...)``), with the
    table of its connections."""
    table = ConnectionTable(max_connections, limits.max_connections_per_client, on_drop)

    class NodeHttpProtocol(GuardedHttpToolsProtocol):
        pass

    NodeHttpProtocol.limits = limits
    NodeHttpProtocol.table = table
    return NodeHttpProtocol, table
