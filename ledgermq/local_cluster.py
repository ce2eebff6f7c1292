"""A local LedgerMQ cluster: N ``python -m ledgermq`` child processes on 127.0.0.1.

``ledgermq cluster up`` runs one in the foreground; the tests and the HTTP benchmark use
the same class. Each node gets an HTTP port and a Raft port, every node knows every
node's URL (so a SLAVE redirects writes to the master), and children are started with
``--exit-with-parent``: nothing outlives the process that started them. Every wait is
bounded. A peer secret (docs/operations.md) reaches the children in their environment, out of
``ps``.
"""

from __future__ import annotations

import ssl
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from api.rocketmq.settings import GRPC_PORT_OFFSET
from ledgermq.processes import ChildNodes, free_ports, peer_secret_env


class LocalBrokerCluster(ChildNodes):
    def __init__(
        self,
        n: int,
        data_dir: Path,
        *,
        http_ports: Sequence[int] | None = None,
        raft_ports: Sequence[int] | None = None,
        grpc_ports: Sequence[int] | None = None,
        group: str = "g0",
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
        inherit_output: bool = False,
        peer_secret: bytes | None = None,
        probe_token: str | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``tls``: (CA bundle, certificate chain, key) PEM files: the nodes serve HTTPS
        and gRPC over TLS with that certificate, trust that CA for their peers, and the
        probes here verify with it."""
        if not 1 <= n <= 9:
            raise ValueError("a local cluster has 1 to 9 nodes")
        super().__init__(
            [f"n{i}" for i in range(n)],
            log_dir or data_dir,
            inherit_output=inherit_output,
            env=peer_secret_env(peer_secret),
        )
        # Every port this cluster takes comes from one free_ports call, so no two are
        # alike: a node's gRPC port that equals another's HTTP port (two calls can hand out
        # the same port) leaves one of them unstarted and the other answering the wrong
        # protocol on it.
        want_grpc = grpc_ports is None and http_ports is None
        given = http_ports is not None and raft_ports is not None
        ports = free_ports((0 if given else 2 * n) + (n if want_grpc else 0))
        self.http_ports = list(http_ports) if http_ports is not None else ports[:n]
        self.raft_ports = list(raft_ports) if raft_ports is not None else ports[n : 2 * n]
        # gRPC (RocketMQ 5): given, or next to HTTP as a node's default when HTTP ports
        # were given (``cluster up``), else free ports like the others.
        if grpc_ports is None:
            grpc_ports = (
                ports[-n:] if want_grpc else [p + GRPC_PORT_OFFSET for p in self.http_ports]
            )
        self.grpc_ports = list(grpc_ports)
        self.grpc_addrs = {
            i: f"127.0.0.1:{p}" for i, p in zip(self.ids, self.grpc_ports, strict=True)
        }
        self.peer_grpc = ",".join(f"{i}={a}" for i, a in self.grpc_addrs.items())
        scheme = "http" if tls is None else "https"
        self.urls = {
            i: f"{scheme}://127.0.0.1:{p}" for i, p in zip(self.ids, self.http_ports, strict=True)
        }
        self.raft_addrs = {
            i: f"127.0.0.1:{p}" for i, p in zip(self.ids, self.raft_ports, strict=True)
        }
        self.joining: set[str] = set()  # nodes started with --join (``add_node``)
        self.peer_spec = ";".join(f"{i}-{a}" for i, a in self.raft_addrs.items())
        self.peer_urls = ",".join(f"{i}={u}" for i, u in self.urls.items())
        self.data_dir = data_dir
        self.group = group
        self.extra_args = list(extra_args)
        # what the probes trust: the cluster's CA, else the system's
        self.verify: ssl.SSLContext | bool = (
            True if tls is None else ssl.create_default_context(cafile=str(tls[0]))
        )
        if tls is not None:
            ca, cert, key = (str(f) for f in tls)
            self.extra_args += ["--ssl-certfile", cert, "--ssl-keyfile", key, "--peer-ca-file", ca]
        # the bearer token the probes (/v1/cluster) send to nodes that require tokens
        self.probe_token = probe_token

    def add_node(self, node: str) -> None:
        """Make room for ``node``, a node that joins the running group (``--join``): its
        ports, and ``--peers`` naming every node here, itself too. Start it with
        ``start``; the master adds it (``ledgermq cluster add``)."""
        if node in self.ids:
            raise ValueError(f"{node} is here already")
        taken = {*self.http_ports, *self.raft_ports, *self.grpc_ports}  # a stopped node's too
        http, raft, grpc = [p for p in free_ports(3 + len(taken)) if p not in taken][:3]
        self.ids.append(node)
        self.http_ports.append(http)
        self.raft_ports.append(raft)
        self.grpc_ports.append(grpc)
        self.grpc_addrs[node] = f"127.0.0.1:{grpc}"
        scheme = self.urls[self.ids[0]].split("://", 1)[0]
        self.urls[node] = f"{scheme}://127.0.0.1:{http}"
        self.raft_addrs[node] = f"127.0.0.1:{raft}"
        self.joining.add(node)
        self._specs()

    def _specs(self) -> None:
        self.peer_spec = ";".join(f"{i}-{a}" for i, a in self.raft_addrs.items())
        self.peer_urls = ",".join(f"{i}={u}" for i, u in self.urls.items())
        self.peer_grpc = ",".join(f"{i}={a}" for i, a in self.grpc_addrs.items())

    @property
    def grpc_endpoints(self) -> str:
        """The RocketMQ 5 clients' access point for every node: ``"h:p;h:p;h:p"``."""
        return ";".join(self.grpc_addrs.values())

    @property
    def brokers(self) -> str:
        """The ``--brokers`` value for clients: every node's URL."""
        return ",".join(self.urls.values())

    def command(self, node: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ledgermq",
            "--node-id",
            node,
            "--group",
            self.group,
            "--peers",
            self.peer_spec,
            "--http",
            self.urls[node].split("://", 1)[1],
            "--peer-urls",
            self.peer_urls,
            "--grpc",
            self.grpc_addrs[node],
            "--peer-grpc",
            self.peer_grpc,
            "--data-dir",
            str(self.data_dir / node),
            "--exit-with-parent",
            *(["--join"] if node in self.joining else []),
            *self.extra_args,
        ]

    # ---- probing -------------------------------------------------------------------------

    def cluster_info(self, node: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
        try:
            headers = {"Authorization": f"Bearer {self.probe_token}"} if self.probe_token else {}
            r = httpx.get(
                self.urls[node] + "/v1/cluster",
                headers=headers,
                timeout=timeout_s,
                verify=self.verify,
            )
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def ready(self, node: str, timeout_s: float = 2.0) -> bool:
        try:
            r = httpx.get(self.urls[node] + "/readyz", timeout=timeout_s, verify=self.verify)
            return r.status_code == 200
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
