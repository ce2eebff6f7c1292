"""The replicated metadata: an "embedded KV on DLedger".

Topics, consumer-group offsets and producer sessions are state derived from the log, in
log order, on every node alike: topic and offset changes are *operations* carried as
messages of the reserved system topic ``%SYS%META`` (an orjson body), and producer
sessions are recorded from the session properties of ordinary messages. Because every
replica applies the same committed entries in the same order with this same pure code,
every replica holds the same table, and consumer offsets survive a failover exactly.

Invariants:
- ``apply_*`` never raises on input from the log: an operation this version does not
  understand (or a malformed one) is logged and skipped, identically on every replica;
  a node must not crash on a committed entry.
- ``applied_index`` only grows; an entry at or below it is never applied twice.
- The session table is bounded (LRU by log order, hence identical everywhere).

A snapshot is the whole table at one index (``snapshot-<index>`` files), so retention
may delete the log head behind it and a restart replays only what follows it. Its bytes
are composed of the appliers' parts (``broker/dispatch/snapshots.py``): the topics and
offsets are ``MetadataApplier``'s, the sessions ``SessionApplier``'s
(``broker/dispatch/appliers.py``).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dledger.store import write_atomic

from .jsonint import json_int
from .pop.state import PopState
from .sendwindow import DEFAULT_MAX_AGE_MS, DEFAULT_MAX_IDS, SendWindow
from .timers.state import TimerState
from .transactions.state import TransactionState

POP_OP_PREFIX = "pop."
TIMER_OP_PREFIX = "timer."
TX_OP_PREFIX = "tx."

log = logging.getLogger(__name__)

SYS_TOPIC = "%SYS%META"
SYS_PREFIX = "%SYS%"
TOPIC_NAME = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
# The delay messages' topic (broker/timers): its "." is in no name a client can give, so
# no request reads, writes, lists or deletes it.
TIMER_TOPIC = "%SYS%.timer"
HALF_TOPIC = "%SYS%.half"  # transactions' half messages (broker/transactions), likewise
SYSTEM_TOPICS = frozenset({TIMER_TOPIC, HALF_TOPIC})


def topic_name_ok(name: str) -> bool:
    """A user's topic name, or one of the broker's own ``SYSTEM_TOPICS``."""
    return name in SYSTEM_TOPICS or TOPIC_NAME.fullmatch(name) is not None


GROUP_NAME = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
PRODUCER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_QUEUES = 65_536  # per topic: the API's bound; more is not a table we made


@dataclass(slots=True)
class TopicMeta:
    name: str
    queues: int
    created_index: int  # messages of this topic at or below this index are older incarnations


@dataclass(slots=True)
class ProducerSession:
    """The last batch of one producer: its sequence, its size and the results so far
    as (queue_id, queue_offset, commitlog_offset), in batch order."""

    seq: int
    size: int
    results: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.results) >= self.size


def op_create_topic(name: str, queues: int) -> dict[str, Any]:
    return {"op": "create_topic", "name": name, "queues": queues}


def op_delete_topic(name: str) -> dict[str, Any]:
    return {"op": "delete_topic", "name": name}


def op_commit_offsets(
    group: str, topic: str, offsets: dict[int, int], *, forward: bool = True
) -> dict[str, Any]:
    """A commit (``forward``: an offset behind the committed one leaves it, so two
    consumers, one committing from a stale pull, never move the group back), or a reset
    (anywhere). Entries written before ``forward`` existed have none: the last wins."""
    op: dict[str, Any] = {
        "op": "commit_offsets",
        "group": group,
        "topic": topic,
        "offsets": {str(q): o for q, o in sorted(offsets.items())},
    }
    if forward:
        op["forward"] = True
    return op


class MetadataState:
    def __init__(
        self,
        max_sessions: int = 100_000,
        send_window_ids: int = DEFAULT_MAX_IDS,
        send_window_ms: int = DEFAULT_MAX_AGE_MS,
        max_session_results: int = 500_000,
    ) -> None:
        self.applied_index = -1
        self.max_sessions = max_sessions
        # The results the sessions keep, in all (each session its last batch's): bounded
        # so the snapshot holding them stays small to hold and to send.
        self.max_session_results = max_session_results
        self.session_results = 0
        self.topics: dict[str, TopicMeta] = {}
        # group → topic → queue id → committed offset (the next message to consume)
        self.offsets: dict[str, dict[str, dict[int, int]]] = {}
        self.sessions: OrderedDict[str, ProducerSession] = OrderedDict()
        # recent client message ids → what their send stored (``broker/sendwindow.py``)
        self.send_window = SendWindow(send_window_ids, send_window_ms)
        # POP groups: configuration, handed-out messages (``broker/pop/state.py``)
        self.pop = PopState()
        # delay messages: which are done (``broker/timers/state.py``)
        self.timers = TimerState()
        # transactions: pending, committed and not yet copied, resolved
        self.transactions = TransactionState()

    # ---- applying the log --------------------------------------------------------------

    def apply_op(self, index: int, body: bytes | memoryview) -> str | None:
        """Apply one ``%SYS%META`` entry. Returns the name of a topic it deleted (the
        caller drops that topic's consume queues), else None."""
        try:
            op = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            self.applied_index = max(self.applied_index, index)
            log.warning("entry %d: malformed metadata operation skipped: %s", index, e)
            return None
        return self.apply_operation(index, op)

    def apply_operation(self, index: int, op: Any) -> str | None:
        """``apply_op`` of an operation already parsed (the dispatch parses each
        ``%SYS%META`` body once for all its appliers)."""
        self.applied_index = max(self.applied_index, index)
        try:
            kind = op["op"]
            if kind == "create_topic":
                self._create_topic(index, str(op["name"]), json_int(op["queues"], "queues"))
            elif kind == "delete_topic":
                name = str(op["name"])
                if self.topics.pop(name, None) is not None:
                    for topics in self.offsets.values():
                        topics.pop(name, None)
                    # A group goes with the last topic it committed offsets for.
                    for group in [g for g, topics in self.offsets.items() if not topics]:
                        del self.offsets[group]
                    return name
            elif kind == "commit_offsets":
                forward = op.get("forward") is True
                self._commit_offsets(str(op["group"]), str(op["topic"]), op["offsets"], forward)
            elif isinstance(kind, str) and kind.startswith(
                (POP_OP_PREFIX, TIMER_OP_PREFIX, TX_OP_PREFIX)
            ):
                pass  # the POP, timer and transaction appliers' (their packages)
            else:
                log.warning("entry %d: unknown metadata operation %r skipped", index, kind)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            log.warning("entry %d: malformed metadata operation skipped: %s", index, e)
        return None

    def _create_topic(self, index: int, name: str, queues: int) -> None:
        if name in self.topics:
            return  # the first create wins; the master checked for a conflict before
        if not topic_name_ok(name) or not 1 <= queues <= MAX_QUEUES:
            log.warning("entry %d: invalid topic %r/%d skipped", index, name, queues)
            return
        self.topics[name] = TopicMeta(name, queues, index)

    def _commit_offsets(
        self, group: str, topic: str, offsets: dict[str, Any], forward: bool
    ) -> None:
        meta = self.topics.get(topic)
        if meta is None:
            return  # deleted in between: nothing to commit to
        table = self.offsets.setdefault(group, {}).setdefault(topic, {})
        for q, o in offsets.items():
            qid, queue_offset = json_int(q, "queue id"), json_int(o, "offset")
            if 0 <= qid < meta.queues and queue_offset >= 0:
                if forward and table.get(qid, -1) > queue_offset:
                    continue  # a stale commit: the group is past it already
                table[qid] = queue_offset

    def record_session(
        self,
        producer_id: str,
        seq: int,
        batch_index: int,
        batch_size: int,
        result: tuple[int, int, int],
    ) -> None:
        """Record one committed message of a producer session batch."""
        s = self.sessions.get(producer_id)
        if s is None or seq > s.seq:
            if s is not None:
                self.session_results -= len(s.results)
            s = ProducerSession(seq, batch_size)
            self.sessions[producer_id] = s
        elif seq < s.seq:
            return  # an older batch cannot follow a newer one; the master never does this
        self.sessions.move_to_end(producer_id)
        if batch_index == len(s.results):  # a re-sent tail continues where the log stopped
            s.results.append(result)
            self.session_results += 1
        # The least recently used go first, by count and by the results they keep (never
        # the session just recorded: a batch is at most a request's messages).
        while len(self.sessions) > self.max_sessions or (
            self.session_results > self.max_session_results and len(self.sessions) > 1
        ):
            _, gone = self.sessions.popitem(last=False)
            self.session_results -= len(gone.results)

    def adopt_sessions(self, sessions: OrderedDict[str, ProducerSession]) -> None:
        """The sessions of a snapshot part."""
        self.sessions = sessions
        self.session_results = sum(len(s.results) for s in sessions.values())

    # ---- reading ------------------------------------------------------------------------

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets.get(group, {}).get(topic, {}).get(queue_id)

    def queued(self, topic_name: str, queue_id: int, index: int) -> bool:
        """Does the message at entry ``index`` go into its queue? Iff the topic's current
        incarnation existed then (created before it) and has that queue. The metadata
        can be ahead of the entry (a newer snapshot after a restart): a message of an
        incarnation deleted by now goes nowhere (its queues are gone)."""
        topic = self.topics.get(topic_name)
        return topic is not None and topic.created_index < index and queue_id < topic.queues


class SnapshotFiles:
    """``metadata/snapshot-<20-digit index>`` files, written atomically (temp file, fsync,
    rename, directory fsync); the newest ``keep`` are kept."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = max(1, keep)
        directory.mkdir(parents=True, exist_ok=True)

    def indexes(self) -> list[int]:
        out = []
        for p in self.directory.glob("snapshot-*"):
            suffix = p.name.removeprefix("snapshot-")
            if suffix.isdigit():
                out.append(int(suffix))
        return sorted(out)

    def path(self, index: int) -> Path:
        return self.directory / f"snapshot-{index:020d}"

    def save(self, index: int, data: bytes, *, prune: bool = True) -> Path:
        final = self.path(index)
        write_atomic(final, data)
        if prune:
            for old in self.indexes()[: -self.keep]:
                self.path(old).unlink(missing_ok=True)
        return final
