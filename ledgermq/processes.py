"""Run a DLedger group as local processes on 127.0.0.1 (tests, benchmarks, demos).

Each node is ``python -m dledger ... --exit-with-parent``, so nothing outlives the
process that started it. Every wait is bounded. A peer secret reaches the children in
their environment, not on their command line, where ``ps`` would show it.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dledger.runtime.client import DLedgerClient
from dledger.runtime.peer_auth import PEER_SECRET_ENV, PEER_SECRET_FILE_ENV


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


class ChildNodes:
    """Node processes on this machine, one per id: start (output to ``<log_dir>/<id>.log``
    or inherited), SIGKILL, stop (SIGTERM, then SIGKILL after a bound), liveness, log
    tails. Subclasses say how a node is started (``command``); ``env`` sets (a string) or
    removes (None) variables in the children's environment, which is otherwise this
    process's."""

    def __init__(
        self,
        ids: list[str],
        log_dir: Path,
        *,
        inherit_output: bool = False,
        env: Mapping[str, str | None] | None = None,
    ) -> None:
        self.ids = ids
        self.log_dir = log_dir
        self.inherit_output = inherit_output
        self.env = dict(env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def command(self, node: str) -> list[str]:
        raise NotImplementedError

    def child_env(self) -> dict[str, str] | None:
        if not self.env:
            return None  # inherit, as before
        out = dict(os.environ)
        for name, value in self.env.items():
            if value is None:
                out.pop(name, None)
            else:
                out[name] = value
        return out

    def start(self, node: str) -> None:
        assert not self.alive(node), f"{node} is running"
        out = None
        if not self.inherit_output:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = (self.log_dir / f"{node}.log").open("ab")
        try:
            self.procs[node] = subprocess.Popen(
                self.command(node),
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                stdin=subprocess.DEVNULL,
                env=self.child_env(),
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
        return None if p is None else stop_process(p, timeout_s)

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


def stop_process(p: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (None only if even
    SIGKILL left it running for 10 s more)."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    return p.returncode


def peer_secret_env(secret: bytes | None) -> dict[str, str | None]:
    """Children's environment for ``secret``: set, or (None) unset, so that a variable of
    the operator's shell never gives the nodes a secret their parent does not know."""
    if secret is None:
        return {PEER_SECRET_ENV: None, PEER_SECRET_FILE_ENV: None}
    # fsdecode/fsencode (in load_peer_secret) round-trip any bytes through the variable.
    return {PEER_SECRET_ENV: os.fsdecode(secret), PEER_SECRET_FILE_ENV: None}


class LocalCluster(ChildNodes):
    def __init__(
        self,
        n: int,
        data_dir: Path,
        *,
        group: str = "g0",
        extra_args: tuple[str, ...] = (),
        log_dir: Path | None = None,
        peer_secret: bytes | None = None,
    ) -> None:
        super().__init__(
            [f"n{i}" for i in range(n)], log_dir or data_dir, env=peer_secret_env(peer_secret)
        )
        self.peer_secret = peer_secret
        self.ports = free_ports(n)
        self.peers = {i: f"127.0.0.1:{p}" for i, p in zip(self.ids, self.ports, strict=True)}
        self.peer_spec = ";".join(f"{i}-{a}" for i, a in self.peers.items())
        self.data_dir = data_dir
        self.group = group
        self.extra_args = extra_args

    def command(self, node: str) -> list[str]:
        return [
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
        ]

    def client(self) -> DLedgerClient:
        return DLedgerClient(self.peers, self.group, peer_secret=self.peer_secret)

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
