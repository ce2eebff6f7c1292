"""Which HTTP/1.1 front refuses oversized heads cheapest (issue 32), measured:
uvicorn's httptools protocol as it ships, ``api.http_protocol`` (httptools with caps and
deadlines), and uvicorn's h11 protocol with ``h11_max_incomplete_event_size`` = 64 KiB
(h11 has no header-count cap).

Each runs a trivial ASGI app in its own process on 127.0.0.1; for each we measure the
server's CPU per ordinary keep-alive request (10 headers), and the server's CPU, its
resident memory and the slowest concurrent ``/healthz`` while it takes the header bomb
(3 million headers), a head of 7,500 headers that stays under 64 KiB, and a 64 MB
header value. Run:
``python -m tests.process.http_protocol_bench``.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from ledgermq.processes import free_ports
from tests.process.dos_attacks import LoopProbe, big_header, cpu_s, header_bomb, rss_kib
from tests.waiting import wait_until

SERVER = """
import sys, asyncio, uvicorn, uvloop
from api.http_protocol import ConnectionLimits, guarded_protocol
kind, port = sys.argv[1], int(sys.argv[2])

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

extra = {}
if kind == "guarded":
    http, _ = guarded_protocol(ConnectionLimits(), 2048)
elif kind == "h11":
    http, extra = "h11", {"h11_max_incomplete_event_size": 64 * 1024}
else:
    http = "httptools"
config = uvicorn.Config(app, host="127.0.0.1", port=port, http=http, loop="none",
                        lifespan="off", log_level="error", limit_concurrency=2048, **extra)
uvloop.run(uvicorn.Server(config).serve())
"""

HEADERS = {f"x-header-{i}": "v" * 20 for i in range(8)}  # with Host and Accept: 10


def bench(kind: str, requests: int = 20_000) -> None:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, str(port)])
    try:

        def up() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout_s=20, what=f"the {kind} server")
        with httpx.Client(base_url=url, headers=HEADERS) as http:
            for _ in range(200):  # warm up
                http.get("/x")
            cpu = cpu_s(proc.pid)
            started = time.perf_counter()
            for _ in range(requests):
                http.get("/x")
            wall = time.perf_counter() - started
            per_request_us = (cpu_s(proc.pid) - cpu) / requests * 1e6
        line = [f"{kind:<9} request: {per_request_us:5.0f} us CPU, {wall / requests * 1e6:4.0f} us"]
        for name, attack in (
            ("3M headers", lambda: header_bomb(url, 3_000_000)),
            ("7,500 headers (60 KB)", lambda: header_bomb(url, 7_500)),
            ("64 MB value", lambda: big_header(url, 64 << 20)),
        ):
            rss_before = rss_kib(proc.pid)[0]
            cpu = cpu_s(proc.pid)
            with LoopProbe(url, pid=proc.pid) as probe:
                started, answers = time.monotonic(), []
                while len(answers) < 20 and time.monotonic() - started < 2.0:
                    answers.append(attack())  # repeated: /proc counts CPU in 10 ms ticks
                wait_until(lambda: len(probe.latencies_ms) >= 5, timeout_s=30, what="probes")
            cpu_ms = (cpu_s(proc.pid) - cpu) * 1000 / len(answers)
            line.append(
                f"{name}: {answers[-1].status}, {cpu_ms:.1f} ms CPU, healthz max"
                f" {probe.max_ms:.0f} ms, RSS +{(probe.max_rss_kib - rss_before) >> 10} MiB"
            )
        print(" | ".join(line), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    for kind in ("httptools", "guarded", "h11"):
        bench(kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
