"""The settings of a node's RocketMQ 5 gRPC front (``--grpc``), apart from the service so
that a node whose generated protocol modules are missing can still read its options."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

AUTO_RENEW_ENV = "LEDGERMQ_GRPC_AUTO_RENEW_MS"


def _auto_renew_ms() -> int:
    """The invisible time of a push consumer's messages (``$LEDGERMQ_GRPC_AUTO_RENEW_MS``,
    for tests; RocketMQ's proxy: 60 s)."""
    text = os.environ.get(AUTO_RENEW_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) >= 1000 else 60_000


GRPC_PORT_OFFSET = 2000
"""``--grpc``'s default port: the HTTP port + 2000 (Raft's is + 1000), so ``ledgermq
cluster up``'s nodes on 8080, 8081, 8082 serve gRPC on 10080, 10081, 10082."""


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    host: str = "127.0.0.1"
    port: int = 8080 + GRPC_PORT_OFFSET
    # A call that needs the master waits this long at most for one (an election) when
    # the client set no deadline; with a deadline, until shortly before it.
    hold_max_s: float = 10.0
    # Seconds of the client's deadline kept back to answer in time after a hold.
    deadline_margin_s: float = 0.2
    # Clients (Telemetry settings, heartbeats) this node remembers; the oldest seen goes.
    max_clients: int = 10_000
    # HTTP/2 keepalive pings to notice dead clients, and the pings clients may send.
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    min_client_ping_interval_s: float = 10.0
    # Seconds a stopping node lets calls in flight finish.
    graceful_shutdown_s: float = 3.0
    # A connection's handshake (TLS, HTTP/2's preface) within this long, or it is closed
    # (grpc's own default: 120 s), as HTTPS's --http-tls-handshake-timeout-s.
    handshake_timeout_s: float = 5.0
    # Push consumers (a receive with ``auto_renew``): their messages are invisible this
    # long, renewed by the master while the client is alive (seen within
    # ``client_idle_s``) once less than a sixth of it is left, checked every twelfth,
    # for ``renew_max_s`` at most; a client that ends (or goes idle) has its messages
    # visible again ``release_ms`` later. RocketMQ's proxy: 60 s, 10 s ahead, every 5 s,
    # 3 h, 120 s idle, 1 s.
    auto_renew_ms: int = field(default_factory=_auto_renew_ms)
    renew_max_s: float = 3 * 3600.0
    client_idle_s: float = 120.0
    release_ms: int = 1000
    # Given explicitly (--grpc): a port that cannot be bound stops the node. The default
    # address (HTTP port + 2000) may be taken by something else on a busy machine: the
    # node then serves without gRPC and says so.
    required: bool = False
    # A signed call (a node with tokens or --access-keys-file: api/rocketmq/auth.py) whose
    # x-mq-date-time is further than this from the node's clock is refused: how long a
    # captured signature stays good.
    auth_max_skew_s: float = 900.0
    # TLS (the node's --ssl-certfile and --ssl-keyfile: one certificate for HTTPS and
    # gRPC); None: plaintext. The calls forwarded to the master then go over TLS too,
    # trusting ``peer_ca_file`` (PEM; None: $SSL_CERT_FILE, else gRPC's own roots).
    certfile: str | None = None
    keyfile: str | None = None
    peer_ca_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.certfile is not None


def renew_ahead_ms(g: GrpcSettings) -> int:
    return g.auto_renew_ms // 6


def renew_period_s(g: GrpcSettings) -> float:
    return g.auto_renew_ms / 12_000


def default_grpc_address(http_host: str, http_port: int) -> tuple[str, int]:
    """Where a node serves gRPC unless told: the HTTP host, the HTTP port + 2000."""
    return http_host, http_port + GRPC_PORT_OFFSET


def parse_grpc_peers(spec: str) -> dict[str, str]:
    """``"n0=h0:10080,n1=h1:10080"`` → {node id: "host:port"}."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        node, sep, addr = part.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not node or not colon or not host or not port.isdigit():
            raise ValueError(f"{part!r}: want node=host:port")
        out[node] = addr
    return out
