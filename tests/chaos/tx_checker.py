"""The chaos checker's transaction rules (issue 29): what the transactional producers and
the checker thread (``tests/chaos/tx_workload.py``) were answered, against what every
node holds at the end and what was read under way, from the history alone.

A transaction is *known committed* when a commit of it was answered OK, or a rollback
refused as ``committed``; *known rolled back* when a rollback was answered OK, or a
commit refused as ``rolled_back``; it *may commit* when a commit of it was asked at all
(by its producer or by the checker thread). One neither known committed nor asked to
commit may still have been rolled back by the broker (its last check unanswered).

The rules (each a list of the ``Verdict``):

- ``tx_lost``: a known committed transaction whose messages are not all in its topic on
  a node at the end (a commit answered OK is what happened);
- ``tx_visible``: a message in its topic (on a node at the end, or read under way) of a
  transaction known rolled back or never asked to commit (a rollback answered OK is
  what happened; no half message is visible); a message read under way by a read that
  ended before any commit of it was asked; a transaction's message read in the
  workload's topic; a value in the transactions' topic that no transaction carried;
- ``tx_partial``: some of a transaction's messages in its topic on a node at the end,
  not all (it is delivered whole or not at all);
- ``tx_duplicated``: a transaction's message at two places of its topic on one node
  (exactly once);
- ``tx_answers``: answers that contradict each other: one transaction answered
  committed and rolled back; a commit or rollback of a transaction whose begin was
  acknowledged answered ``TRANSACTION_NOT_FOUND``; a check whose messages are not one
  transaction's, or whose id is not the one its begin was answered;
- ``tx_unresolved``: a node with a transaction of the group pending at the end (after
  the faults stopped and the checks had their time), or a drained node that did not
  say;
- ``tx_replicas``: two nodes whose transactions' topic differs at the end (a place
  holding another value, or held by one and not the other), or whose pending
  transactions differ.

Measured: transactions begun by outcome, by fate, how many are in the topic at the end
(whole) and how many absent, the ends by action and outcome (the producers' and the
checker thread's apart), the checks handed out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .history import Op, TxCheck
from .tx_workload import name_of

if TYPE_CHECKING:
    from .checker import Verdict

COMMITTED, ROLLED_BACK = "committed", "rolled_back"


@dataclass(slots=True)
class _Tx:
    """One transaction: what its begin asked and was answered, and every end of it."""

    name: str
    values: tuple[str, ...]
    fate: str
    begin: str = "invoke"  # ok, fail, info (invoke: no completion in the history)
    id: str | None = None  # as its begin was answered
    # (process, action, type, state answered or None, error code or "")
    ends: list[tuple[str, str, str, str | None, str]] = field(default_factory=list)
    first_commit_s: float | None = None  # the first commit asked (history time)

    def states(self) -> set[str]:
        """What the answers say it is (committed, rolled_back; both is a contradiction)."""
        return {state for _, _, t, state, _ in self.ends if t in ("ok", "fail") and state}

    def may_commit(self) -> bool:
        return self.first_commit_s is not None


def _code(error: str | None) -> str:
    return (error or "").split(":", 1)[0]


def read_transactions(history: Iterable[Op], v: Verdict) -> dict[str, _Tx]:
    """Every transaction of the history, by name; contradicting checks into ``v``."""
    out: dict[str, _Tx] = {}
    calls: dict[tuple[str, str], Op] = {}  # (process, f) → its invoke
    for op in history:
        if op.f not in ("tx-begin", "tx-end", "tx-checks"):
            continue
        if op.type == "invoke":
            calls[(op.process, op.f)] = op
            if op.f == "tx-begin":
                a = op.value
                out[a["name"]] = _Tx(a["name"], tuple(a["values"]), a["fate"])
            elif op.f == "tx-end" and op.value["action"] == "commit":
                t = out.get(op.value["name"])
                if t is not None and t.first_commit_s is None:
                    t.first_commit_s = op.time_s
            continue
        call = calls.pop((op.process, op.f), None)
        if op.f == "tx-begin" and call is not None:
            t = out[call.value["name"]]
            t.begin = op.type
            if op.type == "ok":
                t.id = op.value["id"]
        elif op.f == "tx-end" and call is not None:
            t = out.get(call.value["name"])
            state = op.value.get("state") if isinstance(op.value, Mapping) else None
            if t is not None:
                t.ends.append((op.process, call.value["action"], op.type, state, _code(op.error)))
        elif op.f == "tx-checks" and op.type == "ok":
            for c in op.value:
                _check_of(c, out, v)
    return out


def _check_of(c: TxCheck, txs: Mapping[str, _Tx], v: Verdict) -> None:
    v.tx_checks += 1
    t = txs.get(name_of(c.values[0])) if c.values else None
    if t is None or tuple(c.values) != t.values:
        v.tx_answers.append(
            f"check of {c.transaction_id}: messages {c.values} are no transaction's"
        )
    elif t.id is not None and t.id != c.transaction_id:
        v.tx_answers.append(f"{t.name}: begun as {t.id}, checked as {c.transaction_id}")
    elif t.id is None:
        t.id = c.transaction_id  # (a begin of unknown outcome: stored after all)


def check_transactions(history: Sequence[Op], main_reads: Iterable[Op], v: Verdict) -> None:
    """The rules over ``history``; ``main_reads``: every read (ok) of the workload's
    topic (its values ``Read``s or ``Popped``s)."""
    txs = read_transactions(history, v)
    if not txs:
        return
    owner = {x: t for t in txs.values() for x in t.values}
    _answers(txs, v)
    nodes = _drains(history)
    for node, image in sorted(nodes.items()):
        _at_the_end(node, image, txs, owner, v)
    _replicas(nodes, history, v)
    _under_way(history, main_reads, owner, v)
    _pending(history, set(nodes), v)
    _counts(txs, nodes, v)


def _answers(txs: Mapping[str, _Tx], v: Verdict) -> None:
    for name, t in sorted(txs.items()):
        if len(t.states()) > 1:
            v.tx_answers.append(f"{name} ({t.id}): answered committed and rolled back: {t.ends}")
        for process, action, _, _, code in t.ends:
            if code == "TRANSACTION_NOT_FOUND" and t.begin == "ok":
                v.tx_answers.append(
                    f"{name} ({t.id}): acknowledged, its {action} by {process} answered "
                    "TRANSACTION_NOT_FOUND"
                )


def _drains(history: Iterable[Op]) -> dict[str, dict[tuple[int, int], str]]:
    """Each drained node's transactions' topic: place → value."""
    out: dict[str, dict[tuple[int, int], str]] = {}
    for op in history:
        if op.f == "tx-drain" and op.type == "ok" and op.node is not None:
            image = out.setdefault(op.node, {})
            for r in op.value:
                image[(r.queue, r.offset)] = r.value
    return out


def _at_the_end(node: str, image: Mapping[tuple[int, int], str], txs: Mapping[str, _Tx],
                owner: Mapping[str, _Tx], v: Verdict) -> None:  # fmt: skip
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pos, value in sorted(image.items()):
        where[value].append(pos)
    for value in sorted(where):
        if value not in owner:
            v.tx_visible.append(f"{node}: {value!r} at {where[value]}: no transaction carried it")
        elif len(where[value]) > 1:
            v.tx_duplicated.append(f"{node}: {value} at {where[value]}")
    for name, t in sorted(txs.items()):
        present = [x for x in t.values if x in where]
        if 0 < len(present) < len(t.values):
            v.tx_partial.append(f"{node}: {name} ({t.id}): {present} of {list(t.values)}")
        if COMMITTED in t.states() and len(present) < len(t.values):
            v.tx_lost.append(f"{node}: {name} ({t.id}) answered committed; in its topic: {present}")
        if present and (ROLLED_BACK in t.states() or not t.may_commit()):
            why = "answered rolled back" if ROLLED_BACK in t.states() else "never asked to commit"
            v.tx_visible.append(f"{node}: {name} ({t.id}) {why}; in its topic: {present}")


def _replicas(nodes: Mapping[str, Mapping[tuple[int, int], str]], history: Iterable[Op],
              v: Verdict) -> None:  # fmt: skip
    if not nodes:
        return
    ref_node = min(nodes)
    ref = nodes[ref_node]
    for node, image in sorted(nodes.items()):
        differ = sorted(p for p in set(ref) | set(image) if ref.get(p) != image.get(p))
        if differ:
            q, o = differ[0]
            v.tx_replicas.append(
                f"{node} and {ref_node}: {len(differ)} places differ, first queue {q} offset {o}: "
                f"{image.get((q, o))!r} and {ref.get((q, o))!r}"
            )
    pending = {op.node: op.value for op in history if op.f == "tx-pending" and op.type == "ok"}
    if len({tuple(sorted(p)) for p in pending.values()}) > 1:
        v.tx_replicas.append(
            f"the nodes' pending transactions differ: {dict(sorted(pending.items()))}"
        )


def _under_way(history: Iterable[Op], main_reads: Iterable[Op], owner: Mapping[str, _Tx],
               v: Verdict) -> None:  # fmt: skip
    """Reads during the run: none of a transaction before a commit of it was asked, none
    of one rolled back, none elsewhere than its topic."""
    found: set[str] = set()
    for op in history:
        if op.f != "tx-pull" or op.type != "ok":
            continue
        for r in op.value:
            t = owner.get(r.value)
            at = f"read by {op.process} from {op.node} at {op.time_s:.3f}"
            if t is None:
                found.add(f"{r.value!r} {at}: no transaction carried it")
            elif t.first_commit_s is None or op.time_s < t.first_commit_s:
                found.add(f"{r.value} ({t.id}) {at}, before any commit of it was asked")
            elif ROLLED_BACK in t.states():
                found.add(f"{r.value} ({t.id}) {at}: answered rolled back")
    for op in main_reads:
        for r in op.value:
            if r.value in owner:
                found.add(f"{r.value} read in the workload's topic by {op.process} {op.f}")
    v.tx_visible.extend(sorted(found))


def _pending(history: Iterable[Op], drained: set[str], v: Verdict) -> None:
    said: dict[str, tuple[str, ...]] = {}
    for op in history:
        if op.f == "tx-pending" and op.type == "ok" and op.node is not None:
            said[op.node] = tuple(op.value)
    for node in sorted(drained | set(said)):
        if node not in said:
            v.tx_unresolved.append(f"{node}: did not say which transactions it has pending")
        elif said[node]:
            v.tx_unresolved.append(f"{node}: {len(said[node])} pending: {list(said[node][:10])}")


def _counts(txs: Mapping[str, _Tx], nodes: Mapping[str, Mapping[tuple[int, int], str]],
            v: Verdict) -> None:  # fmt: skip
    seen = set(next(iter(nodes.values())).values()) if nodes else set()
    for t in txs.values():
        v.tx_begun += 1
        v.tx_outcomes[t.begin] = v.tx_outcomes.get(t.begin, 0) + 1
        v.tx_fates[t.fate] = v.tx_fates.get(t.fate, 0) + 1
        whole = all(x in seen for x in t.values)
        v.tx_committed += whole
        v.tx_absent += not any(x in seen for x in t.values)
        for process, action, type_, _, _ in t.ends:
            key = f"{'checker' if process.startswith('txchecker') else 'producer'} {action} {type_}"
            v.tx_ends[key] = v.tx_ends.get(key, 0) + 1


def _line(d: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(d.items())) or "none"


def tx_summary(v: Verdict) -> dict[str, Any]:
    if not v.tx_begun:
        return {}
    return {
        "transactions": f"{v.tx_begun} begun ({_line(v.tx_outcomes)}); fates: "
        f"{_line(v.tx_fates)}; at the end {v.tx_committed} in the topic whole, "
        f"{v.tx_absent} absent",
        "transaction ends": f"{_line(v.tx_ends)}; {v.tx_checks} checks handed out",
    }
