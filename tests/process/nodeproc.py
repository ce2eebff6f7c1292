"""One real ``ledgermq broker`` process on 127.0.0.1 for a test: started with the test's
options, waited for (bounded), stopped with SIGTERM, its log kept for the asserts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ledgermq.client import tls_context
from ledgermq.processes import free_ports
from tests.waiting import wait_until

LEDGERMQ = str(Path(sys.executable).with_name("ledgermq"))


def ready(url: str, verify: bool | str = True) -> bool:
    """Does the node at ``url`` answer ``/readyz`` 200 (a master, dispatch caught up)?"""
    try:
        r = httpx.get(url + "/readyz", timeout=2, verify=tls_context(verify))
        return r.status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class NodeProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: bytes = b""  # stderr, once stopped


@contextmanager
def node_process(
    data_dir: Path,
    *args: str,
    scheme: str = "http",
    verify: bool | str = True,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[NodeProcess]:
    """A single-node broker with ``args``; stopped (and its log read) on the way out."""
    http, raft = free_ports(2)
    cmd = [
        LEDGERMQ,
        "broker",
        "--exit-with-parent",
        "--http",
        f"127.0.0.1:{http}",
        "--peers",
        f"n0-127.0.0.1:{raft}",
        "--data-dir",
        str(data_dir),
        "--data-file-mb",
        "8",
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,  # noqa: PLW1509  # only resource limits, set before exec
    )
    node = NodeProcess(proc, f"{scheme}://127.0.0.1:{http}")
    try:
        wait_until(
            lambda: ready(node.url, verify) or proc.poll() is not None, timeout_s=60, what="ready"
        )
        assert proc.poll() is None, proc.communicate(timeout=10)[1].decode()[-2000:]
        yield node
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        node.log = proc.communicate(timeout=30)[1]
