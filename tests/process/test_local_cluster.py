"""``LocalBrokerCluster``'s ports: no two alike, even when the OS hands the same free
port to two callers (CI once saw a node's HTTP port given again as another's gRPC port:
that node never started, and the browser talked HTTP/1.1 to the gRPC server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgermq import local_cluster
from ledgermq.local_cluster import LocalBrokerCluster


def test_every_port_of_a_cluster_differs_even_if_each_call_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worst the OS may do: each call's ports were free a moment ago, the same ones.
    monkeypatch.setattr(local_cluster, "free_ports", lambda n: list(range(41000, 41000 + n)))
    c = LocalBrokerCluster(3, tmp_path)
    ports = [*c.http_ports, *c.raft_ports, *c.grpc_ports]
    assert len(ports) == 9
    assert len(set(ports)) == 9, ports


def test_given_http_ports_put_grpc_next_to_them(tmp_path: Path) -> None:
    c = LocalBrokerCluster(2, tmp_path, http_ports=[42000, 42010], raft_ports=[42001, 42011])
    assert c.raft_ports == [42001, 42011]
    assert c.grpc_ports == [
        42000 + local_cluster.GRPC_PORT_OFFSET,
        42010 + local_cluster.GRPC_PORT_OFFSET,
    ]


def test_a_joining_node_takes_none_of_the_members_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_cluster, "free_ports", lambda n: list(range(41000, 41000 + n)))
    c = LocalBrokerCluster(3, tmp_path)
    c.add_node("n3")
    ports = [*c.http_ports, *c.raft_ports, *c.grpc_ports]
    assert len(ports) == 12
    assert len(set(ports)) == 12, ports
