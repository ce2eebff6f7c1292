"""Server processes of the peers (nats-server, etcd, pysyncobj nodes): start, kill -9,
restart, stop, and nothing left behind.

Every child is started with ``PR_SET_PDEATHSIG`` = SIGKILL (it dies with the benchmark,
even if the benchmark is killed -9) and recorded in a registry that ``kill_all`` (an
``atexit`` hook and every ``finally``) empties. Output goes to ``<name>.log`` in the
group's directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ledgermq.processes import stop_process

_PR_SET_PDEATHSIG = 1
_REGISTRY: list[subprocess.Popen[bytes]] = []


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    cmd: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        p = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # no threads run yet in the child
            env=env,
        )
    _REGISTRY.append(p)
    return p


def stop(p: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``."""
    stop_process(p, timeout_s)


def kill_all() -> None:
    for p in _REGISTRY:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.kill()
    for p in _REGISTRY:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    _REGISTRY.clear()


class Group:
    """Three (or n) replicas of one peer: ``commands[i]`` starts replica i."""

    def __init__(self, name: str, root: Path, commands: list[list[str]]) -> None:
        self.name = name
        self.root = root
        self.commands = commands
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(commands)

    def log(self, i: int) -> Path:
        return self.root / f"{self.name}{i}.log"

    def start(self, i: int) -> None:
        assert not self.alive(i), f"{self.name}{i} is running"
        self.procs[i] = spawn(self.commands[i], self.log(i))

    def start_all(self) -> None:
        for i in range(len(self.commands)):
            self.start(i)

    def alive(self, i: int) -> bool:
        p = self.procs[i]
        return p is not None and p.poll() is None

    def kill(self, i: int) -> None:
        """kill -9, and reap it."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)

    def stop_all(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is not None:
                stop(p)

    def pids(self) -> dict[str, int]:
        return {f"{self.name}{i}": p.pid for i, p in enumerate(self.procs) if p is not None}

    def check_alive(self) -> None:
        for i in range(len(self.procs)):
            if not self.alive(i):
                raise RuntimeError(f"{self.name}{i} exited:\n{self.tail(i)}")

    def tail(self, i: int, lines: int = 15) -> str:
        try:
            return "\n".join(self.log(i).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_until(
    cond: Callable[[], object], timeout_s: float, what: str, step_s: float = 0.05
) -> object:
    """Poll ``cond`` until it is truthy (its value is returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(step_s)
