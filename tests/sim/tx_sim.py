"""Transactions on the broker simulation (issue 29): seeded transactional producers begin
transactions through the master's real ``Transactions`` (``broker/transactions/
service.py``, the call path of the HTTP routes) and commit, roll back or leave them to
the checks; every node runs the master's loop (``Transactions.step``, the one
``Transactions.run`` turns) on the simulated clock, through crashes, partitions,
failovers, retention and installs, and ``TxChecker`` checks the committed log and every
replica's ``TransactionState`` after every event.

The workload (``TxKnobs``, from a stream of the seed's own, so a seed drawn without
transactions runs as it did before): one or two producers, each of a producer group of
its own, begin transactions (a batch of one to three half messages, in a producer
session, retried with it until acknowledged) while the faults go on (in most seeds only
in the first part of the fault phase: a live transaction's record holds retention back,
and then retention catches up) and after them until each began ``MIN_TRANSACTIONS``,
some messages pinned to a queue, some with a sharding key. Each transaction's fate is
drawn when it begins: committed or rolled back by its producer soon after the answer
(sometimes asked again: a repeat answers the same; sometimes the other resolution asked
after it: refused), answered (commit or rollback) at its *k*-th check, or never
answered, so that its checks run out (``tx_max_checks``) and the master rolls it back.
Each producer's checker polls its group's checks (``Transactions.checks``, ``wait_ms``
0) now and then on the node it believes is master and answers those whose fate says
so, as RocketMQ's ``TransactionListener.checkLocalTransaction`` does. The check
schedule (first check, interval, count) is short and drawn per seed so that checks,
answers and expiries all happen inside the fault phase. The master's loop (``TxLoop``)
turns every ``TICK_S`` on every node as ``Transactions.run`` does (a step on the master
only), its appends gathered by the simulation's ``gather`` (driven tasks of the node).

What is checked, against the committed log (``LogModel`` hands each half record, copy
and transaction operation to ``TxChecker`` in commit order):

- a half record holds what was sent (the producer's messages, their topic, its group)
  and is stored in the half topic only: no message of a transaction is ever a record
  of a user topic but as a copy;
- a copy (a record carrying ``TX_ORIGIN``) delivers message *i* of a transaction
  committed before it, with its body and tags, into its topic and pinned queue; each
  message has at most one copy, and none after a drop; a rolled-back or pending
  transaction has none;
- a transaction is resolved once in the log (later ``tx.commit``/``tx.rollback`` of it
  change nothing), by what its producer asked (commit or rollback, by a call or an
  answer to a check) or, with ``expired``, after exactly ``tx_max_checks`` checks;
  checks come no earlier than the transaction's next check time (the first one the
  master stamped on its record, then the previous check's entry time + the interval),
  never more than ``tx_max_checks`` (a count that a failover reset would exceed it);
- answers: a begin's id names the half record of its messages, and two answers for one
  batch agree; a commit or rollback answered OK names the log's resolution, one refused
  (``TRANSACTION_RESOLVED``) names the other one, a repeat answers the same, and an
  acknowledged transaction is never "not found"; a check names a transaction of the
  group with its messages, and its count is at least 1, at most the log's, and never
  lower than a check of it handed out before (across failovers);
- replicas: every node's ``TransactionState`` is the same at the same applied index and
  equals the log's up to it (counts, live transactions, each one's checks);
- after healing, within ``TX_DONE_WITHIN_MS`` ("liveness: transactions"), every begin is
  acknowledged and every transaction resolved, its messages copied or dropped; in the
  end each committed transaction's messages were delivered exactly once (bar a drop,
  its topic deleted) and no rolled-back one's.
"""

from __future__ import annotations

import bisect
import functools
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.batch import batch_inners
from broker.copies import PROP_REAL_QID, PROP_REAL_TOPIC
from broker.errors import (
    BrokerError,
    InvalidArgumentError,
    TransactionNotFoundError,
    TransactionResolvedError,
)
from broker.message import INNER_BATCH_FLAG, StoredMessage, decode_properties
from broker.metadata import HALF_TOPIC
from broker.produce import NewMessage
from broker.transactions.applier import PROP_TX_CHECK_AT, PROP_TX_GROUP, PROP_TX_ORIGIN
from broker.transactions.service import TICK_S, Check, Gather, parse_transaction_id
from broker.transactions.state import COMMITTED, ROLLED_BACK, STATS, TransactionState

from .clients import Batch, ProducerClient, SameAtIndex, SideClients, user_topics
from .drive import Task, Wait

if TYPE_CHECKING:
    from .broker_sim import BrokerNode, BrokerSimulation, LogModel
    from .sim import SimNode

TX_CHANCE = 0.25  # of the seeds run transactions (drawn from the seed's "tx" stream)
TX_DONE_WITHIN_MS = 10_000  # after healing: every transaction resolved, every begin acked
MIN_TRANSACTIONS = 3  # a producer begins this many at least (after the faults if need be)
MAX_END_TRIES = 1_000  # a bound on one commit's or rollback's retries
QUEUE_GONE = "queue gone"  # a begin refused: a pinned queue its topic has not (any more)
# A transaction's fate: its producer commits or rolls it back; or answers its k-th check
# so; or never answers (its checks run out and the master rolls it back).
FATES = ("commit", "rollback", "check commit", "check rollback", "orphan")
ACTION_STATE = {"commit": COMMITTED, "rollback": ROLLED_BACK}
OTHER = {"commit": "rollback", "rollback": "commit"}


# ---- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxKnobs:
    producers: int
    batch_max: int
    begin_every_ms: tuple[int, int]
    begin_until_ms: int | None  # no new transactions after (live ones hold retention back)
    fates: tuple[int, int, int, int, int]  # weights, as ``FATES``
    again: float  # the chance a resolution is asked again (the same, or the other one)
    pin: float  # the chance a message is pinned to a queue (as many have a sharding key)
    poll_every_ms: tuple[int, int]  # a producer's checker polls its group's checks
    first_check_ms: int  # ``tx_first_check_ms``
    check_interval_ms: int  # ``tx_check_interval_ms``
    max_checks: int  # ``tx_max_checks``

    @classmethod
    def from_seed(cls, seed: int) -> TxKnobs | None:
        """None for a seed without transactions (most: their runs stay as they were)."""
        rng = random.Random(f"{seed}/tx")
        if rng.random() >= TX_CHANCE:
            return None
        return cls(
            producers=rng.randint(1, 2),
            batch_max=rng.choice((1, 2, 3)),
            begin_every_ms=(rng.choice((20, 80)), rng.choice((300, 600))),
            begin_until_ms=rng.choice((600, 1200, None)),
            fates=rng.choice(((3, 2, 2, 1, 1), (1, 1, 2, 2, 2), (2, 2, 1, 1, 3))),
            again=rng.choice((0.1, 0.3)),
            pin=rng.choice((0.0, 0.2, 0.4)),
            poll_every_ms=rng.choice(((20, 80), (50, 200))),
            first_check_ms=rng.choice((50, 150, 300)),
            check_interval_ms=rng.choice((100, 200)),
            max_checks=rng.randint(1, 3),
        )

    def settings(self) -> dict[str, int]:
        return {
            "tx_first_check_ms": self.first_check_ms,
            "tx_check_interval_ms": self.check_interval_ms,
            "tx_max_checks": self.max_checks,
        }


@dataclass(slots=True)
class Plan:
    """A transaction as its producer sees it: what was sent and what it will do."""

    pid: str
    seq: int
    group: str
    topic: str
    messages: list[NewMessage]
    fate: str
    answer_at: int  # a "check ..." fate answers the check with this count (or a later)
    tx_id: str | None = None  # once the begin was answered
    asked: list[str] = field(default_factory=list)  # actions sent (first, then again)

    def message_keys(self) -> list[str]:
        return [f"{self.pid}|{self.seq}|{i}" for i in range(len(self.messages))]

    @property
    def action(self) -> str | None:
        """What the producer does (by a call or a check answer); None: never answers."""
        return None if self.fate == "orphan" else self.fate.removeprefix("check ")


@dataclass(slots=True)
class End:
    """One commit or rollback request, sent until answered."""

    plan: Plan
    action: str
    by_check: bool
    then: str | None = None  # the action to ask after this one is answered
    attempt: int = 0
    tries: int = 0


# ---- what the log says ------------------------------------------------------------------------


@dataclass(slots=True)
class Tx:
    base: int  # its half record's first queue offset: its id
    index: int  # its half record's entry
    term: int
    keys: list[str]
    topic: str
    group: str
    next_check: int  # log ms
    checks: list[int] = field(default_factory=list)  # tx.check entries, applied to it
    resolved: tuple[str, int, int] | None = None  # (committed | rolled_back, entry, term)
    expired: bool = False
    copies: dict[int, int] = field(default_factory=dict)  # message -> entry
    dropped: int | None = None  # entry

    @property
    def done(self) -> bool:
        return self.resolved is not None and (
            self.resolved[0] == ROLLED_BACK
            or self.dropped is not None
            or len(self.copies) == len(self.keys)
        )


class TxChecker:
    """The transaction invariants (module docstring), from the log and the answers."""

    def __init__(self, sim: BrokerSimulation, model: LogModel, knobs: TxKnobs | None) -> None:
        self.sim = sim
        self.model = model
        self.on = knobs is not None
        self.max_checks = 0 if knobs is None else knobs.max_checks
        self.plans: dict[str, Plan] = {}  # message key -> its transaction's plan
        self.txs: dict[int, Tx] = {}  # by base, in log order
        self.half_end = 0
        self.events: dict[str, list[int]] = {k: [] for k in STATS}  # entries, in log order
        self.begins: dict[tuple[str, int], str] = {}  # (producer, seq) -> transaction id
        self.ends: dict[tuple[str, str], str] = {}  # (transaction id, action) -> answer
        self.handed: dict[int, int] = {}  # base -> the highest check count handed out
        self.replicas = SameAtIndex()

    def fail(self, what: str) -> None:
        self.sim.checker.fail(f"transactions: {what}")

    def is_tx_key(self, key: str) -> bool:
        return key in self.plans

    # ---- fed by the log model, in commit order ---------------------------------------------

    def log_half(self, index: int, m: StoredMessage, raw: bytes, keys: list[str]) -> None:
        """A committed record of the half topic: a transaction begun."""
        props = m.properties
        if m.sys_flag & INNER_BATCH_FLAG:  # a batch record: its first message's
            _, inners = batch_inners(raw)
            first = inners[0]
            props = decode_properties(raw[first.props_at : first.props_at + first.props_len])
        base = m.queue_offset
        where = f"entry {index} (half {base}, {keys})"
        if base < self.half_end:
            self.fail(f"{where}: half offsets go back from {self.half_end}")
        self.half_end = base + len(keys)
        plan = self.plans.get(keys[0])
        if plan is None or plan.message_keys() != keys:
            self.fail(f"{where} holds no transaction's messages")
            return
        topic, group = props.get(PROP_REAL_TOPIC, ""), props.get(PROP_TX_GROUP, "")
        if (topic, group) != (plan.topic, plan.group):
            self.fail(f"{where}: for {topic}/{group}, sent to {plan.topic}/{plan.group}")
        check_at = props.get(PROP_TX_CHECK_AT, "")
        if not check_at.isdigit() or int(check_at) < m.store_timestamp:
            self.fail(f"{where}: first check at {check_at!r}, stored at {m.store_timestamp}")
        self.txs[base] = Tx(base, index, self.model.term, keys, topic, group, int(check_at or 0))
        self.events["begun"].append(index)
        self.sim.stats["tx begun"] += 1

    def log_plain(self, index: int, topic: str, key: str) -> None:
        """A committed message that is neither a copy nor a dead letter."""
        if topic != HALF_TOPIC and key in self.plans:
            self.fail(f"entry {index}: half message {key} is visible in {topic}")

    def _tx(self, index: int, what: str, base: int) -> Tx | None:
        t = self.txs.get(base)
        if t is None:
            self.fail(f"entry {index}: {what} of transaction {base}, never begun")
        return t

    def log_copy(self, index: int, m: StoredMessage, key: str) -> None:
        """A committed copy (it carries ``TX_ORIGIN``): a delivery, checked."""
        origin = m.properties[PROP_TX_ORIGIN]
        base, _, i_text = origin.partition(":")
        t = self._tx(index, "a copy", int(base))
        if t is None:
            return
        i = int(i_text)
        where = f"entry {index}, the copy of message {i} of transaction {base}"
        if not 0 <= i < len(t.keys) or key != t.keys[i]:
            self.fail(f"{where} holds {key}, the transaction {t.keys}")
            return
        sent = self.plans[key].messages[i]
        if (m.topic, m.body, m.properties.get("TAGS")) != (t.topic, sent.body, sent.tags):
            self.fail(f"{where} goes to {m.topic} (tags {m.properties.get('TAGS')!r}), not as sent")
        if sent.queue_id is not None and m.queue_id != sent.queue_id:
            self.fail(f"{where} is in queue {m.queue_id}, pinned to {sent.queue_id}")
        if PROP_REAL_QID in m.properties or PROP_TX_GROUP in m.properties:
            self.fail(f"{where} carries the half message's routing: {m.properties}")
        if t.resolved is None or t.resolved[0] != COMMITTED:
            self.fail(f"{where}: delivered while it is {t.resolved or 'pending'}")
        if i in t.copies:
            self.fail(f"{where}: delivered twice (first at entry {t.copies[i]})")
        if t.dropped is not None:
            self.fail(f"{where}: delivered after its drop at entry {t.dropped}")
        t.copies[i] = index
        self.events["copied"].append(index)
        stats = self.sim.stats
        stats["tx delivered"] += 1
        if t.resolved is not None:
            stats["tx delivered by a new master"] += self.model.term > t.resolved[2]

    def log_op(self, index: int, ts: int, op: dict[str, Any]) -> None:
        """A committed ``tx.*`` operation."""
        kind = str(op["op"])
        t = self._tx(index, kind, int(op["base"]))
        if t is None:
            return
        where = f"entry {index}: {kind} of transaction {t.base}"
        if kind == "tx.check":
            if t.resolved is not None:
                return  # (appended before its resolution applied: nothing)
            if ts < t.next_check:
                self.fail(f"{where} at {ts}, before its time {t.next_check}")
            t.checks.append(index)
            t.next_check = ts + int(op["interval_ms"])
            if len(t.checks) > self.max_checks:
                self.fail(f"{where}: check {len(t.checks)}, past tx_max_checks {self.max_checks}")
            self.events["checks"].append(index)
        elif kind in ("tx.commit", "tx.rollback"):
            self._resolve(t, index, ts, kind, expired=bool(op.get("expired")))
        elif kind == "tx.drop":
            if t.resolved is None or t.resolved[0] != COMMITTED or t.done:
                return
            inc = self.model.topic_before(t.topic, t.index)
            if inc is not None and self.model.current(t.topic) is inc:
                self.fail(f"{where} of {t.topic}, never deleted")
            t.dropped = index
            self.events["dropped"] += [index] * (len(t.keys) - len(t.copies))
            self.sim.stats["tx dropped"] += 1
        else:
            self.fail(f"{where}: unknown transaction operation")

    def _resolve(self, t: Tx, index: int, ts: int, kind: str, *, expired: bool) -> None:
        how = COMMITTED if kind == "tx.commit" else ROLLED_BACK
        where = f"entry {index}: {kind} of transaction {t.base} ({t.keys[0]})"
        if t.resolved is not None:
            self.sim.stats["tx resolutions repeated in the log"] += 1
            return  # (a repeat, or the other one appended before this applied: nothing)
        plan = self.plans[t.keys[0]]
        if expired:
            if how != ROLLED_BACK or len(t.checks) != self.max_checks or ts < t.next_check:
                self.fail(
                    f"{where} expired after {len(t.checks)} checks of {self.max_checks}, "
                    f"at {ts} (due {t.next_check})"
                )
            self.events["expired"].append(index)
            t.expired = True
        elif plan.action is None or ACTION_STATE[plan.action] != how:
            self.fail(f"{where}: its producer asks {plan.action}")
        t.resolved = (how, index, self.model.term)
        self.events[how].append(index)
        stats = self.sim.stats
        stats[f"tx {how.replace('_', ' ')}"] += 1
        stats["tx expired"] += expired
        stats["tx resolved after a failover"] += self.model.term > t.term

    # ---- the clients' answers ----------------------------------------------------------------

    def begun(self, plan: Plan, tx_id: str) -> None:
        """A begin answered OK (perhaps late): its id names the record of its messages."""
        first = self.begins.setdefault((plan.pid, plan.seq), tx_id)
        where = f"the begin of {plan.pid} seq {plan.seq} answered {tx_id}"
        if first != tx_id:
            self.fail(f"{where}, first {first}")
        base = parse_transaction_id(tx_id)
        t = None if base is None else self.txs.get(base)
        if t is None or t.keys != plan.message_keys():
            self.fail(f"{where}; the log has {t}")

    def ended(self, plan: Plan, action: str, answer: str) -> None:
        """A commit or rollback answered: the state (OK), "refused <state>" (409) or
        "not found" (404)."""
        tx_id = plan.tx_id
        assert tx_id is not None
        first = self.ends.setdefault((tx_id, action), answer)
        where = f"the {action} of {tx_id} ({plan.message_keys()}) answered {answer!r}"
        if first != answer:
            self.fail(f"{where}, first {first!r}")
        base = parse_transaction_id(tx_id)
        t = None if base is None else self.txs.get(base)
        how = None if t is None or t.resolved is None else t.resolved[0]
        want = ACTION_STATE[action] if how == ACTION_STATE[action] else f"refused {how}"
        if answer != want:
            self.fail(f"{where}; the log has it {how or 'pending'}")

    def checked(self, group: str, c: Check) -> None:
        """A check handed to ``group``'s checker."""
        t = self.txs.get(c.transaction.base)
        where = f"a check of transaction {c.transaction.base} (count {c.transaction.checks})"
        if t is None or t.group != group:
            self.fail(f"{where} for {group}; the log has {t}")
            return
        keys = [m.body.split(b"|", 3) for m in c.messages]
        if [b"|".join(k[:3]).decode() for k in keys] != t.keys:
            self.fail(f"{where} hands out {len(c.messages)} messages, not {t.keys}")
        n = c.transaction.checks
        if not 1 <= n <= len(t.checks) or n < self.handed.get(t.base, 0):
            self.fail(
                f"{where}: the log has {len(t.checks)} checks, one with "
                f"{self.handed.get(t.base)} was handed out before"
            )
        self.handed[t.base] = max(n, self.handed.get(t.base, 0))
        self.sim.stats["tx checks handed out"] += 1

    # ---- replicas -----------------------------------------------------------------------------

    def check_replica(self, node_id: str, applied: int, state: TransactionState) -> None:
        """Every node's transaction state is the same at the same applied index, and is
        what the log holds up to it."""
        if not self.on:
            return
        other = self.replicas.differs(node_id, applied, state.to_json())
        if other is not None:
            self.fail(f"{node_id}'s transactions at applied index {applied} differ from {other}'s")
        want = {k: bisect.bisect_right(v, applied) for k, v in self.events.items()}
        where = f"{node_id}'s transactions at applied index {applied}"
        if state.stats != want:
            self.fail(f"{where}: {state.stats}; the log: {want}")
        live = {}
        for t in self.txs.values():
            if t.index > applied:
                break
            how = t.resolved if t.resolved is not None and t.resolved[1] <= applied else None
            copied = sum(1 for i in t.copies.values() if i <= applied)
            if how is None:
                live[t.base] = ("pending", bisect.bisect_right(t.checks, applied))
            elif (
                how[0] == COMMITTED
                and copied < len(t.keys)
                and (t.dropped is None or t.dropped > applied)
            ):
                live[t.base] = (COMMITTED, copied)
        got = {
            b: (t.state, len(t.copied) if t.state == COMMITTED else t.checks)
            for b, t in state.live.items()
        }
        if got != live:
            diff = sorted(set(got.items()) ^ set(live.items()))[:4]
            self.fail(f"{where}: live (state, checks or copies) {diff} differ from the log's")

    # ---- liveness and the end ------------------------------------------------------------------

    def pending(self, bn: BrokerNode | None) -> list[int]:
        """Transactions not done in ``bn``'s state (``[-1]`` without a master)."""
        if not self.on:
            return []
        if bn is None:
            return [-1]
        return sorted(bn.meta.transactions.live)

    def final(self) -> None:
        """After convergence: every transaction resolved; a committed one's messages each
        delivered once (or dropped with its topic), a rolled-back one's never."""
        if not self.on:
            return  # (no stats: a seed without transactions traces as before)
        for t in self.txs.values():
            if not t.done:
                self.fail(f"transaction {t.base} ({t.keys}) not done: {t}")
        self.sim.stats["tx transactions"] = len(self.txs)


# ---- the clients ------------------------------------------------------------------------------


class TxWorkload(SideClients):
    """The transactional producers and their checkers of one run; their draws come from a
    stream of their own."""

    def __init__(self, sim: BrokerSimulation, knobs: TxKnobs, checker: TxChecker) -> None:
        super().__init__(sim, f"{sim.seed}/tx-events")
        self.knobs = knobs
        self.checker = checker
        self.producers = [ProducerClient(f"x{i}") for i in range(knobs.producers)]
        self.plans: dict[tuple[str, int], Plan] = {}
        self.ends: list[End] = []  # asked and not answered yet
        self.polling: dict[str, int] = {}  # group -> the poll awaiting a reply (0: none)

    @staticmethod
    def group_of(pid: str) -> str:
        return f"xg{pid[1:]}"

    def start(self) -> None:
        for p in self.producers:
            self._later(1, 50, f"tx {p.pid}", functools.partial(self._begin, p))
            group = self.group_of(p.pid)
            self.polling[group] = 0
            self._later(1, 50, f"tx checks {group}", functools.partial(self._poll, group))

    def busy(self) -> bool:
        """Not converged: a begin or an end not answered, a transaction not done."""
        return (
            any(p.batch is not None for p in self.producers)
            or bool(self.ends)
            or bool(self.checker.pending(self.sim._master_view()))
        )

    # ---- beginning ---------------------------------------------------------------------------

    def _new_plan(self, p: ProducerClient, topic: str, queues: int) -> Plan:
        r, k, msgs = self.rng, self.knobs, []
        for i in range(r.randint(1, k.batch_max)):
            key = f"{p.pid}|{p.next_seq}|{i}"
            pin = r.random()
            msgs.append(
                NewMessage(
                    body=f"{key}|".encode() + b"t" * r.randint(0, 200),
                    tags=r.choice((None, "a", "b")),
                    keys=tuple(f"k{r.randint(0, 30)}" for _ in range(r.randint(0, 1))),
                    queue_id=r.randrange(queues) if pin < k.pin else None,
                    sharding_key=f"s{r.randint(0, 5)}" if k.pin <= pin < 2 * k.pin else None,
                )
            )
            self.sim.model.sent.add(key)
        fate = r.choices(FATES, k.fates)[0]
        plan = Plan(
            p.pid, p.next_seq, self.group_of(p.pid), topic, msgs, fate,
            answer_at=r.randint(1, k.max_checks),
        )  # fmt: skip
        for key in plan.message_keys():
            self.checker.plans[key] = plan
        self.plans[(p.pid, p.next_seq)] = plan
        p.batch = Batch(p.pid, p.next_seq, topic, msgs)
        p.next_seq += 1
        return plan

    def _begin(self, p: ProducerClient) -> None:
        if p.attempt:
            return  # its reply or time-out goes on
        if p.batch is None:
            until = self.knobs.begin_until_ms
            faults = self.sim.faults_on and (until is None or self.sim.now_ms < until)
            if not (faults or (self.sim.workload_on and p.next_seq < MIN_TRANSACTIONS)):
                return
            view = self.sim._master_view()
            topics = [] if view is None else user_topics(view)
            if view is None or not topics:
                self._later(20, 100, f"tx {p.pid}", lambda: self._begin(p))
                return
            topic = self.rng.choice(topics)
            self._new_plan(p, topic, view.meta.topics[topic].queues)
        b = p.batch
        assert b is not None
        plan = self.plans[(b.pid, b.seq)]
        b.attempts += 1
        a = p.attempt = self._next_attempt()
        self.sim.trace(f"tx begin {b.pid} seq={b.seq} #{b.attempts} {b.topic} {plan.fate}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok" and payload != QUEUE_GONE:
                self.checker.begun(plan, payload)
            if a != p.attempt:
                return  # a late answer to an attempt the client gave up on
            p.attempt = 0
            self.sim.stats[f"tx begin {kind}"] += 1
            if payload == QUEUE_GONE:  # (refused: its topic was made again with fewer)
                self.sim.stats["tx begins refused a pinned queue"] += 1
                b.messages = plan.messages = [
                    NewMessage(m.body, m.tags, m.keys, sharding_key=m.sharding_key)
                    for m in b.messages
                ]
            if kind != "ok" or payload == QUEUE_GONE:
                self.sim.trace(f"tx begin {b.pid} seq={b.seq} {kind} {payload}")
                self._later(10, 150, f"tx {p.pid}", lambda: self._begin(p))
                return
            p.batch = None
            plan.tx_id = payload
            self.sim.trace(f"tx begun {plan.tx_id} {b.pid} seq={b.seq} {plan.fate}")
            if plan.fate in ("commit", "rollback"):
                self._later(0, 200, "tx end", lambda: self._ask(plan, plan.fate, by_check=False))
            self._later(*self.knobs.begin_every_ms, f"tx {p.pid}", lambda: self._begin(p))

        async def begin(bn: BrokerNode) -> str:
            try:
                begun = await bn.transactions.produce(b.topic, b.messages, plan.group, b.pid, b.seq)
            except InvalidArgumentError as e:
                if "is not in 0.." not in e.message:
                    raise
                return QUEUE_GONE  # (any other refusal of what no node takes fails the seed)
            return begun.transaction_id

        if not self._send("tx begin", begin, reply):
            p.attempt = 0
            self._later(20, 100, f"tx {p.pid}", lambda: self._begin(p))

    # ---- commit and rollback -----------------------------------------------------------------

    def _ask(self, plan: Plan, action: str, *, by_check: bool) -> None:
        """Send a commit or rollback (perhaps asked again afterwards, or the other one)."""
        if plan.asked and by_check:
            return  # (asked already: the answer goes on)
        then = None
        if not plan.asked and self.rng.random() < self.knobs.again:
            then = self.rng.choice((action, OTHER[action]))
        plan.asked.append(action)
        e = End(plan, action, by_check, then)
        self.ends.append(e)
        self._end(e)

    def _end(self, e: End) -> None:
        if e.attempt:
            return
        e.tries += 1
        if e.tries > MAX_END_TRIES:
            self.checker.fail(f"the {e.action} of {e.plan.tx_id}: {e.tries} tries")
        a = e.attempt = self._next_attempt()
        tx_id = e.plan.tx_id
        assert tx_id is not None
        self.sim.trace(f"tx {e.action} {tx_id} #{e.tries}{' (check)' if e.by_check else ''}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":
                self.checker.ended(e.plan, e.action, payload)
            if a != e.attempt:
                return
            e.attempt = 0
            self.sim.trace(f"tx {e.action} {tx_id} {kind} {payload}")
            if kind != "ok":
                self._later(10, 150, "tx end", lambda: self._end(e))
                return
            self.ends.remove(e)
            stats = self.sim.stats
            if payload.startswith("refused"):
                stats[f"tx {e.action}s refused"] += 1
            elif e.by_check:
                stats["tx resolved by a check answer"] += 1
            if len(e.plan.asked) > 1:
                stats["tx asked again"] += 1
            if e.then is not None:
                then = e.then
                self._later(1, 300, "tx end", lambda: self._again(e.plan, then))

        async def end(bn: BrokerNode) -> str:  # (as the route: its topic, then end)
            try:
                await bn.transactions.topic_of(tx_id)
                return await bn.transactions.end(tx_id, e.action)
            except TransactionResolvedError as err:
                return f"refused {err.fields['state']}"
            except TransactionNotFoundError:
                return "not found"

        if not self._send("tx end", end, reply):
            e.attempt = 0
            self._later(20, 100, "tx end", lambda: self._end(e))

    def _again(self, plan: Plan, action: str) -> None:
        plan.asked.append(action)
        e = End(plan, action, by_check=False)
        self.ends.append(e)
        self._end(e)

    # ---- the checkers ------------------------------------------------------------------------

    def _poll(self, group: str) -> None:
        """A producer's checker: poll the group's checks and answer them."""
        if not (self.sim.faults_on or self.busy()):
            return
        self._later(*self.knobs.poll_every_ms, f"tx checks {group}", lambda: self._poll(group))
        if self.polling[group]:
            return
        a = self.polling[group] = self._next_attempt()

        def reply(kind: str, payload: Any) -> None:
            if a != self.polling[group]:
                return
            self.polling[group] = 0
            if kind != "ok":
                return
            for c in payload:
                self.checker.checked(group, c)
                self._answer(c)

        async def checks(bn: BrokerNode) -> list[Check]:
            return await bn.transactions.checks(group, 0, 100)

        if not self._send("tx checks", checks, reply):
            self.polling[group] = 0

    def _answer(self, c: Check) -> None:
        """``checkLocalTransaction``: the transaction's fate, found by its messages."""
        key = b"|".join(c.messages[0].body.split(b"|", 3)[:3]).decode() if c.messages else ""
        plan = self.checker.plans.get(key)
        if plan is None or plan.action is None:
            return  # (never answered: its checks run out)
        if plan.fate.startswith("check") and c.transaction.checks < plan.answer_at:
            return  # (not yet: "unknown", as a producer still working on it answers)
        if plan.tx_id is None:
            plan.tx_id = f"tx1:{c.transaction.base}"  # (its begin not answered yet)
        self.sim.trace(f"tx check {plan.tx_id} #{c.transaction.checks} answered {plan.action}")
        self._ask(plan, plan.action, by_check=True)


# ---- the master's loop --------------------------------------------------------------------------


class TxLoop:
    """``Transactions.run`` of one broker incarnation on the simulation's events: a turn
    every ``TICK_S``, the real ``Transactions.step`` on the master (a task of the node:
    a crash ends it, a pause holds it)."""

    def __init__(self, sim: BrokerSimulation, n: SimNode, bn: BrokerNode) -> None:
        self.sim, self.n, self.bn = sim, n, bn

    def start(self) -> None:
        self._next()

    def _gone(self) -> bool:
        return self.sim.brokers.get(self.n.node_id) is not self.bn

    def _next(self) -> None:
        self.sim.at(self.sim.now_ms + round(TICK_S * 1000), f"tx loop {self.n.node_id}", self._turn)

    def _turn(self) -> None:
        if self._gone():
            return
        if self.n.paused:
            self.bn.held.append((self._turn, _ignore))
            return
        if not self.bn.gate.is_master:
            self._next()
            return
        txs = self.bn.transactions
        self.sim._serve(self.n, self.bn, "tx loop", txs.step(self.sim.clock()), self._ended, _same)

    def _ended(self, kind: str, payload: Any) -> None:
        if self._gone():
            return  # the node crashed: the loop died with it
        if kind != "ok":
            self.sim.trace(f"tx loop {self.n.node_id} {kind}: {payload}")
            self.sim.stats["tx loop turns failed"] += 1
        self._next()


def gather_on(sim: BrokerSimulation, n: SimNode, bn: BrokerNode) -> Gather:
    """``asyncio.gather`` for the driven tasks of ``bn``: each coroutine a task of the node
    (a crash kills it), started in an event of its own; the results in order, or the
    first error as soon as it is raised (the others go on)."""

    async def gather(*coros: Coroutine[Any, Any, Any]) -> list[Any]:
        out: list[Any] = [None] * len(coros)
        left = [len(coros)]
        w: Wait[None] = Wait("gather")
        if not coros:
            return out

        def finish(
            i: int, entry: tuple[Task, Any], value: Any, error: BaseException | None
        ) -> None:
            bn.tasks.remove(entry)
            if error is not None and not isinstance(error, BrokerError):
                raise error
            out[i] = value
            left[0] -= 1
            if not w.settled and error is not None:
                w.set_exception(error)
            elif not w.settled and left[0] == 0:
                w.set_result(None)

        for i, coro in enumerate(coros):
            box: list[tuple[Task, Any]] = []
            task = Task(
                f"gather {i} {n.node_id}",
                coro,
                lambda v, err, i=i, box=box: finish(i, box[0], v, err),
                functools.partial(sim._wake, n, bn),
            )
            box.append((task, _ignore))
            bn.tasks.append(box[0])
            task.wake()
        await w
        return out

    return gather


def _same(x: Any) -> Any:
    return x


def _ignore(kind: str, payload: Any) -> None:
    """The reply of a turn held while its node is paused, or of a gathered task."""
