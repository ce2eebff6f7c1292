"""A real node's connection and descriptor limits and its exposure warnings (issue 17,
HTTP): ``--max-http-connections`` (503 past it, once no idle connection can give way), the
open-files soft limit raised to the hard one at start, and the warnings a node logs
when its token is on the command line or its HTTP port is open to the network."""

from __future__ import annotations

import argparse
import resource
import socket
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from broker.settings import Limits
from ledgermq.node import (
    GC_THRESHOLDS,
    LIMIT_OPTIONS,
    HttpSettings,
    add_broker_options,
    exposure_warnings,
    settings_from_args,
)
from tests.api.nodeproc import node_process
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


def test_the_garbage_collector_thresholds_are_a_setting() -> None:
    p = argparse.ArgumentParser()
    add_broker_options(p)
    assert settings_from_args(p.parse_args([]))[1].gc_thresholds == GC_THRESHOLDS
    parsed = settings_from_args(p.parse_args(["--gc-thresholds", "5000,7,9"]))[1]
    assert parsed.gc_thresholds == (5000, 7, 9)
    assert settings_from_args(p.parse_args(["--gc-thresholds", "python"]))[1].gc_thresholds is None
    for bad in ("1,2", "a,b,c", "0,1,1", "1,2,3,4"):
        with pytest.raises(SystemExit):
            p.parse_args(["--gc-thresholds", bad])
    assert HttpSettings().gc_thresholds is None  # a node inside another program: untouched


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


def test_an_open_port_without_tokens_is_warned_about() -> None:
    """Tests bind 127.0.0.1 only: the check itself, for the addresses a node may bind."""
    for host in ("0.0.0.0", "::", "10.1.2.3", "broker.example"):
        (warning,) = exposure_warnings(HttpSettings(host=host))
        assert "without --auth-token" in warning and host in warning
        assert exposure_warnings(HttpSettings(host=host, auth_token="t")) == []
    for host in ("127.0.0.1", "::1", "localhost"):
        assert exposure_warnings(HttpSettings(host=host)) == []
    assert len(exposure_warnings(HttpSettings(auth_token="t", auth_token_in_argv=True))) == 1


def test_every_limit_is_an_option_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGERMQ_AUTH_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    settings, http = settings_from_args(parser.parse_args([]))
    assert settings.limits == Limits() and http.max_connections == 2048
    assert http.metrics_need_auth is None and not http.auth_token_in_argv
    args = ["--max-topics", "7", "--max-total-queues", "70", "--max-long-polls", "9"]
    args += ["--max-http-connections", "11", "--no-metrics-auth", "--auth-token", "t"]
    settings, http = settings_from_args(parser.parse_args(args))
    assert (settings.limits.max_topics, settings.limits.max_total_queues) == (7, 70)
    assert settings.limits.max_long_polls == 9 and http.max_connections == 11
    assert http.metrics_need_auth is False and http.auth_token_in_argv
    for name in LIMIT_OPTIONS:
        assert parser.get_default(name) == getattr(Limits(), name), name
