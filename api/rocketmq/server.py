"""The node's gRPC server for RocketMQ 5 clients: ``RocketMQFront.start`` /
``stop``, on the node's own event loop (grpcio's asyncio server beside uvicorn and the
Raft runtime).

Server options: a received message may be as large as a whole produce request plus
1 MiB of headers (grpc's default of 4 MiB would refuse a 4 MiB body before the service
could answer MESSAGE_BODY_TOO_LARGE); HTTP/2 keepalive pings notice dead clients; a
connection that does not finish its handshake within ``handshake_timeout_s`` is closed
(grpc's default: 2 minutes); ``SO_REUSEPORT`` is off, so a port in use fails the start
instead of being shared with another process. With the node's certificate
(``--ssl-certfile``) the port serves TLS only, as HTTPS does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from broker.broker import Broker
from broker.settings import BrokerSettings

from .auth import Authenticator
from .forward import MasterCalls
from .protocol import service_pb2_grpc
from .service import MessagingService
from .settings import GrpcSettings

log = logging.getLogger(__name__)

MiB = 1 << 20


def server_options(settings: BrokerSettings, grpc_settings: GrpcSettings) -> list[tuple[str, int]]:
    limits, g = settings.limits, grpc_settings
    receive = max(limits.max_request_bytes, limits.max_body_bytes) + MiB
    return [
        ("grpc.max_receive_message_length", receive),
        ("grpc.max_send_message_length", -1),
        ("grpc.keepalive_time_ms", int(g.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(g.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(g.min_client_ping_interval_s * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", 0),
        ("grpc.server_handshake_timeout_ms", int(g.handshake_timeout_s * 1000)),
    ]


def server_credentials(g: GrpcSettings) -> Any:
    """The node's certificate chain and key (PEM files) as gRPC's server credentials;
    ``OSError`` naming the file that cannot be read."""
    assert g.certfile is not None and g.keyfile is not None
    with open(g.keyfile, "rb") as key, open(g.certfile, "rb") as chain:
        return grpc.ssl_server_credentials([(key.read(), chain.read())])


class RocketMQFront:
    """The gRPC server of one node and its service."""

    def __init__(
        self,
        settings: BrokerSettings,
        grpc_settings: GrpcSettings,
        broker: Broker,
        auth: Authenticator | None = None,
    ):
        self.grpc_settings = grpc_settings
        self.broker = broker
        peers = {n: a for n, a in settings.peer_grpc.items() if n != settings.node_id}
        self.master = MasterCalls(grpc_settings, broker.gate, peers)
        self.service = MessagingService(
            settings=settings,
            grpc_settings=grpc_settings,
            gate=broker.gate,
            topics=broker.topics,
            producer=broker.producer,
            timers=broker.timers,
            pop=broker.pop,
            master=self.master,
            transactions=broker.transactions,
            reads=broker.reads,
            auth=auth,
        )
        self._checks: asyncio.Task[None] | None = None
        self.server: Any = grpc.aio.server(options=server_options(settings, grpc_settings))
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.server)  # type: ignore[no-untyped-call]

    async def start(self) -> int:
        """Bind and serve; the port bound (``OSError`` when it cannot)."""
        g = self.grpc_settings
        address = f"[{g.host}]:{g.port}" if ":" in g.host else f"{g.host}:{g.port}"
        try:
            if g.tls:
                port = int(self.server.add_secure_port(address, server_credentials(g)))
            else:
                port = int(self.server.add_insecure_port(address))
        except RuntimeError as e:
            raise OSError(f"could not serve gRPC on {address}: {e}") from None
        if port == 0:
            raise OSError(f"could not serve gRPC on {address}")
        await self.server.start()
        # every check applied here is offered to the producers connected here
        self.broker.transactions.applier.on_checked = self.service.checks.on_checked
        self._checks = asyncio.create_task(self.service.checks.run(), name="grpc-tx-checks")
        self.service.renewer.start()
        return port

    async def stop(self) -> None:
        await self.service.renewer.stop()
        if self.broker.transactions.applier.on_checked == self.service.checks.on_checked:
            self.broker.transactions.applier.on_checked = None
        if self._checks is not None:
            self._checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checks
        await self.server.stop(self.grpc_settings.graceful_shutdown_s)
        await self.master.close()
