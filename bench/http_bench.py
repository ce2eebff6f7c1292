"""Produce and consume over HTTP on a 3-node cluster, next to the Python HTTP floor.

A ``LocalBrokerCluster`` (``ledgermq/local_cluster.py``: three ``python -m ledgermq`` processes on
127.0.0.1, node defaults: ``flush=sync``, uvicorn + httptools on the Raft loop) and, in
the same run, ``bench/http_floor.py``: a bare FastAPI app served the same way (one
process, uvloop, httptools) with a ``POST /echo`` and a ``GET /blob``. Every scenario
is driven by the same load generator with the same requests and concurrency, so each
broker row has a floor row next to it: what the same HTTP traffic costs when the
endpoint does nothing.

Scenarios, each ``--seconds`` long (after ``--warmup`` s that are not counted):

1. ``produce``: ``POST /v1/topics/bench/messages`` to the master with batches of
   ``--batches`` (1 and 100) messages of ``--body-size`` (1 KiB) random ASCII, from
   ``--clients`` (16 and 64) concurrent clients, each one keep-alive connection sending
   its next request as soon as the previous one is answered (i.e. after quorum commit).
   Before each, ``floor echo``: the same request bodies, ``POST /echo`` on the floor app.
2. ``consume``: ``GET /v1/topics/bench/queues/{q}/messages?max_messages=1000&offset=..``,
   one client per queue reading its queue from offset 0 until its end (or the
   ``--seconds`` are over), first on the master, then on a slave once it dispatched
   everything; each as JSON, then as record pages (``records``: ``Accept:
   application/vnd.ledgermq.records``, issue 31). These clients read only the status
   and next offset of each answer (and check one answer per queue in full): the
   broker's side. The ``+decode`` rows also decode every answer as the Python client
   does (``orjson`` and ``decode_message`` per message; ``decode_page``) and read each
   message's body and tags (``--no-consume-decode`` skips them). Then ``floor blob``:
   ``GET /blob`` answering as many bytes as the average pull answer of each format,
   from as many clients.
3. ``group pull``: ``--queues`` clients, each a consumer group of its own reading the
   topic from its first message, ``POST /v1/groups/G-k/pull`` of ``--consume-batch``
   with ``auto_commit`` (a replicated commit per pull), as JSON, then as records
   (issue 31: a record page per queue looked at). These clients count each answer's
   messages by a scan (JSON) or its header (records) and parse one answer in full.

For each: messages/s, MB/s (message bodies, 10^6 B; for the floor rows, the bodies the
same requests carried), requests/s, p50/p99 request latency, errors, the answering
node's CPU µs per message, and the CPU used by each process (from /proc) during the
measured window: the machine's cores are shared by
the three nodes, the floor app and the load generator.

The load generator runs in its own process (multiprocessing, spawn) on a uvloop loop:
``clients`` tasks, each with one keep-alive connection, each sending its next request as
soon as the last one is answered. It is a minimal HTTP/1.1 client over asyncio streams
(Content-Length framing only), not httpx, because httpx could not load even the floor
app. Measured on this 2-core VM, POSTing 1 KiB to the floor app's ``/echo`` with 64
clients: httpx.AsyncClient made ~700-950 requests/s with the load generator using
75-90 % of a core and the floor app idling at ~15 % (one client per task, its best setup;
one shared client with a pool of 64 connections made ~120 requests/s, see
encode/httpx#3215). The raw client made ~7,000-7,500 requests/s using ~30 % of a core,
and the floor app was then the busy process (70-75 %). ``--client httpx`` switches to
httpx, and each run starts with a check that drives the floor app with both clients
(``--no-client-check`` skips it), so the table shows the gap on the day.

``--pop`` runs shared consumption instead (issue 28): no floor app; a topic of
``--queues`` queues and a POP group (``start: earliest``); each of ``--repeat`` runs
produces ``--pop-messages`` (200,000) 1 KiB messages (not timed), then ``--pop-clients``
(16) consumers, each one keep-alive connection, loop ``POST /v1/groups/G/receive``
(``--pop-batch`` 32, invisible 30 s, long poll 1 s) and ``POST /v1/groups/G/ack`` of
every handle received, until the group acked the backlog (or ``--pop-seconds``; a run
also ends when no ack succeeded for ``--request-timeout``). Each run does this once per
``--pop-formats`` (``json,records``: the receives answered as JSON, then in the record
format, whose receipts the consumers read without a look at the pages). It reports messages acked
per second, receive / ack / round latencies, and CPU µs per message of the master and of
all nodes; ``--profile`` samples the master with ``py-spy record`` over the drain and
prints its top functions.

    .venv/bin/python bench/http_bench.py             # ~3 min
    .venv/bin/python bench/http_bench.py --quick     # smoke run, ~1 min
    .venv/bin/python bench/http_bench.py --pop --repeat 3 [--profile]   # ~1-2 min
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import orjson
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledgermq.client import fetch as record_pages
from ledgermq.client.records import MEDIA_TYPE as RECORDS
from ledgermq.client.records import record_request
from ledgermq.client.types import decode_message
from ledgermq.local_cluster import LocalBrokerCluster
from ledgermq.processes import free_ports

FLOOR_SCRIPT = Path(__file__).resolve().parent / "http_floor.py"
TOPIC = "bench"
POP_GROUP = "bench-pop"
HOST = "127.0.0.1"
_CHILDREN: list[subprocess.Popen[bytes]] = []


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ---- the load generator (runs in its own process) --------------------------------------------


class HttpError(Exception):
    """The answer could not be read (counted as an error, the connection is reopened)."""


class WrongAnswerError(RuntimeError):
    """An answer that does not match its request: the scenario stops."""


# A request: (path and query, the raw request head, the body), ready to send as is.
Request = tuple[str, bytes, bytes]


class RawConnection:
    """One HTTP/1.1 keep-alive connection over asyncio streams: send a request, read the
    answer framed by its Content-Length (uvicorn answers every response of ours with
    one). No chunked bodies, no redirects, no TLS: just enough to load a local server
    without the client's own work being the limit (see the module docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self.close()
        self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    async def aclose(self) -> None:
        self.close()

    async def request(self, req: Request) -> tuple[int, bytes]:
        if self.w is None:
            await self.connect()
        assert self.r is not None and self.w is not None
        self.w.write(req[1] + req[2])
        head = await self.r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        low = head.lower()
        i = low.find(b"\r\ncontent-length:")
        if i >= 0:
            j = low.index(b"\r\n", i + 2)
            body = await self.r.readexactly(int(head[i + 17 : j]))
        else:
            body = await self.read_unsized_body(low)
        if b"\r\nconnection: close" in low:
            self.close()
        return status, body

    async def read_unsized_body(self, low_head: bytes) -> bytes:
        """The body of an answer without Content-Length (``low_head``: its head, lower
        case): refused here; a subclass may read another framing."""
        self.close()
        raise HttpError("answer without Content-Length")


class HttpxConnection:
    """The same, through ``httpx.AsyncClient``: one client (so one keep-alive connection)
    per concurrent client, its fastest setup here. One client shared by all (a pool of
    ``clients`` connections) was slower still: ~120 req/s at 64 clients against ~930
    (encode/httpx#3215: the pool's bookkeeping grows with the connections)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.client = httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=timeout)

    def close(self) -> None:
        pass  # httpx reconnects by itself

    async def aclose(self) -> None:
        await self.client.aclose()

    async def request(self, req: Request) -> tuple[int, bytes]:
        if req[2]:
            ct = RECORDS if RECORDS.encode() in req[1] else "application/json"
            r = await self.client.post(req[0], content=req[2], headers={"content-type": ct})
        else:
            page = f"accept: {record_pages.MEDIA_TYPE}".encode()
            headers = {"accept": record_pages.MEDIA_TYPE} if page in req[1].lower() else {}
            r = await self.client.get(req[0], headers=headers)
        return r.status_code, r.content


def _post_head(
    host: str, port: int, path: str, n: int, content_type: str = "application/json"
) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {n}\r\n\r\n"
    ).encode()


def _bodies(
    batch: int,
    body_size: int,
    pool: int,
    fields: dict[str, Any] | None = None,
    records: bool = False,
) -> list[bytes]:
    """``pool`` produce request bodies of ``batch`` random ASCII messages each, every
    message with ``fields`` besides its body (``{"delay_ms": ...}``: bench/delay_bench.py);
    with ``records``, in the record format (docs/http.md) as the client sends it."""
    out = []
    rnd = os.urandom(pool * batch * body_size)  # base64 of random bytes: valid UTF-8/JSON
    text = base64.b64encode(rnd).decode("ascii")
    k = 0
    for _ in range(pool):
        msgs = []
        for _ in range(batch):
            msgs.append({"body": text[k : k + body_size], **(fields or {})})
            k += body_size
        if records:
            encoded = record_request([m["body"] for m in msgs])
            assert encoded is not None and not encoded[1]
            out.append(encoded[0])
        else:
            out.append(orjson.dumps({"messages": msgs}))
    return out


@dataclass
class Tally:
    """What the clients of one scenario saw inside the measured window."""

    latencies: list[float] = field(default_factory=list)
    requests: int = 0
    messages: int = 0
    response_bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def answered(self, latency: float, messages: int, response_bytes: int = 0) -> None:
        """One answered request inside the window."""
        self.latencies.append(latency)
        self.requests += 1
        self.messages += messages
        self.response_bytes += response_bytes


@dataclass
class PopTally:
    """What the consumers of a POP drain saw, besides ``Tally`` (whose latencies are
    then whole rounds, a receive and its ack, and whose messages are the acked ones)."""

    receive_latencies: list[float] = field(default_factory=list)
    ack_latencies: list[float] = field(default_factory=list)
    receives: int = 0
    empty: int = 0  # receives answered with no message
    acks: int = 0
    acked: int = 0  # handles the acks answered OK: the messages consumed
    invalid: int = 0  # handles the acks answered INVALID_RECEIPT_HANDLE
    redelivered: int | None = 0  # messages received with delivery_attempt > 1 (None: unknown)

    def figures(self) -> dict[str, Any]:
        return {
            "receives": self.receives,
            "empty_receives": self.empty,
            "acks": self.acks,
            "acked": self.acked,
            "invalid_handles": self.invalid,
            "redelivered": self.redelivered,
            "receive_p50_ms": _ms(_pct(self.receive_latencies, 0.50)),
            "receive_p99_ms": _ms(_pct(self.receive_latencies, 0.99)),
            "ack_p50_ms": _ms(_pct(self.ack_latencies, 0.50)),
            "ack_p99_ms": _ms(_pct(self.ack_latencies, 0.99)),
        }


HANDLE = re.compile(rb'"receipt_handle":"([^"]+)"')
ACK_TRIES = 3  # an ack that fails is sent again (a handle already acked answers INVALID)


def _pull_next(data: bytes) -> tuple[str, int]:
    """(status, next_offset) of a pull answer without parsing its ~1 MB of messages:
    orjson keeps the key order of ``api.app.pull``, status first, next_offset after the
    messages."""
    i = data.find(b'"status":"')
    status = data[i + 10 : data.index(b'"', i + 10)].decode()
    i = data.rfind(b'"next_offset":')
    return status, int(data[i + 14 : data.index(b",", i)])


def _page_next(data: bytes) -> tuple[str, int]:
    """(status, next_offset) of a record page (docs/formats.md "Record pages"): its
    header block, without a look at the records."""
    _, _, status, _, next_offset, _, _, _, _ = record_pages.HEADER.unpack_from(data)
    return record_pages.STATUSES[status], next_offset


def _json_receipts(data: bytes) -> tuple[list[bytes], int]:
    """The receipt handles of a JSON receive answer and how many of its messages are
    first deliveries, by a scan (no parse)."""
    return HANDLE.findall(data), data.count(b'"delivery_attempt":1,')


def _receipts(data: bytes) -> tuple[list[bytes], int]:
    """The same of a receive answered in the record format (docs/formats.md "Record
    pages of many queues"): its receipts, read without a look at the pages."""
    _, _, _, n = record_pages.GROUP_HEADER.unpack_from(data)
    at, handles, firsts = record_pages.GROUP_HEADER.size, [], 0
    unpack = record_pages.RECEIPT.unpack_from
    for _ in range(n):
        attempt, _, length = unpack(data, at)
        at += record_pages.RECEIPT.size
        handles.append(data[at : at + length])
        at += length
        firsts += attempt == 1
    return handles, firsts


def _decode_all(data: bytes, records: bool) -> int:
    """What the Python client makes of a pull answer, every message's body and tags
    read (a consumer's least): the messages' count."""
    if records:
        messages = record_pages.decode_page(data).result.messages
    else:
        messages = [decode_message(m) for m in orjson.loads(data)["messages"]]
    for m in messages:
        _ = m.body, m.tags
    return len(messages)


class LoadGen:
    def __init__(self, spec: dict[str, Any], progress: Any, conn: Connection) -> None:
        self.spec = spec
        self.progress = progress
        self.conn = conn
        self.tally = Tally()
        self.measure_from = 0.0
        self.stop_at = 0.0
        self.pull_done = 0.0  # the last counted answer of a read to the end (pull, pop)
        self.window_started = False
        self.budget: int | None = spec.get("max_messages")  # messages left to send (a fill)
        self.pop = PopTally()
        self.last_ack = 0.0  # (a POP drain ends when no ack succeeds for request_timeout)

    def _in_window(self, t: float) -> bool:
        return self.measure_from <= t <= self.stop_at

    def _take(self) -> bool:
        """One batch from the message budget (a fill); always True without one."""
        if self.budget is None:
            return True
        if self.budget < self.spec["batch"]:
            return False
        self.budget -= self.spec["batch"]
        return True

    def _give_back(self) -> None:
        """A batch taken by ``_take`` was not stored: it is sent again."""
        if self.budget is not None:
            self.budget += self.spec["batch"]

    async def _connect(self) -> RawConnection | HttpxConnection:
        """A client's connection, made before the clock starts (an httpx client builds
        its SSL context when it is created: ~25 ms of CPU each)."""
        s = self.spec
        if s["client"] == "httpx":
            return HttpxConnection(s["host"], s["port"], s["request_timeout"])
        c = RawConnection(s["host"], s["port"])
        await c.connect()
        return c

    async def _one(
        self, conn: RawConnection | HttpxConnection, req: Request
    ) -> tuple[int, bytes] | None:
        """Send ``req``; errors are counted (in the window) and answered with None."""
        s = self.spec
        try:
            async with asyncio.timeout(s["request_timeout"]):
                status, data = await conn.request(req)
        except (OSError, EOFError, asyncio.IncompleteReadError, HttpError, TimeoutError) as e:
            conn.close()
            if self._in_window(time.monotonic()):
                self.tally.error(type(e).__name__)
            await asyncio.sleep(0.01)
            return None
        except httpx.HTTPError as e:
            if self._in_window(time.monotonic()):
                self.tally.error(type(e).__name__)
            await asyncio.sleep(0.01)
            return None
        if status != 200:
            if self._in_window(time.monotonic()):
                self.tally.error(f"HTTP {status}")
            await asyncio.sleep(0.05)  # 307/503 during an election: do not spin
            return None
        return status, data

    async def post_client(
        self, k: int, conn: RawConnection | HttpxConnection, reqs: list[Request]
    ) -> None:
        s = self.spec
        checked = False
        i = k
        try:
            while time.monotonic() < self.stop_at and self._take():
                req = reqs[i % len(reqs)]
                i += 1
                t0 = time.monotonic()
                got = await self._one(conn, req)
                t1 = time.monotonic()
                if got is None:
                    self._give_back()
                    continue
                if not checked and s["kind"] == "produce":
                    runs = orjson.loads(got[1]).get("runs")  # (results=runs: the records rows)
                    n = got[1].count(b'"msg_id"') if runs is None else sum(r[3] for r in runs)
                    if n != s["batch"]:
                        raise WrongAnswerError(
                            f"produce answered {n} results for {s['batch']} messages"
                        )
                    checked = True
                self.progress.value += 1
                if self._in_window(t1):
                    self.tally.answered(t1 - t0, s["batch"], len(got[1]))
        finally:
            await conn.aclose()

    async def pull_client(self, queue: int, conn: RawConnection | HttpxConnection) -> None:
        s = self.spec
        offset = 0
        checked = False
        records, decode = bool(s.get("records")), bool(s.get("decode"))
        accept = f"Accept: {record_pages.MEDIA_TYPE}\r\n" if records else ""
        try:
            while time.monotonic() < self.stop_at:
                path = (
                    f"/v1/topics/{s['topic']}/queues/{queue}/messages"
                    f"?offset={offset}&max_messages={s['batch']}"
                )
                head = (
                    f"GET {path} HTTP/1.1\r\nHost: {s['host']}:{s['port']}\r\n{accept}\r\n"
                ).encode()
                t0 = time.monotonic()
                got = await self._one(conn, (path, head, b""))
                if got is not None and decode:
                    _decode_all(got[1], records)
                t1 = time.monotonic()
                if got is None:
                    continue
                data = got[1]
                status, nxt = _page_next(data) if records else _pull_next(data)
                n = nxt - offset
                if status == "FOUND" and not checked:  # parse one answer per queue in full
                    if records:
                        msgs = record_pages.decode_page(data).result.messages
                        bodies, first = [m.body for m in msgs], msgs[0].queue_offset
                    else:
                        doc = orjson.loads(data)["messages"]
                        bodies, first = [m["body"] for m in doc], doc[0]["queue_offset"]
                    if len(bodies) != n or len(bodies[0]) != s["body_size"] or first != offset:
                        raise WrongAnswerError(f"queue {queue}: pull answer does not add up")
                    checked = True
                self.progress.value += 1
                if status != "FOUND" or n <= 0:
                    if status not in ("NO_NEW_MSG", "FOUND"):
                        self.tally.error(status)
                    break
                offset = nxt
                if self._in_window(t1):
                    self.tally.answered(t1 - t0, n, len(data))
                    self.pull_done = max(self.pull_done, t1)
        finally:
            await conn.aclose()

    async def group_client(self, k: int, conn: RawConnection | HttpxConnection) -> None:
        """A consumer group of its own (``group``-``k``): group pulls of ``batch`` from its
        committed offsets with ``auto_commit`` (a commit per pull), as JSON or records,
        until a pull finds nothing (the group read the topic) or the time is up."""
        s = self.spec
        records = bool(s.get("records"))
        path = f"/v1/groups/{s['group']}-{k}/pull"
        body = orjson.dumps({"topic": s["topic"], "max_messages": s["batch"], "auto_commit": True})
        head = _post_head(s["host"], s["port"], path, len(body))
        if records:
            head = head[:-2] + f"Accept: {record_pages.MEDIA_TYPE}\r\n\r\n".encode()
        req = (path, head, body)
        checked = False
        try:
            while time.monotonic() < self.stop_at:
                t0 = time.monotonic()
                got = await self._one(conn, req)
                t1 = time.monotonic()
                if got is None:
                    continue
                data = got[1]
                if records:
                    n = record_pages.GROUP_HEADER.unpack_from(data)[3]
                else:
                    n = data.count(b'"queue_offset":')
                if n and not checked:  # one answer per client parsed in full
                    if records:
                        msgs = [
                            m for p in record_pages.decode_group(data) for m in p.result.messages
                        ]
                        bodies = [m.body for m in msgs]
                    else:
                        bodies = [m["body"] for m in orjson.loads(data)["messages"]]
                    if len(bodies) != n or any(len(b) != s["body_size"] for b in bodies):
                        raise WrongAnswerError(f"group {k}: a group pull does not add up")
                    checked = True
                self.progress.value += 1
                if not n:
                    break
                if self._in_window(t1):
                    self.tally.answered(t1 - t0, n, len(data))
                    self.pull_done = max(self.pull_done, t1)
        finally:
            await conn.aclose()

    async def pop_client(self, conn: RawConnection | HttpxConnection) -> None:
        """A consumer of a POP group: receive (``batch`` at most), ack every handle it
        got, again, until ``pop_messages`` were acked by all of them (or the time is
        up). A round (its latency in ``tally``) is a receive and its ack."""
        s = self.spec
        host, port, p = s["host"], s["port"], self.pop
        path = f"/v1/groups/{s['group']}/receive"
        body = orjson.dumps(
            {
                "topic": s["topic"],
                "max_messages": s["batch"],
                "invisible_ms": s["invisible_ms"],
                "wait_ms": s["wait_ms"],
            }
        )
        records = bool(s.get("records"))
        head = _post_head(host, port, path, len(body))
        if records:  # (issue 31: the answer in the record format)
            head = head[:-2] + f"Accept: {record_pages.MEDIA_TYPE}\r\n\r\n".encode()
        receive = (path, head, body)
        ack_path = f"/v1/groups/{s['group']}/ack"
        ack_head = b'{"topic":' + orjson.dumps(s["topic"]) + b',"receipt_handles":["'
        checked = False
        try:
            while time.monotonic() < self.stop_at and p.acked < s["pop_messages"]:
                if time.monotonic() - self.last_ack > s["request_timeout"]:
                    break  # nothing acked for that long (the master moved?): the run ends
                t0 = time.monotonic()
                got = await self._one(conn, receive)
                t1 = time.monotonic()
                if got is None:
                    continue
                data = got[1]
                handles, firsts = _receipts(data) if records else _json_receipts(data)
                p.receives += 1
                if not handles:
                    p.empty += 1  # the long poll waited, or the rest is with others
                    if not s["wait_ms"]:
                        await asyncio.sleep(0.01)
                    continue
                p.receive_latencies.append(t1 - t0)  # (an empty one waited its wait_ms)
                if not checked:
                    self._check_received(data, handles, records)
                    checked = True
                p.redelivered = (p.redelivered or 0) + len(handles) - firsts
                ack = ack_head + b'","'.join(handles) + b'"]}'
                req = (ack_path, _post_head(host, port, ack_path, len(ack)), ack)
                for _ in range(ACK_TRIES):
                    t2 = time.monotonic()
                    answer = await self._one(conn, req)
                    if answer is not None:
                        break
                else:
                    continue  # their invisible time ends: they come back, late
                t3 = time.monotonic()
                ok = answer[1].count(b'"status":"OK"')
                self._pop_round(t0, t2, t3, ok, len(handles) - ok)
        finally:
            await conn.aclose()

    def _check_received(self, data: bytes, handles: list[bytes], records: bool) -> None:
        """One receive answer per consumer parsed in full: the handles the scan found are
        the messages', whose bodies are whole."""
        if records:
            got = [
                (m.receipt_handle, len(m.body), m.delivery_attempt)
                for m in record_pages.decode_received(data)
            ]
        else:
            got = [
                (m["receipt_handle"], len(m["body"]), m["delivery_attempt"])
                for m in orjson.loads(data)["messages"]
            ]
        if [h.encode() for h, _, _ in got] != handles or any(
            size != self.spec["body_size"] or attempt < 1 for _, size, attempt in got
        ):
            raise WrongAnswerError("a receive answer does not add up")

    def _pop_round(self, t0: float, t2: float, t3: float, acked: int, invalid: int) -> None:
        """A POP round that acked: received from ``t0``, acked from ``t2`` to ``t3``."""
        p = self.pop
        self.last_ack = t3
        p.acks += 1
        p.ack_latencies.append(t3 - t2)
        p.acked += acked
        p.invalid += invalid
        if invalid and self._in_window(t3):
            self.tally.errors["INVALID_RECEIPT_HANDLE"] = (
                self.tally.errors.get("INVALID_RECEIPT_HANDLE", 0) + invalid
            )
        self.progress.value += 1
        if self._in_window(t3):
            self.tally.answered(t3 - t0, acked)
            self.pull_done = max(self.pull_done, t3)

    async def run(self) -> dict[str, Any]:
        s = self.spec
        if s["kind"] in ("pull", "pop", "group"):
            n = s["queues"] if s["kind"] == "pull" else s["clients"]
            conns = [await self._connect() for _ in range(n)]
            if s["kind"] == "pull":
                tasks = [self.pull_client(q, c) for q, c in enumerate(conns)]
            elif s["kind"] == "group":
                tasks = [self.group_client(k, c) for k, c in enumerate(conns)]
            else:
                tasks = [self.pop_client(c) for c in conns]
        elif s["kind"] == "blob":
            head = f"GET {s['path']} HTTP/1.1\r\nHost: {s['host']}:{s['port']}\r\n\r\n"
            reqs = [(s["path"], head.encode(), b"")]
            conns = [await self._connect() for _ in range(s["clients"])]
            tasks = [self.post_client(k, c, reqs) for k, c in enumerate(conns)]
        else:
            ct = RECORDS if s.get("records") else "application/json"
            reqs = [
                (s["path"], _post_head(s["host"], s["port"], s["path"], len(b), ct), b)
                for b in _bodies(
                    s["batch"], s["body_size"], s["pool"], s.get("fields"), s.get("records", False)
                )
            ]
            conns = [await self._connect() for _ in range(s["clients"])]
            tasks = [self.post_client(k, c, reqs) for k, c in enumerate(conns)]
        t0 = time.monotonic()
        self.measure_from = t0 + s["warmup"]
        self.stop_at = self.measure_from + s["seconds"]
        self.last_ack = t0
        window = asyncio.create_task(self._window_events())
        await asyncio.gather(*tasks)
        ended = time.monotonic()
        if not window.done():  # the reads or the budget ended before the time was up
            window.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await window
            if self.window_started:
                self.conn.send({"event": "window_end"})
        t = self.tally
        seconds = s["seconds"]
        if s["kind"] in ("pull", "pop", "group") and self.pull_done:
            seconds = min(seconds, self.pull_done - self.measure_from)
        elif ended < self.stop_at:  # a fill that sent its budget
            seconds = max(1e-3, ended - self.measure_from)
        result = {
            "requests": t.requests,
            "messages": t.messages,
            "seconds": round(seconds, 3),
            "req_per_s": round(t.requests / seconds, 1),
            "msgs_per_s": round(t.messages / seconds),
            "mb_per_s": round(t.messages * s["body_size"] / seconds / 1e6, 2),
            "p50_ms": _ms(_pct(t.latencies, 0.50)),
            "p99_ms": _ms(_pct(t.latencies, 0.99)),
            "max_ms": _ms(max(t.latencies, default=None)),
            "avg_response_bytes": round(t.response_bytes / t.requests) if t.requests else 0,
            "errors": sum(t.errors.values()),
            "error_kinds": t.errors,
        }
        if s["kind"] == "pop":
            result.update(self.pop.figures())
        return result

    async def _window_events(self) -> None:
        """Tell the parent when the measured window starts and ends (it samples CPU)."""
        await asyncio.sleep(max(0.0, self.measure_from - time.monotonic()))
        self.conn.send({"event": "window_start"})
        self.window_started = True
        await asyncio.sleep(max(0.0, self.stop_at - time.monotonic()))
        self.conn.send({"event": "window_end"})


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


def loadgen_main(conn: Connection, progress: Any, gen: type[LoadGen] | None = None) -> None:
    """The load generator process: one scenario per message, until None. ``gen``: the
    load generator class (``LoadGen``; bench/peerbench passes its subclass)."""
    gen = gen or LoadGen
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    import uvloop  # noqa: PLC0415

    with contextlib.suppress(EOFError, OSError):  # the parent is gone: so are we
        while True:
            spec = conn.recv()
            if spec is None:
                return
            try:
                result = uvloop.run(gen(spec, progress, conn).run())
            except Exception as e:
                conn.send({"event": "error", "error": f"{type(e).__name__}: {e}"})
            else:
                conn.send({"event": "result", "result": result})


# ---- the driver --------------------------------------------------------------------------------


def await_loadgen(
    conn: Connection,
    worker: Any,
    counter: Any,
    spec: dict[str, Any],
    name: str,
    *,
    progress: bool,
    timeout: float,
    check_alive: Callable[[], None],
    on_window: Callable[[str], None],
    width: int = 28,
) -> dict[str, Any]:
    """Send ``spec`` to the load generator process and wait for its result, with a
    progress bar (seconds and requests so far). ``on_window("window_start")`` and
    ``on_window("window_end")`` mark the measured window; ``check_alive`` runs at every
    poll (it raises if a server died). Raises when the generator fails or dies, or after
    the scenario's length + ``request_timeout`` + ``timeout`` without a result."""
    counter.value = 0
    conn.send(spec)
    total = spec["warmup"] + spec["seconds"]
    bar = tqdm(
        total=round(total, 1),
        desc=f"{name:<{width}}",
        unit="s",
        bar_format="{desc} {bar} {n:.0f}/{total:.0f} s {postfix}",
        disable=not progress,
        leave=False,
    )
    t0 = time.monotonic()
    deadline = t0 + total + spec["request_timeout"] + timeout
    try:
        while True:
            if conn.poll(0.25):
                msg = conn.recv()
                if msg["event"] in ("window_start", "window_end"):
                    on_window(msg["event"])
                elif msg["event"] == "error":
                    raise RuntimeError(f"{name}: load generator failed: {msg['error']}")
                else:
                    result: dict[str, Any] = msg["result"]
                    return result
            if not worker.is_alive():
                raise RuntimeError("the load generator process died")
            check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no result in time")
            bar.n = min(total, round(time.monotonic() - t0, 1))
            bar.set_postfix_str(f"{counter.value:,} requests", refresh=True)
    finally:
        bar.close()


def _cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return None


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) ticks of all cores since boot; busy excludes idle and iowait."""
    try:
        with open("/proc/stat", "rb") as f:
            parts = f.readline().split()[1:]
    except OSError:
        return None
    values = [int(x) for x in parts[:8]]
    total = sum(values)
    return total - values[3] - values[4], total


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


class Profiler:
    """``py-spy record`` of one process (the master) over a measured window, raw
    (collapsed) stacks aggregated by function (``--function``); ``profile_top`` sums
    them up. ``gil``: only the samples of the thread holding the GIL, i.e. the Python
    work (a thread waiting for work, or in an fsync, releases it; one sending on a
    socket from the event loop holds it); else every thread py-spy finds busy. py-spy
    pauses the process for each sample: a profiled run is slower than one without."""

    def __init__(self, pid: int, out: Path, rate: int, gil: bool = True) -> None:
        self.pid, self.out, self.rate, self.gil = pid, out, rate, gil
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def find() -> str | None:
        """py-spy on the PATH or beside this interpreter (a virtualenv's bin/)."""
        here = Path(sys.executable).parent / "py-spy"
        return shutil.which("py-spy") or (str(here) if here.exists() else None)

    def start(self) -> None:
        exe = self.find()
        if exe is None:
            raise RuntimeError("--profile: py-spy not found (pip install py-spy)")
        cmd = [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate)]
        cmd += ["--format", "raw", "--function", "--output", str(self.out)]
        if self.gil:
            cmd.append("--gil")
        with self.out.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _CHILDREN.append(self.proc)

    def stop(self) -> None:
        """SIGINT: py-spy writes what it sampled and exits (bounded wait)."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _frame_package(frame: str) -> str:
    """``func (broker/pop/service.py:120)`` -> ``broker``: the top package of a frame's
    file as py-spy shortens it (``<frozen ...>`` and the like as they are)."""
    i = frame.rfind(" (")
    where = frame[i + 2 : -1] if i >= 0 else frame
    where = where.rsplit(":", 1)[0]
    return where.split("/", 1)[0] if "/" in where else where


OWN_PACKAGES = ("api", "broker", "consumequeue", "dledger")  # (ledgermq: the node's main)


def print_profile_columns(p: dict[str, Any]) -> None:
    """A summarised profile's ``total`` and ``self`` columns (% of samples, function)
    side by side, as the benchmarks print them under their tables."""
    print("    % on the stack (total)                               % at the top (self)")
    for (f1, v1), (f2, v2) in zip(p["total"], p["self"], strict=False):
        print(f"    {v1:5.1f} {f1[:48]:<48} {v2:5.1f} {f2[:60]}")


def profile_top(path: Path, n: int) -> dict[str, Any]:
    """The ``n`` functions with the most samples of a raw py-spy profile: ``self`` (the
    function was running), ``total`` (one of the project's functions was on the stack:
    what its calls cost), in % of all samples, and the self samples summed by top
    package (``broker``, ``api``, ``starlette``, ``asyncio``, ...)."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    package: dict[str, int] = {}
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        samples += k
        frames = stack.split(";")
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + k
        pkg = _frame_package(leaf)
        package[pkg] = package.get(pkg, 0) + k
        for f in set(frames):
            if _frame_package(f) in OWN_PACKAGES:
                total[f] = total.get(f, 0) + k

    def top(table: dict[str, int]) -> list[list[Any]]:
        best = sorted(table.items(), key=lambda kv: -kv[1])[:n]
        return [[f, c, round(100 * c / samples, 1)] for f, c in best]

    return {
        "samples": samples,
        "self": top(own) if samples else [],
        "total": top(total) if samples else [],
        "self_by_package": top(package) if samples else [],
    }


class Bench:
    def __init__(self, a: argparse.Namespace, root: Path) -> None:
        self.a = a
        self.root = root
        self.progress = not a.no_progress
        extra = ["--flush", a.flush, "--data-file-mb", str(a.data_file_mb)]
        extra.append("--batch-records" if a.batch_records else "--no-batch-records")
        self.cluster = LocalBrokerCluster(3, root / "data", extra_args=extra, log_dir=root)
        self.floor: subprocess.Popen[bytes] | None = None
        self.floor_port = free_ports(1)[0]
        ctx = mp.get_context("spawn")
        self.counter = ctx.RawValue("q", 0)
        self.conn, child = ctx.Pipe()
        self.worker = ctx.Process(
            target=loadgen_main, args=(child, self.counter), name="loadgen", daemon=True
        )

    # -- children --

    def start(self, floor: bool = True) -> str:
        """Start the load generator, the nodes and (``floor``) the floor app; the
        master once the cluster is ready."""
        self.worker.start()
        self.cluster.start_all()
        _CHILDREN.extend(self.cluster.procs.values())
        if not floor:
            return self.cluster.wait_ready(timeout_s=self.a.timeout)
        with (self.root / "floor.log").open("ab") as log:
            self.floor = subprocess.Popen(
                [
                    sys.executable,
                    str(FLOOR_SCRIPT),
                    "--port",
                    str(self.floor_port),
                    "--exit-with-parent",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _CHILDREN.append(self.floor)
        master = self.cluster.wait_ready(timeout_s=self.a.timeout)
        deadline = time.monotonic() + self.a.timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{HOST}:{self.floor_port}/healthz").status_code == 200:
                    break
            if self.floor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the floor app did not start (see {self.root / 'floor.log'})")
            time.sleep(0.1)
        return master

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        if self.worker.is_alive():
            self.worker.join(timeout=2)  # it is still busy if a scenario was interrupted
        if self.worker.is_alive():
            self.worker.terminate()
            self.worker.join(timeout=5)
        if self.floor is not None and self.floor.poll() is None:
            self.floor.terminate()
            try:
                self.floor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.floor.kill()
                self.floor.wait(timeout=10)
        self.cluster.stop_all()

    def check_alive(self, server: str) -> None:
        """Stop the run if a server died: its figures would be connection errors."""
        if server == "floor":
            if self.floor is None or self.floor.poll() is not None:
                raise RuntimeError(f"the floor app exited (see {self.root / 'floor.log'})")
            return
        for n in self.cluster.ids:
            if not self.cluster.alive(n):
                raise RuntimeError(f"node {n} exited:\n" + self.cluster.log_tail(n, 20))

    # -- cluster helpers --

    def master(self) -> str:
        m = self.cluster.master()
        if m is None:
            m = self.cluster.wait_ready(timeout_s=self.a.timeout)
        return m

    def port(self, node: str) -> int:
        return self.cluster.http_ports[self.cluster.ids.index(node)]

    def term(self, node: str) -> int | None:
        info = self.cluster.cluster_info(node)
        return None if info is None else int(info["term"])

    def create_topic(self, master: str) -> None:
        r = httpx.post(
            self.cluster.urls[master] + "/v1/topics",
            json={"name": TOPIC, "queues": self.a.queues},
            timeout=self.a.timeout,
        )
        r.raise_for_status()

    def wait_dispatched(self, node: str, master: str) -> None:
        """Wait until ``node`` dispatched everything the master committed."""
        target = self.cluster.cluster_info(master)
        assert target is not None
        deadline = time.monotonic() + self.a.timeout
        while True:
            info = self.cluster.cluster_info(node)
            if info is not None and info["dispatched_index"] >= target["committed_index"]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node} did not dispatch up to the master in time")
            time.sleep(0.1)

    def topic_messages(self, node: str) -> int:
        r = httpx.get(self.cluster.urls[node] + f"/v1/topics/{TOPIC}", timeout=self.a.timeout)
        r.raise_for_status()
        return sum(q["max_offset"] - q["min_offset"] for q in r.json()["queues"])

    def create_pop_group(self, master: str) -> None:
        """The POP group of ``--pop``, reading every queue from its first message."""
        r = httpx.put(
            self.cluster.urls[master] + f"/v1/groups/{POP_GROUP}",
            json={"mode": "pop", "start": "earliest"},
            timeout=self.a.timeout,
        )
        r.raise_for_status()

    def pop_backlog(self, node: str) -> int:
        """Messages of the topic the POP group has not acked yet: each queue's lag, or
        all of a queue it never received from."""
        url = self.cluster.urls[node]
        r = httpx.get(url + f"/v1/topics/{TOPIC}", timeout=self.a.timeout)
        r.raise_for_status()
        queues = {q["queue_id"]: q["max_offset"] - q["min_offset"] for q in r.json()["queues"]}
        r = httpx.get(
            url + f"/v1/groups/{POP_GROUP}/offsets", params={"topic": TOPIC}, timeout=self.a.timeout
        )
        r.raise_for_status()
        for q in r.json()["offsets"]:
            queues[q["queue_id"]] = q["lag"]
        return sum(queues.values())

    # -- one scenario --

    def pids(self, server: str) -> dict[str, int]:
        """The processes whose CPU a scenario reports: the server(s), the load generator."""
        out: dict[str, int] = {}
        if server == "floor":
            assert self.floor is not None
            out["floor"] = self.floor.pid
        else:
            out.update({n: p.pid for n, p in self.cluster.procs.items()})
        assert self.worker.pid is not None
        out["loadgen"] = self.worker.pid
        return out

    def scenario(
        self,
        name: str,
        kind: str,
        server: str,
        *,
        path: str = "",
        batch: int = 1,
        clients: int = 1,
        client: str | None = None,
        warmup: float | None = None,
        fields: dict[str, Any] | None = None,
        seconds: float | None = None,
        extra: dict[str, Any] | None = None,
        profiler: Profiler | None = None,
    ) -> dict[str, Any]:
        """One scenario on ``server``; ``extra``: more fields of the load generator's
        spec; ``profiler``: started and stopped with the measured window."""
        a = self.a
        port = self.floor_port if server == "floor" else self.port(server)
        spec = {
            "kind": kind,
            "host": HOST,
            "port": port,
            "path": path,
            "topic": TOPIC,
            "queues": a.queues,
            "batch": batch,
            "clients": clients,
            "body_size": a.body_size,
            "pool": a.pool,
            "seconds": a.seconds if seconds is None else seconds,
            "warmup": a.warmup if warmup is None else warmup,
            "client": client or a.client,
            "request_timeout": a.request_timeout,
            "fields": fields,
            **(extra or {}),
        }
        self.check_alive(server)
        pids = self.pids(server)
        term0 = None if server == "floor" else self.term(server)
        cpu0: dict[str, int | None] = {}
        cpu: dict[str, float] = {}
        cpu_s: dict[str, float] = {}  # CPU seconds in the window
        machine: dict[str, Any] = {}  # the whole machine's busy share, load average
        t_start = time.monotonic()
        m0 = machine_ticks()

        def on_window(event: str) -> None:
            nonlocal cpu0, t_start, m0
            if event == "window_start":
                t_start = time.monotonic()
                cpu0 = {k: _cpu_ticks(p) for k, p in pids.items()}
                m0 = machine_ticks()
                machine["loadavg_start"] = _loadavg()
                if profiler is not None:
                    profiler.start()
                return
            dt = time.monotonic() - t_start
            tck = os.sysconf("SC_CLK_TCK")
            for k, p in pids.items():
                c1, c0 = _cpu_ticks(p), cpu0.get(k)
                if c1 is not None and c0 is not None and dt > 0:
                    cpu[k] = round((c1 - c0) / tck / dt * 100)
                    cpu_s[k] = (c1 - c0) / tck
            m1 = machine_ticks()
            if m0 is not None and m1 is not None and m1[1] > m0[1]:
                machine["busy_pct"] = round((m1[0] - m0[0]) / (m1[1] - m0[1]) * 100, 1)
            machine["loadavg_end"] = _loadavg()
            if profiler is not None:
                profiler.stop()

        try:
            result = await_loadgen(
                self.conn,
                self.worker,
                self.counter,
                spec,
                name,
                progress=self.progress,
                timeout=a.timeout,
                check_alive=lambda: self.check_alive(server),
                on_window=on_window,
            )
        finally:
            if profiler is not None:
                profiler.stop()
        row: dict[str, Any] = {
            "scenario": name,
            "server": server,
            "kind": kind,
            "batch": batch,
            "clients": clients,
            "client": spec["client"],
            **result,
            "cpu_pct": cpu,
            "cpu_s": cpu_s,
            "machine": machine,
        }
        if server != "floor":
            term1 = self.term(server)
            row["term_changed"] = term0 is not None and term1 != term0
            msgs = row["messages"]
            row["node_cpu_us_per_msg"] = (
                round(cpu_s[server] / msgs * 1e6, 1) if msgs and server in cpu_s else None
            )
        line = (
            f"{name}: {row['msgs_per_s']:,} msg/s, {row['req_per_s']:,} req/s, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, errors {row['errors']}"
            + (f" {row['error_kinds']}" if row["errors"] else "")
            + ", CPU% "
            + " ".join(f"{k} {v}" for k, v in cpu.items())
        )
        print(line, file=sys.stderr)
        return row


def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    b = Bench(a, root)
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {
        "settings": {k: str(v) for k, v in vars(a).items()},
        "machine": {"cpus": os.cpu_count()},
        "scenarios": rows,
    }

    def add(group: str, row: dict[str, Any], floor: dict[str, Any] | None = None) -> None:
        row["group"] = group
        if floor is not None:
            row["floor"] = floor["scenario"]
            row["vs_floor"] = (
                round(row["req_per_s"] / floor["req_per_s"], 3) if floor["req_per_s"] else None
            )
        rows.append(row)

    def profiler_for(name: str, node: str) -> Profiler | None:
        """--profile: py-spy on ``node`` over a row's measured window."""
        if not a.profile:
            return None
        out = (a.profile_dir or root) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        return Profiler(b.cluster.procs[node].pid, out, a.profile_rate, a.profile_gil)

    def profiled(r: dict[str, Any], profiler: Profiler | None, node: str) -> dict[str, Any]:
        if profiler is not None:
            r["master"] = node
            r["profile"] = profile_top(profiler.out, a.profile_top)
            r["profile"]["file"] = str(profiler.out) if a.profile_dir else None
        return r

    try:
        master = b.start()
        print(f"cluster ready, master {master}; floor app on :{b.floor_port}", file=sys.stderr)
        b.create_topic(master)
        if not a.no_client_check and a.client == "raw":
            c = max(a.clients)
            for client in ("httpx", "raw"):
                r = b.scenario(
                    f"floor echo b=1 c={c} ({client})",
                    "echo",
                    "floor",
                    path="/echo",
                    clients=c,
                    client=client,
                )
                add("load generator check: the floor app driven by each client", r)
        for batch in a.batches:
            for c in a.clients:
                floor = b.scenario(
                    f"floor echo b={batch} c={c}",
                    "echo",
                    "floor",
                    path="/echo",
                    batch=batch,
                    clients=c,
                )
                add("produce", floor)
                master = b.master()
                profiler = profiler_for(f"produce-b{batch}-c{c}", master)
                r = b.scenario(
                    f"produce b={batch} c={c}",
                    "produce",
                    master,
                    path=f"/v1/topics/{TOPIC}/messages",
                    batch=batch,
                    clients=c,
                    profiler=profiler,
                )
                add("produce", profiled(r, profiler, master), floor)
                if batch > 1:  # the record format (issue 31): the same bodies, no JSON
                    master = b.master()
                    profiler = profiler_for(f"produce-records-b{batch}-c{c}", master)
                    r = b.scenario(
                        f"produce records b={batch} c={c}",
                        "produce",
                        master,
                        path=f"/v1/topics/{TOPIC}/messages?results=runs",
                        batch=batch,
                        clients=c,
                        extra={"records": True},
                        profiler=profiler,
                    )
                    add("produce", profiled(r, profiler, master), floor)
        master = b.master()
        b.wait_dispatched(master, master)
        results["consume_available_messages"] = b.topic_messages(master)
        # JSON, then record pages (issue 31: the stored records and an offset table),
        # each read by the raw client without decoding (the broker's side), then read
        # by the Python client's decoders (every message's body and tags read).
        formats = (("", {}), (" records", {"records": True}))
        pulls = []
        for k, (label, extra) in enumerate(formats):
            profiler = profiler_for(f"consume-master-{k}", master)
            r = b.scenario(
                f"consume master b={a.consume_batch}{label}",
                "pull",
                master,
                batch=a.consume_batch,
                clients=a.queues,
                warmup=0.0,
                extra=extra,
                profiler=profiler,
            )
            pulls.append(profiled(r, profiler, master))
        floors = []
        for r in pulls:
            size = max(2, r["avg_response_bytes"])
            floors.append(
                b.scenario(
                    f"floor blob {size / 1e6:.2f} MB",
                    "blob",
                    "floor",
                    path=f"/blob?size={size}",
                    batch=0,
                    clients=a.queues,
                    warmup=0.0,
                )
            )
        slave = next(n for n in b.cluster.ids if n != master and b.cluster.alive(n))
        b.wait_dispatched(slave, master)
        for label, extra in formats:
            pulls.append(
                b.scenario(
                    f"consume slave b={a.consume_batch}{label}",
                    "pull",
                    slave,
                    batch=a.consume_batch,
                    clients=a.queues,
                    warmup=0.0,
                    extra=extra,
                )
            )
        if a.consume_decode:
            for label, extra in formats:
                pulls.append(
                    b.scenario(
                        f"consume master b={a.consume_batch}{label} +decode",
                        "pull",
                        master,
                        batch=a.consume_batch,
                        clients=a.queues,
                        warmup=0.0,
                        extra={**extra, "decode": True},
                    )
                )
        for floor in floors:
            add("consume", floor)
        for r in pulls:
            add("consume", r, floors[1 if r["scenario"].find(" records") > 0 else 0])
        # Group pulls (issue 31): a group per client from the earliest message, each
        # pull auto-committed, JSON then records (a page per queue looked at).
        for label, extra in formats:
            r = b.scenario(
                f"group pull b={a.consume_batch}{label}",
                "group",
                b.master(),
                batch=a.consume_batch,
                clients=a.queues,
                warmup=0.0,
                extra={**extra, "group": f"bench-g-{label.strip() or 'json'}"},
            )
            add("group pull (auto_commit), a group per client", r)
    finally:
        b.close()
    return results


def run_pop(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``--pop``: ``--repeat`` runs, each producing ``--pop-messages`` to the topic (not
    timed) and draining them through the POP group with ``--pop-clients`` consumers."""
    b = Bench(a, root)
    fills: list[dict[str, Any]] = []
    drains: list[dict[str, Any]] = []
    results: dict[str, Any] = {
        "mode": "pop",
        "settings": {k: str(v) for k, v in vars(a).items()},
        "machine": {"cpus": os.cpu_count()},
        "fills": fills,
        "scenarios": drains,
    }
    try:
        master = b.start(floor=False)
        print(f"cluster ready, master {master}", file=sys.stderr)
        b.create_topic(master)
        b.create_pop_group(master)
        runs = [(k, fmt) for k in range(1, a.repeat + 1) for fmt in a.pop_formats]
        for k, fmt in runs:
            label = "" if fmt == "json" else f" {fmt}"
            master = b.master()
            fill = b.scenario(
                f"fill {a.pop_messages:,} ({k}{label})",
                "produce",
                master,
                path=f"/v1/topics/{TOPIC}/messages",
                batch=a.pop_fill_batch,
                clients=a.pop_fill_clients,
                warmup=0.0,
                seconds=a.pop_seconds,
                extra={"max_messages": a.pop_messages},
            )
            fills.append(fill)
            b.wait_dispatched(master, master)
            backlog = b.pop_backlog(master)
            profiler = None
            if a.profile:
                out = (a.profile_dir or root) / f"pop-master-{k}{label.replace(' ', '-')}.txt"
                out.parent.mkdir(parents=True, exist_ok=True)
                profiler = Profiler(b.cluster.procs[master].pid, out, a.profile_rate, a.profile_gil)
            row = b.scenario(
                f"pop run {k}{label}",
                "pop",
                master,
                batch=a.pop_batch,
                clients=a.pop_clients,
                warmup=0.0,
                seconds=a.pop_seconds,
                extra={
                    "group": POP_GROUP,
                    "invisible_ms": a.pop_invisible_ms,
                    "wait_ms": a.pop_wait_ms,
                    "pop_messages": backlog,
                    "records": fmt == "records",
                },
                profiler=profiler,
            )
            row["backlog"] = backlog
            row["left"] = b.pop_backlog(master)
            row["master"] = master
            acked, cpu_s = row["acked"], row["cpu_s"]
            nodes = [cpu_s[n] for n in b.cluster.ids if n in cpu_s]
            row["master_cpu_us_per_msg"] = (
                round(cpu_s[master] / acked * 1e6, 1) if acked and master in cpu_s else None
            )
            row["nodes_cpu_us_per_msg"] = round(sum(nodes) / acked * 1e6, 1) if acked else None
            if profiler is not None and profiler.out.exists():
                row["profile"] = profile_top(profiler.out, a.profile_top)
                row["profile"]["file"] = str(profiler.out) if a.profile_dir else None
            drains.append(row)
    finally:
        b.close()
    return results


def print_pop_table(a: argparse.Namespace, results: dict[str, Any]) -> None:
    print(
        f"\nPOP receive + ack: 3 nodes on 127.0.0.1 (flush={a.flush}), a topic of {a.queues} "
        f"queues, {a.body_size} B bodies, {os.cpu_count()} CPUs shared by all processes.\n"
        f"  Each run: {a.pop_messages:,} messages produced (batches of {a.pop_fill_batch}, "
        f"not timed), then {a.pop_clients} consumers, each one keep-alive connection "
        f"({a.client} client), receive\n  (max_messages {a.pop_batch}, invisible_ms "
        f"{a.pop_invisible_ms}, wait_ms {a.pop_wait_ms}) then ack of every handle received, "
        "until the group acked the backlog.\n"
        "  msg/s: messages acked OK / seconds from the first receive to the last ack. "
        "round: a receive and its ack.\n  CPU µs/msg: CPU time (/proc utime+stime) over the "
        "drain / messages acked; master: the node answering, nodes: all three.\n"
        "  busy%: all cores, anyone's work (other processes of the machine included); "
        "load: the 1-minute load average at the end."
    )
    hdr = (
        f"  {'run':<18}{'acked':>9}{'s':>7}{'msg/s':>8}{'receive p50/p99':>17}"
        f"{'ack p50/p99':>14}{'round p50/p99':>15}{'empty':>7}{'redeliv':>8}{'errors':>7}"
        f"{'master µs/msg':>14}{'nodes µs/msg':>13}{'busy%':>7}{'load':>6}  CPU%"
    )
    print()
    print(hdr)

    def pair(r: dict[str, Any], k: str) -> str:
        return f"{_fmt(r[k + '_p50_ms'], '.1f')}/{_fmt(r[k + '_p99_ms'], '.1f')}"

    for r in results["scenarios"]:
        cpu = " ".join(f"{k} {v}" for k, v in r["cpu_pct"].items())
        err = f"{r['errors']}" + ("!" if r.get("term_changed") else "")
        print(
            f"  {r['scenario']:<18}{r['acked']:>9,}{r['seconds']:>7.1f}{r['msgs_per_s']:>8,}"
            f"{pair(r, 'receive'):>17}{pair(r, 'ack'):>14}"
            f"{_fmt(r['p50_ms'], '.1f') + '/' + _fmt(r['p99_ms'], '.1f'):>15}"
            f"{r['empty_receives']:>7}{_fmt(r['redelivered']):>8}{err:>7}"
            f"{_fmt(r['master_cpu_us_per_msg'], '.1f'):>14}"
            f"{_fmt(r['nodes_cpu_us_per_msg'], '.1f'):>13}"
            f"{_fmt(r['machine'].get('busy_pct'), '.0f'):>7}"
            f"{_fmt(r['machine'].get('loadavg_end'), '.1f'):>6}  {cpu}"
        )
    for r in results["scenarios"]:
        if r["left"] or r["errors"]:
            print(
                f"  {r['scenario']}: {r['left']:,} of {r['backlog']:,} messages left unacked; "
                f"errors {r['error_kinds']}"
            )
    if any(r.get("term_changed") for r in results["scenarios"]):
        print("  !: the Raft term changed during the run (a leader election under load)")
    fills = results["fills"]
    if fills:
        print(
            "  fills (not part of the figures): "
            + ", ".join(f"{f['msgs_per_s']:,} msg/s" for f in fills)
        )
    print_profiles(a, results)


def print_profiles(a: argparse.Namespace, results: dict[str, Any]) -> None:
    """The profiles of the rows that have one (``--profile``), under the table."""
    for r in results["scenarios"]:
        prof = r.get("profile")
        if not prof or not prof["samples"]:
            continue
        print(
            f"\n  {r['scenario']}: py-spy profile of the master ({r['master']}), "
            f"{prof['samples']:,} samples at {a.profile_rate} Hz"
            + (" holding the GIL" if a.profile_gil else "")
            + "; % of samples"
            + (f"; raw stacks: {prof['file']}" if prof.get("file") else "")
        )
        for title, key in (
            ("self (running)", "self"),
            ("total (on the stack; the project's functions)", "total"),
            ("self by package", "self_by_package"),
        ):
            print(f"    {title}:")
            for frame, _count, pct in prof[key]:
                print(f"      {pct:5.1f}  {frame}")


def _fmt(x: Any, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def print_table(a: argparse.Namespace, results: dict[str, Any]) -> None:
    print(
        f"\nHTTP: 3 nodes on 127.0.0.1 (flush={a.flush}, batch records {a.batch_records}), "
        f"{a.body_size} B bodies, {a.queues} queues, {a.seconds:g} s per scenario "
        f"(+{a.warmup:g} s warm-up for POSTs), "
        f"{os.cpu_count()} CPUs shared by all processes, load generator: {a.client}"
    )
    print(
        "  floor rows: the bare FastAPI app (bench/http_floor.py), same requests and clients;\n"
        "  their msg/s and MB/s count the messages those requests carried. b: messages per\n"
        "  request, c: concurrent clients (keep-alive connections). vs floor: req/s of the\n"
        "  row / req/s of its floor row. CPU%: per process over the measured window (100 =\n"
        "  one core); node: the node answering (the others only replicate). node µs/msg:\n"
        "  that node's CPU time (/proc utime+stime) in the window / messages."
    )
    hdr = (
        f"  {'scenario':<30}{'node':>6}{'msg/s':>9}{'MB/s':>7}{'req/s':>8}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'errors':>7}{'vs floor':>9}{'node µs/msg':>12}  CPU%"
    )
    group = None
    for r in results["scenarios"]:
        if r["group"] != group:
            group = r["group"]
            print(f"\n  {group}")
            print(hdr)
        blob = r["kind"] == "blob"
        msgs = "-" if blob else f"{r['msgs_per_s']:,}"
        mb = "-" if blob else f"{r['mb_per_s']:.1f}"
        cpu = " ".join(f"{k} {v}" for k, v in r["cpu_pct"].items())
        err = f"{r['errors']}" + ("!" if r.get("term_changed") else "")
        node = "floor" if r["server"] == "floor" else r["server"]
        print(
            f"  {r['scenario']:<30}{node:>6}{msgs:>9}{mb:>7}{r['req_per_s']:>8,.0f}"
            f"{_fmt(r['p50_ms'], '.1f'):>8}{_fmt(r['p99_ms'], '.1f'):>8}{err:>7}"
            f"{_fmt(r.get('vs_floor'), '.2f'):>9}{_fmt(r.get('node_cpu_us_per_msg'), '.1f'):>12}"
            f"  {cpu}"
        )
    if any(r.get("term_changed") for r in results["scenarios"]):
        print("  !: the Raft term changed during the scenario (a leader election under load)")
    kinds = {k for r in results["scenarios"] for k in r["error_kinds"]}
    if kinds:
        print(
            "  errors: "
            + "; ".join(
                f"{r['scenario']}: {r['error_kinds']}" for r in results["scenarios"] if r["errors"]
            )
        )
    for r in results["scenarios"]:
        if r["kind"] == "group":
            print(
                f"  {r['scenario']}: {r['messages']:,} messages read in {r['seconds']} s by"
                f" {r['clients']} groups, each reading the topic's"
                f" {results['consume_available_messages']:,} from its first"
            )
        if r["kind"] == "pull":
            print(
                f"  {r['scenario']}: {r['messages']:,} of "
                f"{results['consume_available_messages']:,} messages read in {r['seconds']} s"
            )
    print_profiles(a, results)


def _kill_children() -> None:
    for p in _CHILDREN:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.kill()


def add_node_args(ap: argparse.ArgumentParser) -> None:
    """The options of the cluster, its requests and the run's files (bench/delay_bench.py
    has them too)."""
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--pool", type=int, default=32, help="distinct request bodies per scenario")
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--data-file-mb", type=int, default=1024, help="commitlog segment size")
    ap.add_argument("--request-timeout", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on every other wait")
    ap.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--no-progress", action="store_true")


def run_and_report(
    a: argparse.Namespace,
    name: str,
    run: Callable[[argparse.Namespace, Path], dict[str, Any]],
    print_table: Callable[[argparse.Namespace, dict[str, Any]], None],
) -> int:
    """``run(a, root)`` in a fresh directory ``root`` (``{name}-*``, under ``--data-dir``
    if given: kept, else deleted after a run that did not fail), every child stopped at
    the end, also on error, Ctrl-C or SIGTERM; then the table and the ``JSON:`` line."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    atexit.register(_kill_children)
    if a.data_dir is not None:
        a.data_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=a.data_dir))
    else:
        root = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    print(f"data and logs (*.log): {root}", file=sys.stderr)
    ok = False
    try:
        results = run(a, root)
        ok = True
    finally:
        _kill_children()
        if a.data_dir is None and ok:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok:
            print(f"kept {root} (logs: *.log)", file=sys.stderr)
    print_table(a, results)
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    print("JSON:", json.dumps(results))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="measured time per scenario")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured s before POST runs")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100])
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    ap.add_argument("--consume-batch", type=int, default=1000, help="max_messages per pull")
    ap.add_argument(
        "--consume-decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also consume with the Python client's decoders (JSON and record pages)",
    )
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw", help="load generator")
    ap.add_argument("--no-client-check", action="store_true", help="skip the httpx/raw check")
    ap.add_argument(
        "--batch-records",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the nodes store a request's messages for one queue as one record (the default)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s per scenario")
    add_node_args(ap)
    pop = ap.add_argument_group("--pop: shared (POP) consumption instead of the scenarios above")
    pop.add_argument("--pop", action="store_true", help="run the POP receive + ack benchmark")
    pop.add_argument("--pop-messages", type=int, default=200_000, help="backlog per run")
    pop.add_argument("--pop-clients", type=int, default=16, help="concurrent consumers")
    pop.add_argument("--pop-batch", type=int, default=32, help="max_messages per receive")
    pop.add_argument("--pop-invisible-ms", type=int, default=30_000)
    pop.add_argument("--pop-wait-ms", type=int, default=1000, help="a receive's long poll")
    pop.add_argument("--pop-fill-batch", type=int, default=100, help="messages per produce")
    pop.add_argument("--pop-fill-clients", type=int, default=16)
    pop.add_argument("--pop-seconds", type=float, default=300.0, help="bound on a fill or drain")
    pop.add_argument("--repeat", type=int, default=1, help="runs (fill + drain) on one cluster")
    pop.add_argument(
        "--pop-formats",
        type=lambda s: [f for f in s.split(",") if f],
        default=["json", "records"],
        help="answer formats of the receives, alternating within each run: json,records"
        " (issue 31: Accept: application/vnd.ledgermq.records)",
    )
    pop.add_argument(
        "--profile",
        action="store_true",
        help="py-spy record of the master (POP drains; else its produce and consume rows)",
    )
    pop.add_argument("--profile-rate", type=int, default=100, help="py-spy samples/s")
    pop.add_argument(
        "--profile-gil",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="only samples holding the GIL (py-spy --gil); --no-profile-gil: every busy thread",
    )
    pop.add_argument("--profile-top", type=int, default=15, help="functions listed")
    pop.add_argument("--profile-dir", type=Path, default=None, help="keep the raw stacks here")
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.warmup, a.data_file_mb = 3.0, 0.5, 256
        if not any(x.startswith("--pop-messages") for x in sys.argv):
            a.pop_messages = 20_000
    if a.pop:
        return run_and_report(a, "http-bench", run_pop, print_pop_table)
    return run_and_report(a, "http-bench", run, print_table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
