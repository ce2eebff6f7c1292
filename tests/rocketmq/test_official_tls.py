"""gRPC over TLS (docs/rocketmq.md "TLS"): a 3-process cluster whose nodes serve HTTPS
and gRPC with one certificate (``--ssl-certfile``; trustme makes a throwaway CA) and
trust that CA for their peers (``--peer-ca-file``). The official Python client with TLS
on produces through a follower (which forwards the call to the master over TLS) and
consumes; Node's does too. A plaintext client gets nothing through.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.process.dos_attacks import closed_by_peer
from tests.process.test_tls import make_certificates

from .client_env import official_node, official_python, run_node_script, run_script
from .clusters import cluster_with_topics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def official() -> Path:
    return official_python()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_certificates(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: tuple[Path, Path, Path]
) -> Iterator[LocalBrokerCluster]:
    data_dir = tmp_path_factory.mktemp("rocketmq-tls")
    handshake = ("--http-tls-handshake-timeout-s", "1")
    with cluster_with_topics(data_dir, {"sealed": 2}, *handshake, tls=certs) as c:
        yield c


def follower(c: LocalBrokerCluster) -> str:
    master = c.wait_ready()
    return next(n for n in c.ids if n != master)


def client(python: Path, endpoints: str, **args: Any) -> Any:
    return run_script(python, "auth_client.py", {"endpoints": endpoints, "topic": "sealed",
                                                 "await_s": 2, **args})  # fmt: skip


def test_the_official_client_over_tls_produces_through_a_follower_and_consumes(
    official: Path, cluster: LocalBrokerCluster, certs: tuple[Path, Path, Path]
) -> None:
    ca = str(certs[0])
    at_follower = cluster.grpc_addrs[follower(cluster)]
    master_url = cluster.urls[cluster.wait_ready()]
    assert master_url.startswith("https://")
    r = httpx.put(
        f"{master_url}/v1/groups/sealed-readers",
        json={"start": "earliest"},
        verify=cluster.verify,
    )
    assert r.status_code in (200, 201), r.text
    bodies = [f"sealed {i}" for i in range(4)]
    out = client(official, at_follower, op="send", bodies=bodies, tls=True, ca_file=ca)
    assert "error" not in out and len(out["sent"]) == 4, out
    # (one address: with a list, gRPC checks the certificate against the whole list)
    got = client(
        official, at_follower, op="receive", group="sealed-readers", expect=4,
        tls=True, ca_file=ca,
    )  # fmt: skip
    assert "error" not in got and sorted(got["received"]) == bodies, got


def test_a_plaintext_client_or_one_without_the_ca_gets_nothing_through(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    at = cluster.grpc_addrs[cluster.wait_ready()]
    plain = client(official, at, op="send", bodies=["in clear"])
    assert "error" in plain and not plain.get("sent"), plain
    untrusting = client(official, at, op="send", bodies=["unknown CA"], tls=True)
    assert "error" in untrusting and not untrusting.get("sent"), untrusting


def test_the_node_client_over_tls(
    cluster: LocalBrokerCluster, certs: tuple[Path, Path, Path]
) -> None:
    modules = official_node()
    at_follower = cluster.grpc_addrs[follower(cluster)]  # Node takes one address
    args = {
        "endpoints": at_follower,
        "topics": ["sealed"],
        "messages": [{"topic": "sealed", "body": "from node"}],
        "ssl": True,
    }
    # the roots grpc-js trusts (read when it loads; its client takes the system's)
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs[0])}
    out = run_node_script(modules, "producer.js", args, env=env)
    assert "startup_error" not in out and "error" not in out["receipts"][0], out


def test_a_connection_that_never_completes_its_handshake_is_closed(
    cluster: LocalBrokerCluster,
) -> None:
    """grpc waits 2 minutes for a handshake by default; the node's bound (here 1 s) is
    HTTPS's (--http-tls-handshake-timeout-s)."""
    host, port = cluster.grpc_addrs[cluster.wait_ready()].rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=5)
    try:
        started = time.monotonic()
        assert closed_by_peer(silent, timeout_s=10)
        assert time.monotonic() - started < 8
    finally:
        silent.close()
