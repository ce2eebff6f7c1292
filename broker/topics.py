"""Topics, and the metadata appends that create and delete them (docs/architecture.md).

Topics are replicated metadata (``%SYS%META`` entries, ``broker/metadata.py``): the
master checks a create against the node's limits, appends it, and answers once the
entry is dispatched, so that every node then knows the topic (a slave as soon as its
dispatch reaches the entry). ``MetadataLog`` is that append, shared with the offset
commits of the consumer groups (``broker/groups.py``).

Invariants:
- a metadata append passes the ``WriteGate`` first, and waits (``append_timeout_ms`` at
  most) until it is applied here, so the writer reads its own write;
- a client's topic name passes ``broker/names.py`` (the broker's prefixes reserved);
- a create that would pass ``max_topics`` or ``max_total_queues`` is refused by the
  master before it is written (replicas apply what the master wrote).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from dledger.codes import DLedgerError

from . import errors
from .commitlog import DLedgerCommitLog
from .gate import WriteGate
from .message import encode_message
from .metadata import (
    SYS_TOPIC,
    SYSTEM_TOPICS,
    MetadataState,
    TopicMeta,
    op_create_topic,
    op_delete_topic,
)
from .names import check_topic_name
from .settings import BrokerSettings

if TYPE_CHECKING:
    from .dispatch import Dispatch


class MetadataLog:
    """Appends ``%SYS%META`` operations and waits until they are applied here."""

    def __init__(
        self,
        settings: BrokerSettings,
        gate: WriteGate,
        commitlog: DLedgerCommitLog,
        dispatch: Dispatch,
        clock: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.commitlog = commitlog
        self.dispatch = dispatch
        self.clock = clock
        self.store_host = settings.store_host

    async def append(self, op: dict[str, Any]) -> int:
        """Append a metadata operation; returns its index once it is dispatched (applied
        to the metadata here), or after ``append_timeout_ms`` at most."""
        await self.gate.require_master_soon()
        now = self.clock()
        record = encode_message(
            topic=SYS_TOPIC,
            body=orjson.dumps(op),
            born_timestamp=now,
            store_timestamp=now,
            store_host=self.store_host,
        )
        try:
            index, _pos = await self.commitlog.append_system(record)
        except DLedgerError as e:
            raise self.gate.append_error(e) from None
        await self.dispatch.wait_dispatched(index, self.settings.append_timeout_ms / 1000)
        return index


class Topics:
    def __init__(
        self,
        settings: BrokerSettings,
        gate: WriteGate,
        meta: MetadataState,
        metalog: MetadataLog,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.meta = meta
        self.metalog = metalog

    def get(self, name: str) -> TopicMeta:
        """The topic, or ``TopicNotFoundError``."""
        t = self.meta.topics.get(name)
        if t is None:
            raise errors.TopicNotFoundError(f"topic {name} does not exist", topic=name)
        return t

    def all(self) -> list[TopicMeta]:
        """Every topic, by name (the broker's own among them)."""
        return sorted(self.meta.topics.values(), key=lambda t: t.name)

    def users(self) -> list[TopicMeta]:
        """Every user's topic, by name: ``all`` without the broker's ``SYSTEM_TOPICS``."""
        return [t for t in self.all() if t.name not in SYSTEM_TOPICS]

    async def create(
        self, name: str, queues: int | None = None, *, dead_letters: bool = False
    ) -> tuple[TopicMeta, bool]:
        """Create a topic; returns (topic, created). Same again → (topic, False); another
        queue count → ``TopicConflictError``. ``dead_letters``: the broker makes a POP
        group's ``%DLQ%<group>`` (``broker/names.py``)."""
        check_topic_name(name, dead_letters=dead_letters)
        n = self.settings.default_queues if queues is None else queues
        if not 1 <= n <= self.settings.limits.max_queues_per_topic:
            raise errors.InvalidArgumentError(
                f"queues must be 1..{self.settings.limits.max_queues_per_topic}, not {n}"
            )
        await self.gate.require_master_soon()  # a write, even when it exists: the master says
        existing = self.meta.topics.get(name)
        if existing is None:
            self._check_room_for(n)
            await self.metalog.append(op_create_topic(name, n))
            existing = self.meta.topics.get(name)
            created = True
        else:
            created = False
        if existing is None:
            raise errors.UnknownOutcomeError(f"topic {name} not visible after its create committed")
        if existing.queues != n:
            raise errors.TopicConflictError(
                f"topic {name} exists with {existing.queues} queues, not {n}",
                queues=existing.queues,
            )
        return existing, created

    async def system(self, name: str) -> TopicMeta:
        """One of the broker's own ``SYSTEM_TOPICS`` (one queue, no client's), made on
        its first use."""
        assert name in SYSTEM_TOPICS, name
        t = self.meta.topics.get(name)
        if t is None:
            await self.metalog.append(op_create_topic(name, 1))
            t = self.meta.topics.get(name)
            if t is None:
                raise errors.UnknownOutcomeError(f"topic {name} is not there yet; retry")
        return t

    async def get_or_create(self, name: str) -> TopicMeta:
        """The topic a produce writes to: created with the default queue count when
        ``auto_create_topics`` allows, else ``TopicNotFoundError``."""
        topic = self.meta.topics.get(name)
        if topic is not None:
            return topic
        if not self.settings.auto_create_topics:
            raise errors.TopicNotFoundError(f"topic {name} does not exist", topic=name)
        try:
            topic, _ = await self.create(name, None)
        except errors.TopicConflictError:
            # A create with another queue count won the race: a produce takes the topic
            # as it is (it asked for no count).
            return self.get(name)
        return topic

    async def delete(self, name: str) -> None:
        # A write: redirect first. A slave may not know a topic the master just made.
        await self.gate.require_master_soon()
        self.get(name)
        await self.metalog.append(op_delete_topic(name))

    def _check_room_for(self, queues: int) -> None:
        """``LimitReachedError`` (429) when one more topic, or ``queues`` more queues,
        would pass the node's limits: each queue holds a file descriptor and a mapping
        of its consume-queue segment, and running out of descriptors breaks segment
        creation for every topic."""
        lim = self.settings.limits
        topics = self.meta.topics.values()
        if len(topics) >= lim.max_topics:
            raise errors.LimitReachedError(
                f"{len(topics)} topics, the node's limit", limit=lim.max_topics
            )
        total = sum(t.queues for t in topics)
        if total + queues > lim.max_total_queues:
            raise errors.LimitReachedError(
                f"{total} queues and {queues} more would pass the node's limit of "
                f"{lim.max_total_queues}",
                limit=lim.max_total_queues,
            )
