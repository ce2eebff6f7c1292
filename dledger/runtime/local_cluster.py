"""Run a DLedger group as local processes on 127.0.0.1 (tests, benchmarks, demos).

Each node is ``python -m dledger ... --exit-with-parent``, so nothing outlives the
process that started it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .client import DLedgerClient


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago on 127.0.0.1."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    def __init__(
        self,
        n: int,
        data_dir: Path,
        *,
        group: str = "g0",
        extra_args: tuple[str, ...] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.ids = [f"n{i}" for i in range(n)]
        self.ports = free_ports(n)
        self.peers = {i: f"127.0.0.1:{p}" for i, p in zip(self.ids, self.ports, strict=True)}
        self.peer_spec = ";".join(f"{i}-{a}" for i, a in self.peers.items())
        self.data_dir = data_dir
        self.group = group
        self.extra_args = extra_args
        self.log_dir = log_dir or data_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str) -> None:
        assert node not in self.procs or self.procs[node].poll() is not None
        log = (self.log_dir / f"{node}.log").open("ab")
        self.procs[node] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dledger",
                "--id",
                node,
                "--group",
                self.group,
                "--peers",
                self.peer_spec,
                "--data-dir",
                str(self.data_dir),
                "--exit-with-parent",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def start_all(self) -> None:
        for node in self.ids:
            self.start(node)

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[node]
        if p.poll() is None:
            os.kill(p.pid, sig)
            p.wait(timeout=10)

    def stop(self, node: str, timeout_s: float = 10.0) -> None:
        p = self.procs.get(node)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def stop_all(self) -> None:
        for node in self.ids:
            self.stop(node)

    def alive(self, node: str) -> bool:
        p = self.procs.get(node)
        return p is not None and p.poll() is None

    def client(self) -> DLedgerClient:
        return DLedgerClient(self.peers, self.group)

    async def statuses(self, client: DLedgerClient) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for node in self.ids:
            if not self.alive(node):
                continue
            with contextlib.suppress(OSError, TimeoutError, ConnectionError):
                out[node] = await client.status(node, timeout_s=1.0)
        return out

    async def wait_for(
        self, client: DLedgerClient, predicate: Any, timeout_s: float
    ) -> dict[str, dict[str, Any]]:
        """Poll every live node's status until ``predicate(statuses)`` holds."""
        deadline = time.monotonic() + timeout_s
        st: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            st = await self.statuses(client)
            if predicate(st):
                return st
            await asyncio.sleep(0.05)
        raise TimeoutError(f"condition not met in {timeout_s}s; last statuses: {st}")

    async def wait_for_leader(self, client: DLedgerClient, timeout_s: float = 20.0) -> str:
        def one_leader(st: dict[str, dict[str, Any]]) -> bool:
            return sum(s["role"] == "LEADER" for s in st.values()) == 1  # type: ignore[no-any-return]

        st = await self.wait_for(client, one_leader, timeout_s)
        return next(n for n, s in st.items() if s["role"] == "LEADER")

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.ids:
            with contextlib.suppress(Exception):
                self.kill(node)
