"""``PopApplier``: the committed POP operations and dead letters, applied to
``MetadataState.pop`` (``broker/pop/state.py``), in log order, on every node.

The operations are ``%SYS%META`` entries whose ``op`` starts with ``pop.`` (the
``MetadataApplier`` leaves them here); a dead letter is an ordinary message of the topic
``%DLQ%<group>`` carrying its origin (``DLQ_ORIGIN_*``) and the handle it ends
(``POP_EPOCH``): the copy and the end of the message's flight are one entry, so a
failover never writes a dead letter twice nor loses one. A receive applies to the topic
it was selected from (``created``, the topic's creating entry): after the topic's delete
it hands out nothing and makes no state for the topic's next life.

The outcome of each operation (what a receive handed out, which acks held) is kept by
entry index for the master that appended it (``outcome``), a bounded table that is no
part of the replicated state.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..jsonint import json_int
from ..metadata import POP_OP_PREFIX, MetadataState
from ..names import DLQ_PREFIX
from .state import Delivered, Handle, PopConfig, PopState

if TYPE_CHECKING:  # (not at run time: broker.dispatch registers this applier)
    from ..dispatch.entry import Committed

log = logging.getLogger(__name__)

PROP_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROP_DLQ_ORIGIN_QUEUE_ID = "DLQ_ORIGIN_QUEUE_ID"
PROP_DLQ_ORIGIN_QUEUE_OFFSET = "DLQ_ORIGIN_QUEUE_OFFSET"
PROP_DLQ_ORIGIN_MSG_ID = "DLQ_ORIGIN_MSG_ID"
PROP_DELIVERY_ATTEMPTS = "DELIVERY_ATTEMPTS"
PROP_POP_EPOCH = "POP_EPOCH"
OUTCOMES_KEPT = 4096  # the outcomes of the latest operations, for their masters

Outcome = list[Delivered] | list[bool] | Delivered | bool | None


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def _handles(raw: Any) -> list[Handle]:
    return [
        (json_int(q, "queue id"), json_int(o, "offset"), json_int(e, "epoch")) for q, o, e in raw
    ]


class PopApplier:
    def __init__(self, meta: MetadataState) -> None:
        self.meta = meta
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()

    @property
    def state(self) -> PopState:
        return self.meta.pop

    def outcome(self, index: int) -> Outcome:
        """What applying the entry at ``index`` did (None once forgotten, or for none)."""
        return self._outcomes.get(index)

    def apply(self, e: Committed) -> None:
        if e.system:
            self._apply_op(e)
        elif e.info.topic.startswith(DLQ_PREFIX) and PROP_POP_EPOCH in e.props:
            self.state.tick(e.info.store_timestamp)
            self._keep(e.index, self._dead_letter(e))

    def _apply_op(self, e: Committed) -> None:
        try:
            op = e.operation()
            kind = op["op"]
            if kind == "delete_topic":
                self.state.drop_topic(str(op["name"]))
                return
            if isinstance(kind, str) and kind.startswith(POP_OP_PREFIX):
                self.apply_operation(e.index, e.info.store_timestamp, kind, op)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            log.warning("entry %d: malformed POP operation skipped: %s", e.index, err)

    def apply_operation(self, index: int, ts: int, kind: str, op: Mapping[str, Any]) -> None:
        """Apply the POP operation ``op`` (of ``kind``) of the entry at ``index``, stamped
        ``ts``; ``KeyError``, ``TypeError``, ``ValueError`` when it is malformed."""
        self.state.tick(ts)
        self._keep(index, self._apply_pop(index, kind, op))

    def _apply_pop(  # noqa: PLR0911 - one return per operation
        self, index: int, kind: str, op: Mapping[str, Any]
    ) -> Outcome:
        s = self.state
        if kind == "pop.config":
            s.configure(str(op["group"]), PopConfig.from_json(op["config"]))
            return True
        if kind == "pop.redrive":
            s.redrove(str(op["group"]), json_int(op["next"], "next"))
            return True
        group, topic = str(op["group"]), str(op["topic"])
        if kind == "pop.receive":
            if not self._selected_from(topic, op):
                return []  # its topic was deleted since: no state for its next life
            picks = [
                (
                    json_int(q, "queue id"),
                    json_int(start, "start"),
                    json_int(end, "end"),
                    [json_int(o, "offset") for o in offsets],
                    json_int(since[0], "since") if since else json_int(start, "start"),
                )
                for q, start, end, offsets, *since in op["picks"]
            ]
            aid = op.get("attempt_id")
            owner = op.get("owner")
            return s.receive(
                index,
                group,
                topic,
                invisible_ms=json_int(op["invisible_ms"], "invisible_ms"),
                attempt_id=None if aid is None else str(aid),
                picks=picks,
                owner=None if owner is None else str(owner),
                renew_ms=json_int(op.get("renew_ms", 0), "renew_ms"),
            )
        if kind == "pop.ack":
            return s.ack(group, topic, _handles(op["handles"]))
        if kind == "pop.nack":
            delay = op.get("delay_ms")
            return s.nack(
                index,
                group,
                topic,
                _handles(op["handles"]),
                None if delay is None else json_int(delay, "delay_ms"),
            )
        if kind == "pop.renew":
            return s.renew(
                group,
                topic,
                _handles(op["handles"]),
                json_int(op["invisible_ms"], "invisible_ms"),
                bool(op.get("stop", False)),
            )
        if kind == "pop.invisible":
            (handle,) = _handles([op["handle"]])
            return s.change_invisible(
                index, group, topic, handle, json_int(op["invisible_ms"], "invisible_ms")
            )
        log.warning("entry %d: unknown POP operation %r skipped", index, kind)
        return None

    def _selected_from(self, topic: str, op: Mapping[str, Any]) -> bool:
        """Whether ``topic`` is the one the master selected a receive from: it exists, of
        the life ``created`` names (its creating entry; an older entry names none)."""
        t = self.meta.topics.get(topic)
        created = op.get("created")
        return t is not None and (
            created is None or json_int(created, "created") == t.created_index
        )

    def _dead_letter(self, e: Committed) -> bool:
        p = e.props
        try:
            handle = (
                int(p[PROP_DLQ_ORIGIN_QUEUE_ID]),
                int(p[PROP_DLQ_ORIGIN_QUEUE_OFFSET]),
                int(p[PROP_POP_EPOCH]),
            )
            topic = p[PROP_DLQ_ORIGIN_TOPIC]
        except (KeyError, ValueError) as err:
            log.warning("entry %d: dead letter without its origin: %s", e.index, err)
            return False
        return self.state.dead_letter(e.info.topic[len(DLQ_PREFIX) :], topic, handle)

    def _keep(self, index: int, outcome: Outcome) -> None:
        self._outcomes[index] = outcome
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    # ---- its part of the metadata snapshot ------------------------------------------------

    def snapshot_part(self) -> dict[str, Any]:
        return {"pop": self.state.to_json()}

    def parse_part(self, doc: Mapping[str, Any]) -> PopState:
        part = doc.get("pop")
        return PopState() if part is None else PopState.from_json(part)

    def adopt_part(self, part: PopState) -> None:
        self.meta.pop = part
