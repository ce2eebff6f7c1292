"""A real node's connection and descriptor limits and its warnings (issue 17, HTTP), on a
``ledgermq broker`` process: ``--max-http-connections`` (503 past it, once no idle
connection can give way), the open-files soft limit raised to the hard one at start,
the garbage collector's thresholds, and the warning a node logs when its token is on
the command line. The options themselves, without a process, are in
``tests/api/test_node_options.py``."""

from __future__ import annotations

import resource
import socket
from contextlib import ExitStack
from pathlib import Path

import httpx

from tests.process.nodeproc import node_process
from tests.waiting import wait_until


def status(url: str) -> int:
    return httpx.get(url + "/healthz", timeout=5).status_code


def test_connections_past_the_limit_are_answered_503(tmp_path: Path) -> None:
    """Idle connections give way to a new one (issue 32); busy ones do not: 503."""
    with node_process(tmp_path / "d", "--max-http-connections", "3") as node:
        port = int(node.url.rsplit(":", 1)[1])
        with ExitStack() as held:
            for _ in range(3):  # idle connections: the longest idle is closed for a new one
                held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            assert status(node.url) == 200
        with ExitStack() as held:
            for _ in range(3):  # busy: a request each, whose body has not come yet
                s = held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
                s.sendall(b"PUT /v1/groups/g/offsets HTTP/1.1\r\nHost: x\r\n")
                s.sendall(b"content-length: 10\r\n\r\n")
            wait_until(lambda: status(node.url) == 503, timeout_s=20, what="503 past the limit")
        wait_until(lambda: status(node.url) == 200, timeout_s=20, what="served again")


def test_the_open_files_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)

    def lower() -> None:  # in the child, before exec: a soft limit as low as many defaults
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    with node_process(tmp_path / "d", preexec_fn=lower) as node:
        limits = Path(f"/proc/{node.proc.pid}/limits").read_text()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
        soft_now = line.split()[3]
    want = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert soft_now == want or hard == resource.RLIM_INFINITY, line
    assert f"open files limit: {soft_now}".encode() in node.log, node.log[-2000:]


def test_a_node_freezes_its_startup_objects_and_sets_its_thresholds(tmp_path: Path) -> None:
    with node_process(tmp_path / "d", "--gc-thresholds", "12345,6,7") as node:
        pass
    assert b"garbage collector: thresholds 12345,6,7," in node.log, node.log[-2000:]


def test_a_token_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    with node_process(tmp_path / "a", "--auth-token", "s3cret-token", verify=True) as node:
        pass
    assert b"--auth-token on the command line shows in ps" in node.log
    assert b"LEDGERMQ_AUTH_TOKEN" in node.log
    env = {"LEDGERMQ_AUTH_TOKEN": "s3cret-token"}
    with node_process(tmp_path / "b", env=env) as node:
        r = httpx.get(node.url + "/v1/topics", timeout=5)
        assert r.status_code == 401  # the token from the environment is in force
        assert httpx.get(node.url + "/metrics", timeout=5).status_code == 401  # by default
    assert b"shows in ps" not in node.log
