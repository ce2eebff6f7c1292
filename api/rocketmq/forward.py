"""Calls that need the master, from whichever node the client reached.

RocketMQ 5 clients never re-route on an error: a send refused "not master" would be
retried against the same node. So ``MasterCalls.call`` runs the call here when this node
is the master; on a slave it forwards the same request, with the client's metadata, to
the master's gRPC front (``--peer-grpc``, every node's address; shown in ``GET
/v1/cluster``); with no master known (an election, a new master catching up, the master's
front unreachable) it holds the call and tries again until shortly before the client's
deadline, then answers ``HA_NOT_AVAILABLE``.

Why gRPC and not the master's HTTP API: one generic relay serves every RPC as it is
(the master runs exactly the code a client reaching it directly would, streaming RPCs
included), the request is not translated twice, and the client's deadline travels with
it. The cost is that each node must know the others' gRPC addresses, as it knows their
HTTP URLs for redirects. A forwarded call carries ``x-ledgermq-hops``: it is forwarded
again at most once (the master changed under it), never in a loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from broker import errors
from broker.gate import WriteGate

from .protocol import definition_pb2 as pb
from .protocol import service_pb2_grpc
from .settings import GrpcSettings

log = logging.getLogger(__name__)

R = TypeVar("R")
Req = TypeVar("Req")

HOPS_HEADER = "x-ledgermq-hops"
MAX_HOPS = 2
HOLD_STEP_S = 0.05
# The client's metadata a forwarded call keeps: RocketMQ's own headers and its signature.
FORWARDED_HEADERS = ("x-mq-", "authorization")
STREAMING = frozenset({"ReceiveMessage"})  # the server-streaming RPCs forwarded
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


def metadata_of(context: Any) -> dict[str, str]:
    """The call's metadata as a dict (the last value of a repeated key)."""
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def client_id_of(context: Any) -> str:
    """The ``x-mq-client-id`` of the call, stripped ('' when missing)."""
    return metadata_of(context).get("x-mq-client-id", "").strip()


def peer_credentials(g: GrpcSettings) -> Any:
    """What this node trusts when it calls a peer's gRPC front over TLS: ``peer_ca_file``,
    else ``$SSL_CERT_FILE``, else gRPC's own roots."""
    path = g.peer_ca_file or os.environ.get("SSL_CERT_FILE") or None
    if path is None:
        return grpc.ssl_channel_credentials()
    with open(path, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


class MasterCalls:
    """Runs, forwards or holds the calls that need the master (see the module doc)."""

    def __init__(self, settings: GrpcSettings, gate: WriteGate, peers: dict[str, str]) -> None:
        self.settings = settings
        self.gate = gate
        self.peers = peers  # node id → "host:port" of its gRPC front
        self._channels: dict[str, Any] = {}
        self.forwarded = 0  # calls this node handed to the master (tests, metrics)
        self.held = 0  # waits for a master

    async def call(
        self,
        method: str,
        request: Req,
        context: Any,
        local: Callable[[Req], Awaitable[R]],
        refuse: Callable[[int, str], R],
    ) -> R:
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        budget = self.settings.hold_max_s if remaining is None else remaining
        deadline = loop.time() + max(0.0, budget - self.settings.deadline_margin_s)
        md = metadata_of(context)
        hops = int(md.get(HOPS_HEADER, "0") or 0) if md.get(HOPS_HEADER, "0").isdigit() else 0
        why = "no master"
        while True:
            try:
                return await local(request)
            except errors.NotMasterError as e:
                target = self.peers.get(e.leader_id or "")
                why = f"the master {e.leader_id} has no known gRPC address"
                if target is not None and hops < MAX_HOPS:
                    answer = await self._forward(method, request, md, target, hops, deadline)
                    if answer is not None:
                        return answer  # type: ignore[no-any-return]
                    why = f"the master {e.leader_id} ({target}) did not answer"
            except errors.NoMasterError as e:
                why = e.message
            if loop.time() + HOLD_STEP_S > deadline:
                return refuse(pb.Code.HA_NOT_AVAILABLE, f"{why}; held until the deadline")
            self.held += 1
            await asyncio.sleep(HOLD_STEP_S)

    async def _forward(  # noqa: PLR0917  # the call's parts, each used once
        self, method: str, request: Any, md: dict[str, str], target: str, hops: int, deadline: float
    ) -> Any:
        """The master's answer to the same call, or None when it could not be reached (the
        caller holds and tries again)."""
        timeout = deadline - asyncio.get_running_loop().time()
        if timeout <= 0:
            return None
        metadata = [
            (k, v) for k, v in md.items() if k.startswith(FORWARDED_HEADERS) and k != HOPS_HEADER
        ]
        metadata.append((HOPS_HEADER, str(hops + 1)))
        stub = service_pb2_grpc.MessagingServiceStub(self._channel(target))  # type: ignore[no-untyped-call]
        self.forwarded += 1
        try:
            call = getattr(stub, method)(request, metadata=metadata, timeout=timeout)
            if method in STREAMING:  # a server stream: its items, collected
                return [item async for item in call]
            return await call
        except grpc.aio.AioRpcError as e:
            if e.code() in RETRY_CODES:
                log.debug("forward of %s to %s: %s", method, target, e.code())
                return None
            if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return None
            raise

    def _channel(self, target: str) -> Any:
        ch = self._channels.get(target)
        if ch is None:
            options = [("grpc.enable_retries", 0)]
            if self.settings.tls:
                ch = grpc.aio.secure_channel(target, peer_credentials(self.settings), options)
            else:
                ch = grpc.aio.insecure_channel(target, options=options)
            self._channels[target] = ch
        return ch

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()
