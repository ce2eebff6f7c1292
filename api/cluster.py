"""A local LedgerMQ cluster: N ``python -m broker`` child processes on 127.0.0.1.

``ledgermq cluster up`` runs one in the foreground; the tests and the HTTP benchmark use
the same class. Each node gets an HTTP port and a Raft port, every node knows every
node's URL (so a SLAVE redirects writes to the master), and children are started with
``--exit-with-parent``: nothing outlives the process that started them. Every wait is
bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from dledger.runtime.local_cluster import free_ports


class LocalBrokerCluster:
    def __init__(
        self,
        n: int,
        data_dir: Path,
        *,
        http_ports: Sequence[int] | None = None,
        raft_ports: Sequence[int] | None = None,
        group: str = "g0",
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
        inherit_output: bool = False,
    ) -> None:
        if not 1 <= n <= 9:
            raise ValueError("a local cluster has 1 to 9 nodes")
        self.ids = [f"n{i}" for i in range(n)]
        ports = free_ports(2 * n) if http_ports is None or raft_ports is None else []
        self.http_ports = list(http_ports) if http_ports is not None else ports[:n]
        self.raft_ports = list(raft_ports) if raft_ports is not None else ports[n:]
        self.urls = {
            i: f"http://127.0.0.1:{p}" for i, p in zip(self.ids, self.http_ports, strict=True)
        }
        self.peer_spec = ";".join(
            f"{i}-127.0.0.1:{p}" for i, p in zip(self.ids, self.raft_ports, strict=True)
        )
        self.peer_urls = ",".join(f"{i}={u}" for i, u in self.urls.items())
        self.data_dir = data_dir
        self.group = group
        self.extra_args = list(extra_args)
        self.log_dir = log_dir or data_dir
        self.inherit_output = inherit_output
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def brokers(self) -> str:
        """The ``--brokers`` value for clients: every node's URL."""
        return ",".join(self.urls.values())

    def command(self, node: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "broker",
            "--node-id",
            node,
            "--group",
            self.group,
            "--peers",
            self.peer_spec,
            "--http",
            self.urls[node].removeprefix("http://"),
            "--peer-urls",
            self.peer_urls,
            "--data-dir",
            str(self.data_dir / node),
            "--exit-with-parent",
            *self.extra_args,
        ]

    def start(self, node: str) -> None:
        assert not self.alive(node), f"{node} is running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out: IO[bytes] | None = None
        if not self.inherit_output:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = (self.log_dir / f"{node}.log").open("ab")
        try:
            self.procs[node] = subprocess.Popen(
                self.command(node),
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                stdin=subprocess.DEVNULL,
            )
        finally:
            if out is not None:
                out.close()

    def start_all(self) -> None:
        for node in self.ids:
            self.start(node)

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[node]
        if p.poll() is None:
            os.kill(p.pid, sig)
            p.wait(timeout=30)

    def stop(self, node: str, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
        p = self.procs.get(node)
        if p is None:
            return None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        return p.returncode

    def stop_all(self, timeout_s: float = 15.0) -> None:
        for p in self.procs.values():  # all at once: a quorum going away together
            if p.poll() is None:
                p.terminate()
        for node in self.procs:
            self.stop(node, timeout_s)

    def alive(self, node: str) -> bool:
        p = self.procs.get(node)
        return p is not None and p.poll() is None

    def log_tail(self, node: str, lines: int = 40) -> str:
        path = self.log_dir / f"{node}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ---- probing -------------------------------------------------------------------------

    def cluster_info(self, node: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
        try:
            r = httpx.get(self.urls[node] + "/v1/cluster", timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def ready(self, node: str, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(self.urls[node] + "/readyz", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def master(self) -> str | None:
        """The node that says it is MASTER (alive nodes only), if any."""
        for node in self.ids:
            if not self.alive(node):
                continue
            info = self.cluster_info(node)
            if info is not None and info["broker_role"] == "MASTER":
                return node
        return None

    def wait_ready(self, nodes: Sequence[str] | None = None, timeout_s: float = 60.0) -> str:
        """Wait until the given (default: all running) nodes are ready and one is
        MASTER; return the master's id."""
        deadline = time.monotonic() + timeout_s
        while True:
            want = [n for n in (nodes or self.ids) if nodes is not None or self.alive(n)]
            for n in want:
                if not self.alive(n):
                    raise RuntimeError(
                        f"{n} exited ({self.procs[n].returncode}):\n" + self.log_tail(n)
                    )
            if all(self.ready(n) for n in want):
                master = self.master()
                if master is not None:
                    return master
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster not ready within {timeout_s} s: "
                    + ", ".join(f"{n}={self.cluster_info(n)}" for n in want)
                )
            time.sleep(0.1)

    def __enter__(self) -> LocalBrokerCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
