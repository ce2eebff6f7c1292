"""The denial-of-service attacks of issue 32 against a node's HTTP port, and the probe
that measures what they cost it: shared by ``test_http_dos.py`` and by a measurement run.

Every attack is a plain blocking function over raw sockets (a client library would
refuse to send most of them), bounded in bytes and time. ``LoopProbe`` asks
``/healthz`` over one keep-alive connection every few milliseconds from a thread: the
slowest answer while an attack runs is how long the node's event loop (which also runs
Raft) was kept from answering. ``rss_kib`` reads the node's resident and peak memory.

``python -m tests.process.dos_attacks [--node-arg=ARG ...]`` starts a node on 127.0.0.1 (the
working tree's code), runs every attack at the sizes of issue 32 and prints the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HEADER_LINE = b"X-A: b\r\n"  # 8 bytes: 3 million of them are ~24 MB, as in issue 32


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _status_of(answer: bytes) -> int | None:
    """The status code of the first response in ``answer``, if one arrived."""
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


@dataclass
class Answer:
    status: int | None  # None: the connection ended without an HTTP answer
    sent_bytes: int  # what the node took before it answered or hung up
    seconds: float  # from the first byte sent to the answer (or the hang-up)
    raw: bytes = b""


def send_until_answered(
    port: int, head: bytes, chunks: Iterator[bytes], *, timeout_s: float = 30.0
) -> Answer:
    """Send ``head`` then ``chunks`` on a new connection, reading whatever comes back
    meanwhile; stop at the first answer, a hang-up, or when everything was sent and
    the answer has arrived (or ``timeout_s`` passed)."""
    started = time.monotonic()
    deadline = started + timeout_s
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.setblocking(False)
        pending = memoryview(head)
        done_sending = False
        while time.monotonic() < deadline:
            if not pending and not done_sending:
                nxt = next(chunks, None)
                if nxt is None:
                    done_sending = True
                else:
                    pending = memoryview(nxt)
            want_write = [s] if pending else []
            readable, writable, _ = select.select([s], want_write, [], 0.2)
            if readable:
                try:
                    data = s.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    break
                answer += data
                if b"\r\n\r\n" in answer:
                    break
            if writable and pending:
                try:
                    n = s.send(pending[:262144])
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionError:
                    with contextlib.suppress(OSError):  # what arrived before the reset
                        answer += s.recv(65536)
                    break
                sent += n
                pending = pending[n:]
    return Answer(_status_of(answer), sent, time.monotonic() - started, answer)


def header_bomb(url: str, count: int = 3_000_000, *, timeout_s: float = 30.0) -> Answer:
    """One ``GET /healthz`` with ``count`` small headers (8 bytes each)."""
    per_chunk = 32768
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"

    def chunks() -> Iterator[bytes]:
        left = count
        while left > 0:
            n = min(per_chunk, left)
            left -= n
            yield HEADER_LINE * n
        yield b"\r\n"

    return send_until_answered(_port(url), head, chunks(), timeout_s=timeout_s)


def big_header(url: str, size: int = 64 << 20, *, timeout_s: float = 30.0) -> Answer:
    """One ``GET /healthz`` with a single header value of ``size`` bytes."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "

    def chunks() -> Iterator[bytes]:
        piece = b"a" * (1 << 20)
        for _ in range(size >> 20):
            yield piece
        yield b"\r\n\r\n"

    return send_until_answered(_port(url), head, chunks(), timeout_s=timeout_s)


def slow_body(
    url: str, rate_bytes_s: float = 1.0, length: int = 1000, *, timeout_s: float = 60.0
) -> Answer:
    """A ``PUT`` whose body of ``length`` bytes trickles in at ``rate_bytes_s``; the
    answer is whatever the node sends before it cuts the connection."""
    head = (
        b"PUT /v1/groups/g/offsets HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % length
    )
    gap_s = 1.0 / rate_bytes_s

    def chunks() -> Iterator[bytes]:
        for _ in range(length):
            time.sleep(gap_s)  # the attack's own pace, not a wait for a condition
            yield b" "

    return send_until_answered(_port(url), head, chunks(), timeout_s=timeout_s)


@contextlib.contextmanager
def silent_connections(url: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections that never send a byte, held open for the block."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", _port(url)), timeout=10))
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_peer(s: socket.socket, timeout_s: float) -> bool:
    """Did the other end close ``s`` (EOF or reset) within ``timeout_s``?"""
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def scrapes(url: str, count: int, *, timeout_s: float = 60.0) -> list[int]:
    """``count`` concurrent ``GET /metrics``, each by its own ``curl`` process (so that
    reading them costs no CPU in this process, where ``LoopProbe`` runs); the statuses."""
    cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", str(timeout_s)]
    procs = [
        subprocess.Popen([*cmd, url + "/metrics"], stdout=subprocess.PIPE) for _ in range(count)
    ]
    return [int(p.communicate(timeout=timeout_s + 5)[0] or 0) for p in procs]


@dataclass
class LoopProbe:
    """``GET /healthz`` every ``interval_s`` over one keep-alive connection, in a thread;
    ``max_ms`` is the slowest answer seen (a new connection is made after a failure).
    With ``pid``, the process's resident memory is sampled at each ask too."""

    url: str
    interval_s: float = 0.005
    timeout_s: float = 10.0
    pid: int | None = None
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    max_rss_kib: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LoopProbe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.timeout_s + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    r = http.get(self.url + "/healthz")
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text[:80]}")
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
                if self.pid is not None:
                    self.max_rss_kib = max(self.max_rss_kib, rss_kib(self.pid)[0])
                self._stop.wait(self.interval_s)

    @property
    def max_ms(self) -> float:
        return max(self.latencies_ms, default=0.0)

    def percentile_ms(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


def rss_kib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of process ``pid``, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def cpu_s(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used."""
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def create_topics(url: str, topics: int, queues: int) -> None:
    """``topics`` topics of ``queues`` queues, one message in each queue."""

    def one(http: httpx.Client, i: int) -> None:
        name = f"t{i:04d}"
        r = http.post("/v1/topics", json={"name": name, "queues": queues})
        assert r.status_code in (200, 201, 409), r.text
        msgs = [{"body": "x", "queue_id": q} for q in range(queues)]
        r = http.post(f"/v1/topics/{name}/messages", json={"messages": msgs})
        assert r.status_code == 200, r.text

    with (
        httpx.Client(base_url=url, timeout=30) as http,
        ThreadPoolExecutor(8) as pool,
    ):
        list(pool.map(lambda i: one(http, i), range(topics)))


# ---- the measurement run ---------------------------------------------------------------------


def _measure(name: str, url: str, pid: int, attack: Callable[[], object], seconds: float) -> None:
    """Run ``attack`` again and again for ``seconds`` (at least once) under the probe."""
    rss_before, _ = rss_kib(pid)
    cpu_before = cpu_s(pid)
    results: list[object] = []
    with LoopProbe(url, pid=pid) as probe:
        started = time.monotonic()
        while not results or time.monotonic() - started < seconds:
            results.append(attack())
        took = time.monotonic() - started
    cpu = cpu_s(pid) - cpu_before
    print(
        f"{name:<30} x{len(results):<3} healthz p50 {probe.percentile_ms(0.5):6.1f} p99 "
        f"{probe.percentile_ms(0.99):7.1f} max {probe.max_ms:7.1f} ms ({len(probe.latencies_ms)}"
        f" asks, {len(probe.failures)} failed)  node CPU {cpu * 1000 / len(results):6.0f} ms"
        f" per attack  RSS {rss_before // 1024} MiB, max {probe.max_rss_kib // 1024} MiB"
        f"  {took:5.2f} s  last: {results[-1]}",
        flush=True,
    )


def _summary(a: Answer) -> str:
    return f"status {a.status} after {a.sent_bytes / 1e6:.2f} MB in {a.seconds:.2f} s"


def main(argv: list[str] | None = None) -> int:
    from tests.process.nodeproc import node_process  # noqa: PLC0415  # only for the run

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--node-arg", action="append", default=[], help="passed to the node")
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--silent", type=int, default=2100)
    p.add_argument("--seconds", type=float, default=3.0, help="how long each attack repeats")
    p.add_argument(
        "--attacks",
        default="headers,connections,metrics",
        help="which: headers, connections (silent ones and a slow body), metrics",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, node_process(Path(tmp) / "d", *args.node_arg) as n:
        pid, url = n.proc.pid, n.url
        secs = args.seconds
        _measure("idle", url, pid, lambda: time.sleep(secs), secs)
        if "headers" in args.attacks:
            _header_attacks(url, pid, secs)
        if "connections" in args.attacks:
            _connection_attacks(url, pid, args.silent)
        if "metrics" in args.attacks:
            _metrics_attack(url, pid, secs, args.topics)
    stalls = [ln for ln in n.log.decode(errors="replace").splitlines() if "loop_stall" in ln]
    print(f"loop_stall lines in the node's log: {len(stalls)}")
    for line in stalls[:10]:
        print("  ", line[-160:])
    return 0


def _header_attacks(url: str, pid: int, secs: float) -> None:
    _measure("header bomb (3M headers)", url, pid, lambda: _summary(header_bomb(url)), secs)
    _measure("one 64 MB header value", url, pid, lambda: _summary(big_header(url)), secs)

    def two_bombs() -> str:
        out: list[Answer] = []
        ts = [threading.Thread(target=lambda: out.append(header_bomb(url))) for _ in "ab"]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return ", ".join(_summary(a) for a in out)

    _measure("two header bombs at once", url, pid, two_bombs, secs)


def _connection_attacks(url: str, pid: int, silent_count: int) -> None:
    def silent() -> str:
        with silent_connections(url, silent_count):
            codes = [httpx.get(url + "/healthz", timeout=10).status_code for _ in range(3)]
        return f"{silent_count} silent connections: /healthz answered {codes}"

    _measure("silent connections", url, pid, silent, 0)
    slow = lambda: _summary(slow_body(url, 10.0, timeout_s=30))  # noqa: E731
    _measure("slow body (10 B/s, 1000 B)", url, pid, slow, 0)


def _metrics_attack(url: str, pid: int, secs: float, topics: int) -> None:
    started = time.monotonic()
    create_topics(url, topics, 8)
    print(f"created {topics} topics x 8 queues in {time.monotonic() - started:.1f} s")
    size = len(httpx.get(url + "/metrics", timeout=60).content)

    def six() -> str:
        return f"6 scrapes of {size / 1e6:.2f} MB: {sorted(scrapes(url, 6))}"

    _measure("six concurrent /metrics", url, pid, six, secs)


if __name__ == "__main__":
    sys.exit(main())
