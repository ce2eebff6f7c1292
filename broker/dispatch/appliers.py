"""The appliers of the replicated metadata (topics and group offsets, producer sessions)
and of the key index; the consume queues' is ``broker/dispatch/queues.py``.

``state_appliers`` is the one place the replicated state's appliers are registered, in
the order each entry reaches them (docs/architecture.md, "Adding an applier").

Invariants (``broker/dispatch/entry.py`` says what every applier keeps):
- the metadata's appliers change only ``MetadataState``, in place: the broker, the
  produce path and the groups hold a reference to it;
- their snapshot parts are the metadata snapshot's fields as they have always been
  (``topics``, ``offsets``, ``sessions``): the bytes of a snapshot do not depend on how
  the code that writes them is cut.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from consumequeue import KeyIndex

from ..jsonint import json_int
from ..message import PROP_BATCH_INDEX, PROP_BATCH_SIZE, PROP_PRODUCER_ID, PROP_PRODUCER_SEQ
from ..metadata import (
    MAX_QUEUES,
    MetadataState,
    ProducerSession,
    TopicMeta,
    topic_name_ok,
)
from ..pop.applier import PopApplier
from ..sendwindow import SEND_ID_PREFIX, Sent
from ..timers.applier import TimerApplier
from ..transactions.applier import TransactionApplier
from .entry import Committed, StateApplier

log = logging.getLogger(__name__)

Topics = tuple[dict[str, TopicMeta], dict[str, dict[str, dict[int, int]]]]
"""The topics by name, and the offsets: group → topic → queue id → committed offset."""


class MetadataApplier:
    """Topics and consumer-group offsets: the ``%SYS%META`` operations
    (``MetadataState.apply_op``). A topic it deletes is reported to
    ``on_topic_deleted(name, index)`` (the consume queues drop theirs)."""

    def __init__(
        self, meta: MetadataState, on_topic_deleted: Callable[[str, int], None] | None = None
    ) -> None:
        self.meta = meta
        self.on_topic_deleted = on_topic_deleted

    def apply(self, e: Committed) -> None:
        if not e.system:
            return
        try:
            deleted = self.meta.apply_operation(e.index, e.operation())
        except orjson.JSONDecodeError:
            deleted = self.meta.apply_op(e.index, e.body())  # logs it, skips it
        if deleted is not None and self.on_topic_deleted is not None:
            self.on_topic_deleted(deleted, e.index)

    def snapshot_part(self) -> dict[str, Any]:
        meta = self.meta
        return {
            "topics": [[t.name, t.queues, t.created_index] for t in meta.topics.values()],
            "offsets": {
                g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
                for g, ts in meta.offsets.items()
            },
        }

    def parse_part(self, doc: Mapping[str, Any]) -> Topics:
        topics: dict[str, TopicMeta] = {}
        for name, queues, created in doc["topics"]:
            n = json_int(queues, "queues")
            if not isinstance(name, str) or not topic_name_ok(name) or not 1 <= n <= MAX_QUEUES:
                raise ValueError(f"bad topic {name!r} with {queues!r} queues")
            topics[name] = TopicMeta(name, n, json_int(created, "created_index"))
        offsets = {
            str(g): {
                str(t): {json_int(q, "queue id"): json_int(o, "offset") for q, o in qs.items()}
                for t, qs in ts.items()
            }
            for g, ts in doc["offsets"].items()
        }
        return topics, offsets

    def adopt_part(self, part: Topics) -> None:
        self.meta.topics, self.meta.offsets = part


class SessionApplier:
    """Producer sessions: the session results carried in the properties of ordinary
    messages (``PRODUCER_ID``, ``PRODUCER_SEQ``, ``BATCH_INDEX``, ``BATCH_SIZE``); a
    batch record's messages are at queue offsets base + i and addresses offset + i."""

    def __init__(self, meta: MetadataState) -> None:
        self.meta = meta

    def apply(self, e: Committed) -> None:
        props = e.props
        if PROP_PRODUCER_ID not in props:
            return
        try:
            pid, seq = props[PROP_PRODUCER_ID], int(props[PROP_PRODUCER_SEQ])
            first = int(props.get(PROP_BATCH_INDEX, "0"))
            batch_size = int(props.get(PROP_BATCH_SIZE, "1"))
        except (KeyError, ValueError) as err:
            log.warning("malformed producer session properties ignored: %s", err)
            return
        info = e.info
        if pid.startswith(SEND_ID_PREFIX):  # a client's message id: the send window's
            record = self.meta.send_window.record
            for i in range(e.count):
                record(
                    pid,
                    seq,
                    first + i,
                    batch_size,
                    info.store_timestamp,
                    (info.queue_id, info.queue_offset + i, info.physical_offset + i),
                )
            return
        for i in range(e.count):
            self.meta.record_session(
                pid,
                seq,
                first + i,
                batch_size,
                (info.queue_id, info.queue_offset + i, info.physical_offset + i),
            )

    def snapshot_part(self) -> dict[str, Any]:
        sessions = self.meta.sessions
        return {"sessions": [[p, s.seq, s.size, s.results] for p, s in sessions.items()]}

    def parse_part(self, doc: Mapping[str, Any]) -> OrderedDict[str, ProducerSession]:
        sessions: OrderedDict[str, ProducerSession] = OrderedDict()
        for pid, seq, size, results in doc["sessions"]:
            sessions[str(pid)] = ProducerSession(
                json_int(seq, "sequence"),
                json_int(size, "batch size"),
                [
                    (json_int(a, "result"), json_int(b, "result"), json_int(c, "result"))
                    for a, b, c in results
                ],
            )
        return sessions

    def adopt_part(self, part: OrderedDict[str, ProducerSession]) -> None:
        self.meta.adopt_sessions(part)


class SendWindowApplier:
    """The send window's part of the snapshot (``broker/sendwindow.py``); its entries are
    recorded by ``SessionApplier``, from the same session properties. A snapshot of a
    version before the window has none: an empty window."""

    def __init__(self, meta: MetadataState) -> None:
        self.meta = meta

    def apply(self, e: Committed) -> None:
        pass  # (``SessionApplier`` records the sends)

    def snapshot_part(self) -> dict[str, Any]:
        return {"send_window": self.meta.send_window.to_json()}

    def parse_part(self, doc: Mapping[str, Any]) -> OrderedDict[str, Sent]:
        rows = doc.get("send_window")
        return OrderedDict() if rows is None else self.meta.send_window.adopt_json(rows)

    def adopt_part(self, part: OrderedDict[str, Sent]) -> None:
        self.meta.send_window.sent = part


def state_appliers(
    meta: MetadataState, on_topic_deleted: Callable[[str, int], None] | None = None
) -> list[StateApplier[Any]]:
    """The replicated state's appliers, in the order each entry reaches them and their
    parts stand in a snapshot: register a new kind of replicated state here."""
    return [
        MetadataApplier(meta, on_topic_deleted),
        SessionApplier(meta),
        PopApplier(meta),
        TimerApplier(meta),
        TransactionApplier(meta),
        SendWindowApplier(meta),
    ]


class KeyIndexApplier:
    """Every message's keys into the key index, whatever becomes of its topic: the index
    is a function of the log alone, so every replica and every replay builds the same
    files (a query reads each candidate and checks its topic). Idempotent:
    ``KeyIndex.put`` skips a message at or below the last one indexed."""

    def __init__(self, keys: KeyIndex) -> None:
        self.keys = keys

    def apply(self, e: Committed) -> None:
        put, store_timestamp = self.keys.put, e.info.store_timestamp
        for commitlog_offset, keys in e.keys:
            put(keys, commitlog_offset, store_timestamp)
