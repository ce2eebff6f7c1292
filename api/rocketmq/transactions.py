"""Transactions for RocketMQ 5 clients (docs/rocketmq.md): the producers' Telemetry
streams on this node (``ProducerStreams``), the transaction checks offered on them
(``TransactionChecks``), and EndTransaction's resolution.

A SendMessage of type TRANSACTION is one of our transactions (``broker/transactions``)
whose producer group is the topic's name, as RocketMQ's proxy has it: a check goes to
the producers whose Settings publish that topic.

Checks are the replicated state's: the master appends ``tx.check`` when one is due, and
every node, on applying it, offers ``RecoverOrphanedTransactionCommand`` on every
Telemetry stream of that producer group connected to *it* (streams are per node, and the
Python client does not reopen a broken one for minutes: a check must reach whichever
node the producer still talks to). The producer answers with
EndTransaction(SOURCE_SERVER_CHECK), which any node takes to the master; several
answers to one check (several streams, several nodes) are one resolution, since ending
a transaction twice the same way answers the same. A check nobody answers (no stream
here, a full stream, a producer that died) is simply not offered again: the master's
schedule appends the next one (``tx_check_interval_ms``), up to ``tx_max_checks``, then
rolls it back.

Invariants:
- what is offered is never more than one command per stream and check, and only for a
  transaction still pending here when it is sent;
- a stream's queue is bounded (``STREAM_QUEUE``): a check that does not fit is dropped,
  never waited for (the apply path only notes the transaction, ``on_checked``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from broker import errors
from broker.metadata import HALF_TOPIC
from broker.reads import Reads
from broker.transactions.service import (
    ROUTING_PROPERTIES,
    Transactions,
    transaction_id,
)
from broker.transactions.state import PENDING

from .codes import OK, broker_error_code, status
from .consume import ProtoMessages
from .protocol import definition_pb2 as pb
from .protocol import service_pb2 as spb

log = logging.getLogger(__name__)

STREAM_QUEUE = 1024  # commands waiting to be written on one stream, at most
ACTIONS = {pb.COMMIT: "commit", pb.ROLLBACK: "rollback"}
_stream_ids = itertools.count(1)


@dataclass(eq=False, slots=True)
class Stream:
    """One Telemetry stream of this node: what it writes next, and the topics its
    producer publishes (from its latest Settings)."""

    client_id: str
    out: asyncio.Queue[spb.TelemetryCommand | None]
    topics: frozenset[str] = frozenset()
    namespace: str = ""
    id: int = field(default_factory=lambda: next(_stream_ids))


class ProducerStreams:
    """The Telemetry streams open on this node, by producer group (a topic published)."""

    def __init__(self) -> None:
        self.streams: set[Stream] = set()

    def open(self, client_id: str) -> Stream:
        s = Stream(client_id, asyncio.Queue())
        self.streams.add(s)
        return s

    def close(self, s: Stream) -> None:
        self.streams.discard(s)

    @staticmethod
    def publishing(s: Stream, settings: pb.Settings) -> None:
        """The stream's producer announced (again) what it publishes."""
        if settings.client_type == pb.PRODUCER:
            s.topics = frozenset(t.name for t in settings.publishing.topics)
            if settings.publishing.topics:
                s.namespace = settings.publishing.topics[0].resource_namespace

    def of_group(self, group: str) -> list[Stream]:
        return sorted((s for s in self.streams if group in s.topics), key=lambda s: s.id)


class TransactionChecks:
    """Offers each check applied on this node to the producer streams here (module doc)."""

    def __init__(
        self,
        transactions: Transactions,
        reads: Reads,
        streams: ProducerStreams,
        messages: Callable[[str], ProtoMessages],
    ) -> None:
        self.transactions = transactions
        self.reads = reads
        self.streams = streams
        self.messages = messages  # a namespace → the maker of protocol messages
        self._due: set[int] = set()
        self._wake = asyncio.Event()
        self.offered = 0  # commands written to streams (tests, metrics)
        self.dropped = 0  # offers that found a full stream

    def on_checked(self, base: int) -> None:
        """The applier's listener: note it, offer it from the loop (never block an apply)."""
        self._due.add(base)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            due, self._due = self._due, set()
            for base in sorted(due):
                try:
                    await self.offer(base)
                except errors.BrokerError as e:  # its record unreadable here, say
                    log.info("transaction check %s not offered: %s", transaction_id(base), e)
                except Exception:  # a bug: this check is lost, the next ones are not
                    log.exception("transaction check %s not offered", transaction_id(base))

    async def offer(self, base: int) -> int:
        """Offer the check of ``base`` on every stream of its producer group here; how
        many streams took it."""
        t = self.transactions.state.live.get(base)
        if t is None or t.state != PENDING:
            return 0
        streams = self.streams.of_group(t.group)
        if not streams:
            return 0
        made: dict[str, pb.Message | None] = {}
        taken = 0
        for s in streams:
            if s.namespace not in made:
                made[s.namespace] = await self._message(base, s.namespace)
            message = made[s.namespace]
            if message is None:
                return taken
            if s.out.qsize() >= STREAM_QUEUE:
                self.dropped += 1
                continue
            command = spb.TelemetryCommand(
                recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                    message=message, transaction_id=transaction_id(base)
                )
            )
            s.out.put_nowait(command)
            taken += 1
        self.offered += taken
        return taken

    async def _message(self, base: int, namespace: str) -> pb.Message | None:
        """The transaction's (first) half message as the client decodes it: its topic,
        its id, its own properties."""
        t = self.transactions.state.live.get(base)
        if t is None:
            return None
        r = await self.reads.pull(self.messages(namespace), HALF_TOPIC, 0, base, max_messages=1)
        found = [m for m in r.messages if m.system_properties.queue_offset == base]
        if not found:
            return None
        m = found[0]
        m.topic.name = t.topic
        for k in ROUTING_PROPERTIES:
            if k in m.user_properties:
                del m.user_properties[k]
        m.system_properties.message_type = pb.TRANSACTION
        return m


async def end_transaction(
    transactions: Transactions, request: spb.EndTransactionRequest
) -> spb.EndTransactionResponse:
    """EndTransaction on this node (the master; ``NotMasterError`` propagates to
    ``MasterCalls``). No resolution (a checker that could not tell) leaves it pending:
    the next check asks again."""
    if not request.transaction_id:
        return spb.EndTransactionResponse(
            status=status(pb.Code.INVALID_TRANSACTION_ID, "no transaction_id")
        )
    action = ACTIONS.get(request.resolution)
    if action is None:
        return spb.EndTransactionResponse(
            status=status(pb.Code.OK, "no resolution: the transaction stays pending")
        )
    try:
        await transactions.end(request.transaction_id, action)
    except (errors.NotMasterError, errors.NoMasterError):
        raise
    except errors.BrokerError as e:
        return spb.EndTransactionResponse(status=status(broker_error_code(e), e.message))
    return spb.EndTransactionResponse(status=OK)
