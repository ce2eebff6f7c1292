"""``apache.rocketmq.v2.MessagingService`` over one node's broker (docs/rocketmq.md).

What is served (docs/rocketmq.md has the table): QueryRoute, Heartbeat,
NotifyClientTermination, Telemetry (the Settings handshake, and transaction checks to
producers), SendMessage (normal, FIFO, delay, transactional; a resent message id is
stored once: the send window, ``broker/sendwindow.py``), EndTransaction, RecallMessage,
and the consumers' RPCs. Every other RPC is the generated base class's: gRPC
UNIMPLEMENTED.

The rules the official clients need (docs/rocketmq.md): every response carries a
status with a non-zero code, errors travel as gRPC OK plus that code (the clients read
nothing else), SendMessage has a status per entry too; routes echo the access point the
client used, with queue ids 0..n-1 of one broker (id 0, READ_WRITE); the server, not the
client, picks the queue.

Any node serves any call: what needs the master goes through ``MasterCalls``
(``api/rocketmq/forward.py``), which runs it here on the master, forwards it to the master
from a slave, and holds it through an election up to the client's deadline. The calls
reach the broker through the same services as the HTTP routes (``Producer``, ``Timers``,
``Topics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.duration_pb2 import Duration

from broker import errors
from broker.copies import PROP_REAL_TOPIC
from broker.gate import BrokerRole, WriteGate
from broker.pop.service import PopGroups
from broker.pop.state import PopConfig
from broker.produce import Producer
from broker.reads import Reads
from broker.sendwindow import send_session
from broker.settings import BrokerSettings
from broker.timers.service import Timers
from broker.topics import Topics
from broker.transactions.service import Transactions

from . import consume
from .auth import Authenticator
from .codes import OK, broker_error_code, status
from .convert import SendRefusedError, to_send_batch
from .forward import MasterCalls, client_id_of, metadata_of
from .protocol import definition_pb2 as pb
from .protocol import service_pb2 as spb
from .protocol import service_pb2_grpc
from .renew import Renewer
from .settings import GrpcSettings
from .transactions import ProducerStreams, Stream, TransactionChecks, end_transaction

log = logging.getLogger(__name__)

Code = pb.Code
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)

# What Settings replies carry (the proxy's defaults, ProxyConfig and SubscriptionGroupConfig).
PRODUCER_MAX_ATTEMPTS = 3
CONSUMER_MAX_ATTEMPTS = 17  # 16 retries, RocketMQ's retryMaxTimes
CUSTOMIZED_BACKOFF_S = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_S = 20


@dataclass(slots=True)
class ClientInfo:
    """What this node knows of one client (node-local: the client's connection is here)."""

    client_type: int
    seen_at: float  # monotonic seconds
    settings: pb.Settings | None = None


class Clients:
    """The clients this node has heard from, by ``x-mq-client-id``: at most ``limit``, the
    one seen longest ago forgotten first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._clients: OrderedDict[str, ClientInfo] = OrderedDict()

    def seen(self, client_id: str, client_type: int, settings: pb.Settings | None = None) -> None:
        info = self._clients.pop(client_id, None) or ClientInfo(client_type, 0.0)
        info.seen_at = time.monotonic()
        if client_type:
            info.client_type = client_type
        if settings is not None:
            info.settings = settings
        self._clients[client_id] = info
        while len(self._clients) > self.limit:
            self._clients.popitem(last=False)

    def forget(self, client_id: str) -> None:
        self._clients.pop(client_id, None)

    def get(self, client_id: str) -> ClientInfo | None:
        return self._clients.get(client_id)

    def __len__(self) -> int:
        return len(self._clients)


def settings_reply(
    client: pb.Settings, max_body_bytes: int, group: PopConfig | None = None
) -> pb.Settings | None:
    """The client's Settings with the server's values in (the proxy's
    ``GrpcClientSettingsManager``): None for a client type this server does not know.
    A consumer's FIFO flag and retry policy are its POP group's (``group``, replicated),
    RocketMQ's defaults while the group is not made yet."""
    out = pb.Settings()
    out.CopyFrom(client)
    out.metric.on = False
    out.metric.ClearField("endpoints")
    if client.client_type == pb.PRODUCER:
        out.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        exp = out.backoff_policy.exponential_backoff
        exp.initial.CopyFrom(Duration(nanos=10_000_000))
        exp.max.CopyFrom(Duration(seconds=1))
        exp.multiplier = 2.0
        out.publishing.max_body_size = max_body_bytes
        out.publishing.validate_message_type = True
        return out
    if client.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
        sub = out.subscription
        sub.fifo = group.fifo if group is not None else False
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        if client.client_type == pb.PUSH_CONSUMER or not sub.HasField("long_polling_timeout"):
            sub.long_polling_timeout.CopyFrom(Duration(seconds=LONG_POLLING_TIMEOUT_S))
        _retry_policy(out.backoff_policy, group, client.user_agent.language)
        return out
    return None


def _retry_policy(out: pb.RetryPolicy, group: PopConfig | None, language: int = 0) -> None:
    """A consumer group's retry policy as the protocol's: a list of delays as a
    customized backoff, an exponential one as such. Node's client (1.0.8) reads no
    customized backoff ("not yet implemented"): without a policy it gives a FIFO
    message up after one failure and nacks others for no time, so a Node client gets
    the list as the exponential backoff through its first and last delays."""
    delays_ms: list[int]
    if group is None:
        out.max_attempts = CONSUMER_MAX_ATTEMPTS
        delays_ms = [s * 1000 for s in CUSTOMIZED_BACKOFF_S]
    elif group.retry.policy == "list":
        out.max_attempts = group.max_delivery_attempts
        delays_ms = list(group.retry.delays_ms)
    else:
        out.max_attempts = group.max_delivery_attempts
        r = group.retry
        _exponential(out, r.initial_ms, r.max_ms, r.multiplier)
        return
    if language != pb.NODE_JS:
        out.customized_backoff.next.extend(_duration(ms) for ms in delays_ms)
        return
    first, last = delays_ms[0], max(delays_ms)
    steps = max(1, len(delays_ms) - 1)
    growth = (last / first) ** (1 / steps) if first > 0 and last > first else 1.0
    _exponential(out, first, last, growth)


def _exponential(out: pb.RetryPolicy, initial_ms: int, max_ms: int, multiplier: float) -> None:
    exp = out.exponential_backoff
    exp.initial.CopyFrom(_duration(initial_ms))
    exp.max.CopyFrom(_duration(max_ms))
    exp.multiplier = multiplier


def _duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """The servicer; built once per node (``api/rocketmq/server.py``)."""

    def __init__(
        self,
        *,
        settings: BrokerSettings,
        grpc_settings: GrpcSettings,
        gate: WriteGate,
        topics: Topics,
        producer: Producer,
        timers: Timers,
        pop: PopGroups,
        master: MasterCalls,
        transactions: Transactions,
        reads: Reads,
        auth: Authenticator | None = None,
        clock: Any = None,
    ) -> None:
        self.settings = settings
        self.grpc_settings = grpc_settings
        self.gate = gate
        self.topics = topics
        self.producer = producer
        self.timers = timers
        self.pop = pop
        self.master = master
        self.transactions = transactions
        self.auth = auth  # None: no credentials checked (a node without tokens)
        self.clients = Clients(grpc_settings.max_clients)
        # the producers' Telemetry streams here, and the transaction checks offered on them
        self.streams = ProducerStreams()
        self.checks = TransactionChecks(transactions, reads, self.streams, self._maker)
        self.renewer = Renewer(grpc_settings, gate, pop)
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.own_endpoints = pb.Endpoints(
            scheme=pb.IPv4,
            addresses=[pb.Address(host=grpc_settings.host, port=grpc_settings.port)],
        )

    # ---- routes ---------------------------------------------------------------------

    async def QueryRoute(
        self, request: spb.QueryRouteRequest, context: Any
    ) -> spb.QueryRouteResponse:
        if not client_id_of(context):
            return spb.QueryRouteResponse(status=status(Code.CLIENT_ID_REQUIRED))
        name = request.topic.name
        if not name:
            return spb.QueryRouteResponse(status=status(Code.ILLEGAL_TOPIC, "no topic"))
        if refused := self._refused(context, ("produce", "consume"), (name,)):
            return spb.QueryRouteResponse(status=status(*refused))
        queues = self._queues_of(name)
        if queues is None:  # unknown here; a slave may lag the master: ask it
            return await self.master.call(
                "QueryRoute",
                request,
                context,
                self._route_on_master,
                lambda code, text: spb.QueryRouteResponse(status=status(code, text)),
            )
        return self._route(request, queues)

    def _queues_of(self, name: str) -> int | None:
        t = self.topics.meta.topics.get(name)
        if t is not None:
            return t.queues
        if self.settings.auto_create_topics:
            return self.settings.default_queues  # created by its first send
        return None

    async def _route_on_master(self, request: spb.QueryRouteRequest) -> spb.QueryRouteResponse:
        self.gate.require_master_role()
        queues = self._queues_of(request.topic.name)
        if queues is None:
            return spb.QueryRouteResponse(
                status=status(Code.TOPIC_NOT_FOUND, f"topic {request.topic.name} does not exist")
            )
        return self._route(request, queues)

    def _route(self, request: spb.QueryRouteRequest, queues: int) -> spb.QueryRouteResponse:
        """One broker (this replica group) with the topic's queues, reached at the access
        point the client used (echoed, as RocketMQ's proxy does), or at this node."""
        endpoints = request.endpoints if request.endpoints.addresses else self.own_endpoints
        broker = pb.Broker(name=self.settings.group, id=0, endpoints=endpoints)
        topic = pb.Resource(
            name=request.topic.name, resource_namespace=request.topic.resource_namespace
        )
        return spb.QueryRouteResponse(
            status=OK,
            message_queues=[
                pb.MessageQueue(
                    topic=topic,
                    id=q,
                    permission=pb.READ_WRITE,
                    broker=broker,
                    accept_message_types=ACCEPTED_TYPES,
                )
                for q in range(queues)
            ],
        )

    # ---- clients --------------------------------------------------------------------

    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Any) -> spb.HeartbeatResponse:
        client_id = client_id_of(context)
        if not client_id:
            return spb.HeartbeatResponse(status=status(Code.CLIENT_ID_REQUIRED))
        if refused := self._refused(context):
            return spb.HeartbeatResponse(status=status(*refused))
        self.clients.seen(client_id, request.client_type)
        self.renewer.liveness.seen(client_id)
        if self.is_master or not request.HasField("group"):
            return spb.HeartbeatResponse(status=OK)
        # A consumer's: the master renews its messages while it hears from it.
        return await self.master.call(
            "Heartbeat",
            request,
            context,
            self._on_master(spb.HeartbeatResponse(status=OK)),
            lambda code, text: spb.HeartbeatResponse(status=status(code, text)),
        )

    def _on_master(self, answer: Any) -> Any:
        """A call whose whole work on the master is the liveness the handler noted."""

        async def local(_request: Any) -> Any:
            self.gate.require_master_role()
            return answer

        return local

    async def NotifyClientTermination(
        self, request: spb.NotifyClientTerminationRequest, context: Any
    ) -> spb.NotifyClientTerminationResponse:
        client_id = client_id_of(context)
        if not client_id:
            return spb.NotifyClientTerminationResponse(status=status(Code.CLIENT_ID_REQUIRED))
        if refused := self._refused(context):
            return spb.NotifyClientTerminationResponse(status=status(*refused))
        self.clients.forget(client_id)
        self.renewer.liveness.ended(client_id)
        if self.is_master or not request.HasField("group"):
            return spb.NotifyClientTerminationResponse(status=OK)
        # A consumer's: the master lets its auto-renewed messages go.
        return await self.master.call(
            "NotifyClientTermination",
            request,
            context,
            self._on_master(spb.NotifyClientTerminationResponse(status=OK)),
            lambda code, text: spb.NotifyClientTerminationResponse(status=status(code, text)),
        )

    async def Telemetry(
        self, request_iterator: AsyncIterator[spb.TelemetryCommand], context: Any
    ) -> AsyncIterator[spb.TelemetryCommand]:
        """Answer every Settings command with the merged Settings, and write the server's
        commands (transaction checks, ``api/rocketmq/transactions.py``) to a producer's
        stream; the other client commands (answers to diagnostics) are read and dropped."""
        client_id = client_id_of(context)
        if not client_id:
            yield spb.TelemetryCommand(status=status(Code.CLIENT_ID_REQUIRED))
            return
        if refused := self._refused(context):
            yield spb.TelemetryCommand(status=status(*refused))
            return
        stream = self.streams.open(client_id)

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.HasField("settings"):
                        stream.out.put_nowait(self._settings_command(client_id, stream, command))
            finally:
                stream.out.put_nowait(None)  # the client's side ended: so does ours

        reader = asyncio.create_task(read())
        try:
            while (item := await stream.out.get()) is not None:
                yield item
        finally:
            self.streams.close(stream)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    def _settings_command(
        self, client_id: str, stream: Stream, command: spb.TelemetryCommand
    ) -> spb.TelemetryCommand:
        cs = command.settings
        group = None
        if cs.WhichOneof("pub_sub") == "subscription" and cs.subscription.HasField("group"):
            group = self.pop.state.groups.get(cs.subscription.group.name)
        reply = settings_reply(cs, self.settings.limits.max_body_bytes, group)
        if reply is None:
            return spb.TelemetryCommand(
                status=status(
                    Code.UNRECOGNIZED_CLIENT_TYPE,
                    f"client type {command.settings.client_type} is not served",
                )
            )
        self.clients.seen(client_id, reply.client_type, reply)
        self.streams.publishing(stream, reply)
        return spb.TelemetryCommand(status=OK, settings=reply)

    # ---- produce --------------------------------------------------------------------

    async def SendMessage(
        self, request: spb.SendMessageRequest, context: Any
    ) -> spb.SendMessageResponse:
        n = len(request.messages)
        if not client_id_of(context):
            return _send_refused(Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required", n)
        topics = sorted({m.topic.name for m in request.messages})
        if refused := self._refused(context, ("produce",), topics):
            return _send_refused(*refused, n)
        if not self.is_master:  # checked here: nothing to forward for a refusal (the
            try:  # master checks as it converts: once, bench/README.md "grpc_bench.py")
                to_send_batch(request.messages, self.settings.limits, self.clock())
            except SendRefusedError as e:
                return _send_refused(e.code, e.message, n)
        return await self.master.call(
            "SendMessage",
            request,
            context,
            self._send_on_master,
            lambda code, text: _send_refused(code, text, n),
        )

    async def _send_on_master(self, request: spb.SendMessageRequest) -> spb.SendMessageResponse:
        """The send, on this node; the broker's NotMaster/NoMaster refusals propagate (to
        ``MasterCalls``), the others are answered."""
        n = len(request.messages)
        try:
            batch = to_send_batch(request.messages, self.settings.limits, self.clock())
        except SendRefusedError as e:
            return _send_refused(e.code, e.message, n)
        pid, seq = send_session(batch.message_id)  # a resend is answered, not stored again
        try:
            if batch.transactional:  # the topic is the producer group, as in RocketMQ
                begun = await self.transactions.produce(
                    batch.topic, batch.messages, batch.topic, pid, seq
                )
                entries = [
                    spb.SendResultEntry(
                        status=OK,
                        message_id=m.uniq_key or "",
                        transaction_id=begun.transaction_id,
                        offset=r.queue_offset,
                    )
                    for m, r in zip(batch.messages, begun.results, strict=True)
                ]
            elif batch.delayed:
                scheduled = await self.timers.produce(batch.topic, batch.messages, pid, seq)
                entries = [
                    spb.SendResultEntry(
                        status=OK,
                        message_id=m.uniq_key or "",
                        offset=0,
                        recall_handle=s.recall_handle,
                    )
                    for m, s in zip(batch.messages, scheduled, strict=True)
                ]
            else:
                results = await self.producer.produce(batch.topic, batch.messages, pid, seq)
                entries = [
                    spb.SendResultEntry(
                        status=OK, message_id=m.uniq_key or "", offset=r.queue_offset
                    )
                    for m, r in zip(batch.messages, results, strict=True)
                ]
        except (errors.NotMasterError, errors.NoMasterError):
            raise
        except errors.BrokerError as e:
            return _send_refused(broker_error_code(e), e.message, n)
        return spb.SendMessageResponse(status=OK, entries=entries)

    async def EndTransaction(
        self, request: spb.EndTransactionRequest, context: Any
    ) -> spb.EndTransactionResponse:
        """Commit or roll back (the client's own, or its answer to a check), on the master."""
        if not client_id_of(context):
            return spb.EndTransactionResponse(status=status(Code.CLIENT_ID_REQUIRED))
        if refused := self._refused(context, ("produce",), (request.topic.name,)):
            return spb.EndTransactionResponse(status=status(*refused))
        return await self.master.call(
            "EndTransaction",
            request,
            context,
            lambda r: end_transaction(self.transactions, r),
            lambda code, text: spb.EndTransactionResponse(status=status(code, text)),
        )

    async def RecallMessage(
        self, request: spb.RecallMessageRequest, context: Any
    ) -> spb.RecallMessageResponse:
        """Cancel a delay message before its time, by the recall handle its send answered
        (``Timers.cancel``), on the master; the answer names the message's id."""
        if not client_id_of(context):
            return spb.RecallMessageResponse(status=status(Code.CLIENT_ID_REQUIRED))
        if refused := self._refused(context, ("produce",), (request.topic.name,)):
            return spb.RecallMessageResponse(status=status(*refused))
        if not request.recall_handle:
            return spb.RecallMessageResponse(status=status(Code.BAD_REQUEST, "no recall_handle"))
        return await self.master.call(
            "RecallMessage",
            request,
            context,
            self._recall_on_master,
            lambda code, text: spb.RecallMessageResponse(status=status(code, text)),
        )

    async def _recall_on_master(
        self, request: spb.RecallMessageRequest
    ) -> spb.RecallMessageResponse:
        self.gate.require_master()
        handle = request.recall_handle
        try:
            held = await self.timers.held_message(handle)
            topic = None if held is None else held.properties.get(PROP_REAL_TOPIC)
            if topic is not None and request.topic.name and topic != request.topic.name:
                raise errors.RecallHandleNotFoundError(
                    f"no delay message {handle!r} in topic {request.topic.name}"
                )
            await self.timers.cancel(handle)
        except (errors.NotMasterError, errors.NoMasterError):
            raise
        except errors.BrokerError as e:
            return spb.RecallMessageResponse(status=status(broker_error_code(e), e.message))
        message_id = (held.uniq_key if held is not None else None) or ""
        return spb.RecallMessageResponse(status=OK, message_id=message_id)

    @property
    def is_master(self) -> bool:
        return self.gate.role is BrokerRole.MASTER

    def _refused(
        self, context: Any, actions: tuple[str, ...] = (), topics: Any = ()
    ) -> tuple[int, str] | None:
        """Why this call may not go on (its code and message), or None: on a node with
        credentials (``api/rocketmq/auth.py``) every call must be signed by a known key
        whose scopes allow one of ``actions`` on each of ``topics``. Checked on every node
        the call reaches: a call a slave forwards keeps its signature and the master
        checks it again."""
        if self.auth is None:
            return None
        try:
            grant = self.auth.grant_of(metadata_of(context))
            for topic in topics:
                self.auth.need(grant, actions, topic)
        except errors.BrokerError as e:
            return broker_error_code(e), e.message
        return None

    # ---- consume (POP groups) ---------------------------------------------------------

    async def ReceiveMessage(
        self, request: spb.ReceiveMessageRequest, context: Any
    ) -> AsyncIterator[spb.ReceiveMessageResponse]:
        """A long-polling receive from every queue of the topic, on the master; the
        stream: a status, the messages, the delivery time (what the proxy writes)."""
        client_id = client_id_of(context)
        if not client_id:
            items = consume.receive_refused(Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
        elif refused := self._refused(context, ("consume",), (request.message_queue.topic.name,)):
            items = consume.receive_refused(*refused)
        else:
            self.renewer.liveness.seen(client_id)
            g = self.grpc_settings
            renew = consume.AutoRenew(client_id, g.auto_renew_ms, int(g.renew_max_s * 1000))
            try:
                consume.check_receive(request, self.settings.limits.max_wait_ms)
            except consume.ConsumeRefusedError as e:
                items = consume.receive_refused(e.code, e.message)
            else:
                remaining = context.time_remaining()

                async def local(r: spb.ReceiveMessageRequest) -> list[spb.ReceiveMessageResponse]:
                    return await consume.receive(
                        self.pop,
                        r,
                        time_remaining_s=remaining,
                        max_wait_ms=self.settings.limits.max_wait_ms,
                        make=self._maker,
                        renew=renew,
                    )

                items = await self.master.call(
                    "ReceiveMessage", request, context, local, consume.receive_refused
                )
        for item in items:
            yield item

    def _maker(self, namespace: str) -> consume.ProtoMessages:
        return consume.ProtoMessages(
            self.settings.group, self.settings.peer_grpc.get(self.settings.node_id, ""), namespace
        )

    async def AckMessage(
        self, request: spb.AckMessageRequest, context: Any
    ) -> spb.AckMessageResponse:
        if not client_id_of(context):
            return spb.AckMessageResponse(status=status(Code.CLIENT_ID_REQUIRED))
        if refused := self._refused(context, ("consume",), (request.topic.name,)):
            return spb.AckMessageResponse(status=status(*refused))
        self.renewer.liveness.seen(client_id_of(context))
        return await self.master.call(
            "AckMessage",
            request,
            context,
            lambda r: consume.ack(self.pop, r),
            lambda code, text: spb.AckMessageResponse(status=status(code, text)),
        )

    async def ChangeInvisibleDuration(
        self, request: spb.ChangeInvisibleDurationRequest, context: Any
    ) -> spb.ChangeInvisibleDurationResponse:
        if not client_id_of(context):
            return spb.ChangeInvisibleDurationResponse(
                status=status(Code.CLIENT_ID_REQUIRED), receipt_handle=request.receipt_handle
            )
        if refused := self._refused(context, ("consume",), (request.topic.name,)):
            return spb.ChangeInvisibleDurationResponse(
                status=status(*refused), receipt_handle=request.receipt_handle
            )
        self.renewer.liveness.seen(client_id_of(context))
        return await self.master.call(
            "ChangeInvisibleDuration",
            request,
            context,
            lambda r: consume.change_invisible(self.pop, r),
            lambda code, text: spb.ChangeInvisibleDurationResponse(
                status=status(code, text), receipt_handle=request.receipt_handle
            ),
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: spb.ForwardMessageToDeadLetterQueueRequest, context: Any
    ) -> spb.ForwardMessageToDeadLetterQueueResponse:
        client_id = client_id_of(context)
        if not client_id:
            return spb.ForwardMessageToDeadLetterQueueResponse(
                status=status(Code.CLIENT_ID_REQUIRED)
            )
        if refused := self._refused(context, ("consume",), (request.topic.name,)):
            return spb.ForwardMessageToDeadLetterQueueResponse(status=status(*refused))
        self.renewer.liveness.seen(client_id)
        return await self.master.call(
            "ForwardMessageToDeadLetterQueue",
            request,
            context,
            lambda r: consume.forward_to_dead_letters(self.pop, r),
            lambda code, text: spb.ForwardMessageToDeadLetterQueueResponse(
                status=status(code, text)
            ),
        )

    async def QueryAssignment(
        self, request: spb.QueryAssignmentRequest, context: Any
    ) -> spb.QueryAssignmentResponse:
        """Where a push consumer receives: one assignment, queue id -1 ("any queue", the
        proxy's for a non-FIFO group), at the endpoints the client names, on any node
        (nothing to forward: a receive draws from every queue, and a FIFO group's order
        is kept by its queues' blocking, not by the assignment). The same bytes every
        time: the clients rebuild their receive loops when it changes."""
        client_id = client_id_of(context)
        if not client_id:
            return spb.QueryAssignmentResponse(status=status(Code.CLIENT_ID_REQUIRED))
        name = request.topic.name
        if refused := self._refused(context, ("consume",), (name,)):
            return spb.QueryAssignmentResponse(status=status(*refused))
        self.renewer.liveness.seen(client_id)
        if not name:
            return spb.QueryAssignmentResponse(status=status(Code.ILLEGAL_TOPIC, "no topic"))
        if not request.group.name:
            return spb.QueryAssignmentResponse(
                status=status(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group")
            )
        if self._queues_of(name) is None:  # unknown here; a slave may lag: ask the master
            return await self.master.call(
                "QueryAssignment",
                request,
                context,
                self._assignment_on_master,
                lambda code, text: spb.QueryAssignmentResponse(status=status(code, text)),
            )
        return self._assignment(request)

    async def _assignment_on_master(
        self, request: spb.QueryAssignmentRequest
    ) -> spb.QueryAssignmentResponse:
        self.gate.require_master_role()
        if self._queues_of(request.topic.name) is None:
            return spb.QueryAssignmentResponse(
                status=status(Code.TOPIC_NOT_FOUND, f"topic {request.topic.name} does not exist")
            )
        return self._assignment(request)

    def _assignment(self, request: spb.QueryAssignmentRequest) -> spb.QueryAssignmentResponse:
        name = request.topic.name
        endpoints = request.endpoints if request.endpoints.addresses else self.own_endpoints
        queue = pb.MessageQueue(
            topic=pb.Resource(name=name, resource_namespace=request.topic.resource_namespace),
            id=-1,
            permission=pb.READ_WRITE,
            broker=pb.Broker(name=self.settings.group, id=0, endpoints=endpoints),
            accept_message_types=ACCEPTED_TYPES,
        )
        return spb.QueryAssignmentResponse(
            status=OK, assignments=[pb.Assignment(message_queue=queue)]
        )


def _send_refused(code: int, message: str, n: int) -> spb.SendMessageResponse:
    """A refused send: the status on top and on each entry (the Node client reads those)."""
    st = status(code, message)
    return spb.SendMessageResponse(
        status=st, entries=[spb.SendResultEntry(status=st) for _ in range(max(n, 1))]
    )
