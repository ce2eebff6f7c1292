"""``TimerApplier``: delay messages scheduled, delivered and cancelled, applied to
``MetadataState.timers`` (``broker/timers/state.py``) in log order, on every node.

- a record of ``TIMER_TOPIC`` schedules its timer (its queue offset there);
- an ordinary message carrying ``TIMER_ORIGIN`` is a timer's delivery: the copy the
  master appended into the message's topic. It ends the timer, if pending (the copy and
  the end are one entry: never twice, never lost);
- ``timer.cancel`` (a ``%SYS%META`` operation) ends a timer without a copy, and
  ``timer.drop`` one whose topic is gone.

Each scheduled timer is told to ``on_scheduled`` (the master's near window,
``broker/timers/service.py``); the outcome of each cancel is kept by entry index for the
master that appended it (``outcome``), a bounded table outside the replicated state.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..jsonint import json_int
from ..metadata import TIMER_OP_PREFIX, TIMER_TOPIC, MetadataState
from .state import TimerState

if TYPE_CHECKING:  # (not at run time: broker.dispatch registers this applier)
    from ..dispatch.entry import Committed

log = logging.getLogger(__name__)

PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # the time (RocketMQ's name); kept on the copy
PROP_TIMER_ORIGIN = "TIMER_ORIGIN"  # on the copy: the timer it ends
OUTCOMES_KEPT = 1024

OnScheduled = Callable[[int, int, int], None]
"""``(timer, deliver_ms, commitlog_offset)`` of a timer just scheduled."""


def parse_timer(text: str) -> int | None:
    """A timer from its origin property (decimal), None if it is not one."""
    return int(text) if text.isdigit() and len(text) < 19 else None


class TimerApplier:
    def __init__(self, meta: MetadataState) -> None:
        self.meta = meta
        self.on_scheduled: OnScheduled | None = None
        self._outcomes: OrderedDict[int, bool] = OrderedDict()

    @property
    def state(self) -> TimerState:
        return self.meta.timers

    def outcome(self, index: int) -> bool | None:
        """Whether the cancel or drop at ``index`` ended its timer (None: forgotten)."""
        return self._outcomes.get(index)

    def apply(self, e: Committed) -> None:
        if e.system:
            self._apply_op(e)
        elif e.info.topic == TIMER_TOPIC:
            timer = e.info.queue_offset
            self.state.scheduled(timer)
            if self.on_scheduled is not None:
                deliver = parse_timer(e.props.get(PROP_TIMER_DELIVER_MS, "")) or 0
                self.on_scheduled(timer, deliver, e.commitlog_offset)
        elif PROP_TIMER_ORIGIN in e.props:
            origin = parse_timer(e.props[PROP_TIMER_ORIGIN])
            if origin is None or not self.state.finish(origin, "delivered"):
                log.warning("entry %d: a delay message copy of no pending timer", e.index)

    def _apply_op(self, e: Committed) -> None:
        try:
            op = e.operation()
            kind = op["op"]
            if not isinstance(kind, str) or not kind.startswith(TIMER_OP_PREFIX):
                return
            self.apply_operation(e.index, kind, op)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            log.warning("entry %d: malformed timer operation skipped: %s", e.index, err)

    def apply_operation(self, index: int, kind: str, op: Mapping[str, Any]) -> None:
        """``timer.cancel`` or ``timer.drop`` of ``op["timer"]``; ``KeyError``,
        ``TypeError``, ``ValueError`` when malformed."""
        how = {"timer.cancel": "cancelled", "timer.drop": "dropped"}.get(kind)
        if how is None:
            log.warning("entry %d: unknown timer operation %r skipped", index, kind)
            return
        self._outcomes[index] = self.state.finish(json_int(op["timer"], "timer"), how)
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    # ---- its part of the metadata snapshot ------------------------------------------------

    def snapshot_part(self) -> dict[str, Any]:
        return {"timers": self.state.to_json()}

    def parse_part(self, doc: Mapping[str, Any]) -> TimerState:
        part = doc.get("timers")
        return TimerState() if part is None else TimerState.from_json(part)

    def adopt_part(self, part: TimerState) -> None:
        self.meta.timers = part
