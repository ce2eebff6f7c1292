"""``api.http_protocol`` driven without a network (h11's way): bytes pushed into the
protocol through a fake transport in reads cut anywhere, answers read back from what
it wrote. The caps must not depend on how the bytes were cut into reads, and what is
under them must arrive whole: heads, bodies, pipelined requests. ``ConnectionTable``'s
choice of whom to close is checked on its own.

The same limits against a real node process, with real sockets and clocks, are in
``test_http_dos.py``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState

from api.http_protocol import ConnectionLimits, ConnectionTable, guarded_protocol

CAP = 1024  # max_header_bytes of these tests
LIMITS = ConnectionLimits(max_header_bytes=CAP, max_header_count=20)


class FakeTransport(asyncio.Transport):
    """What the protocol writes, and whether it closed; a fixed peer address."""

    def __init__(self, peer: str = "10.0.0.1") -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = self.eof = False
        self.peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": (self.peer, 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers 200 with the request's body, and its path in a header."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = [(b"content-length", b"%d" % len(body)), (b"x-path", scope["path"].encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def answers(out: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each complete response in ``out``."""
    found = []
    while b"\r\n\r\n" in out:
        head, _, rest = out.partition(b"\r\n\r\n")
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
        n = int(fields.get(b"content-length", b"0"))
        if len(rest) < n:
            break
        found.append((int(head.split(b" ")[1]), rest[:n]))
        out = rest[n:]
    return found


async def push(stream: bytes, cuts: Sequence[int], *, want: int) -> tuple[FakeTransport, Any]:
    """Feed ``stream`` in reads cut at ``cuts``; run the loop until ``want`` answers
    were written or the connection closed (bounded)."""
    cls, _table = guarded_protocol(LIMITS, 100)
    config = Config(echo, http=cls, lifespan="off", log_config=None, proxy_headers=False)
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = FakeTransport()
    proto.connection_made(transport)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    for lo, hi in itertools.pairwise(bounds):
        if transport.closed or proto.lingering:
            break
        proto.data_received(stream[lo:hi])
        for _ in range(20):  # let the app's task run
            await asyncio.sleep(0)
    for _ in range(200):
        if len(answers(bytes(transport.out))) >= want or transport.closed or transport.eof:
            break
        await asyncio.sleep(0)
    proto.connection_lost(None)
    return transport, proto


def head_of(size: int, path: bytes = b"/p") -> bytes:
    """A GET whose request line and headers (blank line included) are ``size`` bytes."""
    base = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
    pad = size - len(base)
    assert pad >= 0
    return base.replace(b"X-Pad: ", b"X-Pad: " + b"a" * pad)


cuts_strategy = st.lists(st.integers(min_value=1, max_value=4 * CAP), max_size=8)


@settings(max_examples=60, deadline=None)
@given(cuts=cuts_strategy)
def test_a_head_of_exactly_the_cap_passes_and_one_byte_more_is_431(cuts: list[int]) -> None:
    transport, _ = asyncio.run(push(head_of(CAP), cuts, want=1))
    assert answers(bytes(transport.out)) == [(200, b"")]
    transport, _ = asyncio.run(push(head_of(CAP + 1), cuts, want=1))
    assert bytes(transport.out).startswith(b"HTTP/1.1 431 ")
    assert transport.eof  # answered, then half-closed


@settings(max_examples=60, deadline=None)
@given(cuts=cuts_strategy, size=st.integers(min_value=0, max_value=3 * CAP))
def test_a_body_after_a_large_head_arrives_whole(cuts: list[int], size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    head = head_of(CAP - 24).replace(b"GET", b"PUT")  # room for the content-length line
    head = head.replace(b"Host: x\r\n", b"Host: x\r\ncontent-length: %06d\r\n" % size)
    assert len(head) == CAP - 24 + len(b"content-length: 000000\r\n")
    transport, _ = asyncio.run(push(head + body, cuts, want=1))
    assert answers(bytes(transport.out)) == [(200, body)]


@settings(max_examples=40, deadline=None)
@given(cuts=cuts_strategy)
def test_pipelined_requests_are_each_answered(cuts: list[int]) -> None:
    stream = b"".join(head_of(200 + i, b"/r%d" % i) for i in range(3))
    transport, _ = asyncio.run(push(stream, cuts, want=3))
    assert [status for status, _ in answers(bytes(transport.out))] == [200, 200, 200]
    assert b"x-path: /r0" in transport.out and b"x-path: /r2" in transport.out


def test_the_header_count_cap_is_per_request() -> None:
    twenty = head_of(300).replace(b"Host: x\r\n", b"".join(b"H%d: v\r\n" % i for i in range(18)))
    transport, _ = asyncio.run(push(twenty + twenty, [], want=2))  # Host dropped, 18 + X-Pad
    assert [status for status, _ in answers(bytes(transport.out))] == [200, 200]
    over = twenty.replace(b"X-Pad", b"H97: v\r\nH98: v\r\nH99")  # 21
    transport, _ = asyncio.run(push(over, [], want=1))
    assert bytes(transport.out).startswith(b"HTTP/1.1 431 ")
    assert b"more than 20 headers" in transport.out


# ---- ConnectionTable --------------------------------------------------------------------------


class Conn:
    """What the table uses of a protocol."""

    def __init__(self, table: ConnectionTable, key: str) -> None:
        self.table = table
        self.client_key = key
        self.admitted = False
        self.dropped_for: str | None = None

    def drop(self, reason: str) -> None:
        self.dropped_for = reason
        self.table.release(self)


def test_the_longest_idle_connection_gives_way_the_client_own_first() -> None:
    table = ConnectionTable(max_connections=4, max_per_client=2)
    a1, a2, b1, b2 = (Conn(table, k) for k in ("a", "a", "b", "b"))
    for c in (a1, a2, b1, b2):
        assert table.admit(c) is None
    table.set_busy(a1)
    a3 = Conn(table, "a")  # over a's cap: a's longest idle (a2; a1 is busy) gives way
    assert table.admit(a3) is None
    assert a2.dropped_for == "evicted_idle" and a1.dropped_for is None
    c1 = Conn(table, "c")  # over the node's cap: the longest idle of all (b1)
    assert table.admit(c1) is None
    assert b1.dropped_for == "evicted_idle"
    table.set_busy(a3)
    a4 = Conn(table, "a")  # a's two are busy: refused
    assert table.admit(a4) == "client_connections"
    for c in (b2, c1):
        table.set_busy(c)
    assert table.admit(Conn(table, "d")) == "connections"
    table.set_idle(b2)  # answered: idle again, the only one
    d1 = Conn(table, "d")
    assert table.admit(d1) is None and b2.dropped_for == "evicted_idle"
    assert table.open == 4 and table.per_client == {"a": 2, "c": 1, "d": 1}
