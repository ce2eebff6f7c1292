"""``TransactionApplier``: transactions begun, checked, resolved and copied, applied to
``MetadataState.transactions`` (``broker/transactions/state.py``) in log order, on every
node.

- a record of ``HALF_TOPIC`` begins a transaction: its messages (one, or a batch
  record's), the producer group and topic they carry, and the log time of the first
  check the master stamped on it (``TX_CHECK_AT``);
- an ordinary message carrying ``TX_ORIGIN`` (``<base>:<i>``) is message *i* of a
  committed transaction, copied into its topic by the master;
- ``tx.commit``, ``tx.rollback`` and ``tx.check`` (``%SYS%META`` operations) resolve
  or check one, the time of a check being its entry's; ``tx.drop`` ends a committed one
  whose topic is gone.

The outcome of each operation is kept by entry index for the master that appended it
(``outcome``), a bounded table outside the replicated state; ``on_checked``, when set,
hears of each check applied here (the node's gRPC front offers it to the producers
connected to this node: ``api/rocketmq/transactions.py``), outside it too.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..copies import PROP_REAL_TOPIC
from ..jsonint import json_int
from ..message import decode_properties
from ..metadata import HALF_TOPIC, TX_OP_PREFIX, MetadataState
from .state import COMMITTED, ROLLED_BACK, TransactionState

if TYPE_CHECKING:  # (not at run time: broker.dispatch registers this applier)
    from ..dispatch.entry import Committed

log = logging.getLogger(__name__)

PROP_TX_GROUP = "TX_PRODUCER_GROUP"  # on a half message: where its checks go
PROP_TX_CHECK_AT = "TX_CHECK_AT"  # on a half message: the log time of the first check
PROP_TX_ORIGIN = "TX_ORIGIN"  # on a copy: "<transaction base>:<message index>"
OUTCOMES_KEPT = 4096


def parse_origin(text: str) -> tuple[int, int] | None:
    base, sep, i = text.partition(":")
    if sep and base.isdigit() and i.isdigit() and len(base) < 19 and len(i) < 7:
        return int(base), int(i)
    return None


class TransactionApplier:
    def __init__(self, meta: MetadataState) -> None:
        self.meta = meta
        self._outcomes: OrderedDict[int, str | bool | None] = OrderedDict()
        self.on_checked: Callable[[int], None] | None = None  # node-local (module doc)

    @property
    def state(self) -> TransactionState:
        return self.meta.transactions

    def outcome(self, index: int) -> str | bool | None:
        return self._outcomes.get(index)

    def apply(self, e: Committed) -> None:
        if e.system:
            self._apply_op(e)
        elif e.info.topic == HALF_TOPIC:
            props = e.props
            if e.inners is not None and e.inners:  # a batch record: its first message's
                first = e.inners[0]
                props = decode_properties(e.raw[first.props_at : first.props_at + first.props_len])
            check_at = props.get(PROP_TX_CHECK_AT, "")
            self.state.begun(
                e.info.queue_offset,
                e.count,
                props.get(PROP_TX_GROUP, ""),
                props.get(PROP_REAL_TOPIC, ""),
                e.info.store_timestamp,
                int(check_at) - e.info.store_timestamp if check_at.isdigit() else 0,
            )
        elif PROP_TX_ORIGIN in e.props:
            origin = parse_origin(e.props[PROP_TX_ORIGIN])
            if origin is None or not self.state.copied(*origin):
                log.warning("entry %d: a transaction copy that was not expected", e.index)

    def _apply_op(self, e: Committed) -> None:
        try:
            op = e.operation()
            kind = op["op"]
            if isinstance(kind, str) and kind.startswith(TX_OP_PREFIX):
                self.apply_operation(e.index, e.info.store_timestamp, kind, op)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            log.warning("entry %d: malformed transaction operation skipped: %s", e.index, err)

    def apply_operation(self, index: int, ts: int, kind: str, op: Mapping[str, Any]) -> None:
        """Apply ``op`` (of ``kind``), the entry at ``index`` stamped ``ts``, and keep its
        outcome; ``KeyError``, ``TypeError``, ``ValueError`` when it is malformed."""
        self._keep(index, self._outcome_of(ts, kind, op))

    def _outcome_of(self, ts: int, kind: str, op: Mapping[str, Any]) -> str | bool | None:
        base = json_int(op["base"], "base")
        if kind == "tx.commit":
            return self.state.resolve(base, COMMITTED)
        if kind == "tx.rollback":
            return self.state.resolve(base, ROLLED_BACK, expired=bool(op.get("expired")))
        if kind == "tx.check":
            checked = self.state.checked(base, ts, json_int(op["interval_ms"], "interval_ms"))
            if checked and self.on_checked is not None:
                try:
                    self.on_checked(base)
                except Exception:  # a listener's fault never stops the apply
                    log.exception("transaction %d: the check listener failed", base)
            return checked
        if kind == "tx.drop":
            return self.state.drop(base)
        log.warning("unknown transaction operation %r skipped", kind)
        return None

    def _keep(self, index: int, outcome: str | bool | None) -> None:
        self._outcomes[index] = outcome
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    # ---- its part of the metadata snapshot ------------------------------------------------

    def snapshot_part(self) -> dict[str, Any]:
        return {"transactions": self.state.to_json()}

    def parse_part(self, doc: Mapping[str, Any]) -> TransactionState:
        part = doc.get("transactions")
        keep = self.state.max_resolved
        return TransactionState(keep) if part is None else TransactionState.from_json(part, keep)

    def adopt_part(self, part: TransactionState) -> None:
        self.meta.transactions = part
