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
   everything. Then ``floor blob``: ``GET /blob`` answering as many bytes as the average
   pull answer, from as many clients.

For each: messages/s, MB/s (message bodies, 10^6 B; for the floor rows, the bodies the
same requests carried), requests/s, p50/p99 request latency, errors, and the CPU used by
each process (from /proc) during the measured window: the machine's cores are shared by
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

    .venv/bin/python bench/http_bench.py             # ~3 min
    .venv/bin/python bench/http_bench.py --quick     # smoke run, ~1 min
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

from ledgermq.local_cluster import LocalBrokerCluster
from ledgermq.processes import free_ports

FLOOR_SCRIPT = Path(__file__).resolve().parent / "http_floor.py"
TOPIC = "bench"
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
            r = await self.client.post(
                req[0], content=req[2], headers={"content-type": "application/json"}
            )
        else:
            r = await self.client.get(req[0])
        return r.status_code, r.content


def _post_head(host: str, port: int, path: str, n: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n"
    ).encode()


def _bodies(
    batch: int, body_size: int, pool: int, fields: dict[str, Any] | None = None
) -> list[bytes]:
    """``pool`` produce request bodies of ``batch`` random ASCII messages each, every
    message with ``fields`` besides its body (``{"delay_ms": ...}``: bench/delay_bench.py)."""
    out = []
    rnd = os.urandom(pool * batch * body_size)  # base64 of random bytes: valid UTF-8/JSON
    text = base64.b64encode(rnd).decode("ascii")
    k = 0
    for _ in range(pool):
        msgs = []
        for _ in range(batch):
            msgs.append({"body": text[k : k + body_size], **(fields or {})})
            k += body_size
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


def _pull_next(data: bytes) -> tuple[str, int]:
    """(status, next_offset) of a pull answer without parsing its ~1 MB of messages:
    orjson keeps the key order of ``api.app.pull``, status first, next_offset after the
    messages."""
    i = data.find(b'"status":"')
    status = data[i + 10 : data.index(b'"', i + 10)].decode()
    i = data.rfind(b'"next_offset":')
    return status, int(data[i + 14 : data.index(b",", i)])


class LoadGen:
    def __init__(self, spec: dict[str, Any], progress: Any, conn: Connection) -> None:
        self.spec = spec
        self.progress = progress
        self.conn = conn
        self.tally = Tally()
        self.measure_from = 0.0
        self.stop_at = 0.0
        self.pull_done = 0.0
        self.window_started = False

    def _in_window(self, t: float) -> bool:
        return self.measure_from <= t <= self.stop_at

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
            while time.monotonic() < self.stop_at:
                req = reqs[i % len(reqs)]
                i += 1
                t0 = time.monotonic()
                got = await self._one(conn, req)
                t1 = time.monotonic()
                if got is None:
                    continue
                if not checked and s["kind"] == "produce":
                    n = got[1].count(b'"msg_id"')
                    if n != s["batch"]:
                        raise WrongAnswerError(
                            f"produce answered {n} results for {s['batch']} messages"
                        )
                    checked = True
                self.progress.value += 1
                if self._in_window(t1):
                    self.tally.latencies.append(t1 - t0)
                    self.tally.requests += 1
                    self.tally.messages += s["batch"]
                    self.tally.response_bytes += len(got[1])
        finally:
            await conn.aclose()

    async def pull_client(self, queue: int, conn: RawConnection | HttpxConnection) -> None:
        s = self.spec
        offset = 0
        checked = False
        try:
            while time.monotonic() < self.stop_at:
                path = (
                    f"/v1/topics/{s['topic']}/queues/{queue}/messages"
                    f"?offset={offset}&max_messages={s['batch']}"
                )
                head = f"GET {path} HTTP/1.1\r\nHost: {s['host']}:{s['port']}\r\n\r\n".encode()
                t0 = time.monotonic()
                got = await self._one(conn, (path, head, b""))
                t1 = time.monotonic()
                if got is None:
                    continue
                data = got[1]
                status, nxt = _pull_next(data)
                n = nxt - offset
                if status == "FOUND" and not checked:  # parse one answer per queue in full
                    doc = orjson.loads(data)
                    if (
                        len(doc["messages"]) != n
                        or len(doc["messages"][0]["body"]) != s["body_size"]
                        or doc["messages"][0]["queue_offset"] != offset
                    ):
                        raise WrongAnswerError(f"queue {queue}: pull answer does not add up")
                    checked = True
                self.progress.value += 1
                if status != "FOUND" or n <= 0:
                    if status not in ("NO_NEW_MSG", "FOUND"):
                        self.tally.error(status)
                    break
                offset = nxt
                if self._in_window(t1):
                    self.tally.latencies.append(t1 - t0)
                    self.tally.requests += 1
                    self.tally.messages += n
                    self.tally.response_bytes += len(data)
                    self.pull_done = max(self.pull_done, t1)
        finally:
            await conn.aclose()

    async def run(self) -> dict[str, Any]:
        s = self.spec
        if s["kind"] == "pull":
            conns = [await self._connect() for _ in range(s["queues"])]
            tasks = [self.pull_client(q, c) for q, c in enumerate(conns)]
        elif s["kind"] == "blob":
            head = f"GET {s['path']} HTTP/1.1\r\nHost: {s['host']}:{s['port']}\r\n\r\n"
            reqs = [(s["path"], head.encode(), b"")]
            conns = [await self._connect() for _ in range(s["clients"])]
            tasks = [self.post_client(k, c, reqs) for k, c in enumerate(conns)]
        else:
            reqs = [
                (s["path"], _post_head(s["host"], s["port"], s["path"], len(b)), b)
                for b in _bodies(s["batch"], s["body_size"], s["pool"], s.get("fields"))
            ]
            conns = [await self._connect() for _ in range(s["clients"])]
            tasks = [self.post_client(k, c, reqs) for k, c in enumerate(conns)]
        t0 = time.monotonic()
        self.measure_from = t0 + s["warmup"]
        self.stop_at = self.measure_from + s["seconds"]
        window = asyncio.create_task(self._window_events())
        await asyncio.gather(*tasks)
        if not window.done():  # the pulls read everything before the time was up
            window.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await window
            if self.window_started:
                self.conn.send({"event": "window_end"})
        t = self.tally
        seconds = s["seconds"]
        if s["kind"] == "pull" and self.pull_done:
            seconds = min(seconds, self.pull_done - self.measure_from)
        return {
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

    def start(self) -> str:
        self.worker.start()
        self.cluster.start_all()
        _CHILDREN.extend(self.cluster.procs.values())
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
    ) -> dict[str, Any]:
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
            "seconds": a.seconds,
            "warmup": a.warmup if warmup is None else warmup,
            "client": client or a.client,
            "request_timeout": a.request_timeout,
            "fields": fields,
        }
        self.check_alive(server)
        pids = self.pids(server)
        term0 = None if server == "floor" else self.term(server)
        cpu0: dict[str, int | None] = {}
        cpu: dict[str, float] = {}
        t_start = time.monotonic()

        def on_window(event: str) -> None:
            nonlocal cpu0, t_start
            if event == "window_start":
                t_start = time.monotonic()
                cpu0 = {k: _cpu_ticks(p) for k, p in pids.items()}
                return
            dt = time.monotonic() - t_start
            tck = os.sysconf("SC_CLK_TCK")
            for k, p in pids.items():
                c1, c0 = _cpu_ticks(p), cpu0.get(k)
                if c1 is not None and c0 is not None and dt > 0:
                    cpu[k] = round((c1 - c0) / tck / dt * 100)

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
        row: dict[str, Any] = {
            "scenario": name,
            "server": server,
            "kind": kind,
            "batch": batch,
            "clients": clients,
            "client": spec["client"],
            **result,
            "cpu_pct": cpu,
        }
        if server != "floor":
            term1 = self.term(server)
            row["term_changed"] = term0 is not None and term1 != term0
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
                r = b.scenario(
                    f"produce b={batch} c={c}",
                    "produce",
                    master,
                    path=f"/v1/topics/{TOPIC}/messages",
                    batch=batch,
                    clients=c,
                )
                add("produce", r, floor)
        master = b.master()
        b.wait_dispatched(master, master)
        results["consume_available_messages"] = b.topic_messages(master)
        pulls = []
        pulls.append(
            b.scenario(
                f"consume master b={a.consume_batch}",
                "pull",
                master,
                batch=a.consume_batch,
                clients=a.queues,
                warmup=0.0,
            )
        )
        size = max(2, pulls[0]["avg_response_bytes"])
        floor = b.scenario(
            f"floor blob {size / 1e6:.2f} MB",
            "blob",
            "floor",
            path=f"/blob?size={size}",
            batch=0,
            clients=a.queues,
            warmup=0.0,
        )
        slave = next(n for n in b.cluster.ids if n != master and b.cluster.alive(n))
        b.wait_dispatched(slave, master)
        pulls.append(
            b.scenario(
                f"consume slave b={a.consume_batch}",
                "pull",
                slave,
                batch=a.consume_batch,
                clients=a.queues,
                warmup=0.0,
            )
        )
        add("consume", floor)
        for r in pulls:
            add("consume", r, floor)
    finally:
        b.close()
    return results


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
        "  one core); node: the node answering (the others only replicate)."
    )
    hdr = (
        f"  {'scenario':<30}{'node':>6}{'msg/s':>9}{'MB/s':>7}{'req/s':>8}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'errors':>7}{'vs floor':>9}  CPU%"
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
            f"{_fmt(r.get('vs_floor'), '.2f'):>9}  {cpu}"
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
        if r["kind"] == "pull":
            print(
                f"  {r['scenario']}: {r['messages']:,} of "
                f"{results['consume_available_messages']:,} messages read in {r['seconds']} s"
            )


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
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.warmup, a.data_file_mb = 3.0, 0.5, 256
    return run_and_report(a, "http-bench", run, print_table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
