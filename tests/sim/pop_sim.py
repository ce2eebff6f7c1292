"""POP groups on the broker simulation (issue 28): seeded consumers of one or two POP
groups drive the master's real ``PopGroups`` (``broker/pop/service.py``) through
crashes, partitions, failovers, retention and installs, and ``PopChecker`` checks what
they were answered against the committed log after every event.

The workload (``PopKnobs``, from a stream of the seed's own, so a seed drawn without POP
runs as it did before): an admin configures each group (``PopGroups.configure``: FIFO or
not, two to four delivery attempts, short retry delays, ``start`` earliest, some with a
tag filter); then each of a few consumers per group receives (``wait_ms`` 0: the
simulated clock moves by events, a consumer asks again later), works on each message
for a while and then acks it (mostly, sometimes several handles at once), nacks it
(with a delay, 0 or the group's), gives it a new invisible time (then acks it), or
forgets it (a slow or crashed consumer: the message comes back after its invisible
time, or goes to ``%DLQ%<group>`` once its attempts are spent). Work may outlast the
invisible time, so late acks meet redeliveries and dead letters. A FIFO consumer
retries a receive whose answer it lost with the same ``attempt_id``. Consumers keep
going after healing until every message is done, within ``POP_DONE_WITHIN_MS``.

What is checked, from the answers the clients saw and the committed log (``PopLog``,
fed by ``LogModel`` in commit order; log time is the applier's: the largest
STORETIMESTAMP of the POP operations and dead letters so far, stamped by the master):

- a delivery is what its receive entry named: the handle's epoch is a ``pop.receive``
  of the group and topic naming that offset, the message is the queue's message at that
  offset (its body), it matches the group's tag filter, and ``invisible_until`` is the
  entry's log time plus the ``invisible_ms`` asked;
- an acked message (ack answered OK) is never delivered again, and never dead-lettered;
- no message is delivered again while an earlier delivery of it is invisible, nor
  before it is due (its invisible time plus the group's retry delay for its attempt),
  by the log time of the receive entry; a nack or new invisible time sent on the
  handle (answered or not) may have made it visible earlier, from when it was sent on;
- attempts never go down: each delivery a client saw is one more than the one before it
  that a client saw, or more by at most the receives in between that named the message
  and whose answer no client saw (a lost answer); a new invisible time keeps the attempt
  and needs the latest handle;
- FIFO: while a message of a queue is in flight and not due, nothing else of that
  queue is delivered to the group (unless an ack or dead letter in the log may have
  ended it);
- dead letters (``%DLQ%<group>``): each names (``DLQ_ORIGIN_*``, ``POP_EPOCH``) a
  message of the group's that was not acked, once per message, after its
  ``max_delivery_attempts`` deliveries, once due, with its body; nothing of it is
  delivered after its dead letter; in the end the state counts exactly the copies;
- replicas: every node's POP state is identical at the same applied index (after
  every dispatch step, install and recovery, by digest; the snapshot comparison after
  convergence covers only the end);
- after healing, within ``POP_DONE_WITHIN_MS``, every message of the groups' topics is
  done in the master's state (not in flight, below ``next``), and each such message
  was acked or dead-lettered in the log. Exempt: messages the group's tag filter passes
  over, and messages retention deleted from the log of a node while it was MASTER (a
  POP group cannot get them).

Not checked: deliveries whose answer no client saw (a receive whose answer was lost
hands out messages nobody holds; the checks above allow for them but cannot see them).
"""

from __future__ import annotations

import random
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.message import StoredMessage, decode_properties
from broker.pop.applier import (
    DLQ_PREFIX,
    PROP_DELIVERY_ATTEMPTS,
    PROP_DLQ_ORIGIN_QUEUE_ID,
    PROP_DLQ_ORIGIN_QUEUE_OFFSET,
    PROP_DLQ_ORIGIN_TOPIC,
    PROP_POP_EPOCH,
)
from broker.pop.service import Received, parse_handle
from broker.pop.state import PopConfig, PopState
from consumequeue import tags_hash
from tests.pop_rules import History, Seen

from .clients import SameAtIndex, SideClients

if TYPE_CHECKING:
    from broker.message import RecordHead

    from .broker_sim import BrokerNode, BrokerSimulation, LogModel

POP_CHANCE = 0.25  # of the seeds run POP consumers (drawn from the seed's "pop" stream)
POP_DONE_WITHIN_MS = 12_000  # after healing: every message acked or dead-lettered
MAX_HELD = 64  # messages one consumer holds at most (it stops receiving)
MAX_ACK = 32  # handles in one ack

MsgKey = tuple[str, str, int, int, int]  # group, topic, its creating entry, queue, offset
QueueKey = tuple[str, str, int, int]  # group, topic, its creating entry, queue
Made = tuple[str, int, int, str, str | None]  # topic, queue, queue offset, body key, tags


def _made(
    h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
) -> Made:
    """The ``MessageMaker`` of the simulated consumers: what the checker needs."""
    key = b"|".join(bytes(body[:64]).split(b"|", 3)[:3]).decode()
    return h.topic, h.queue_id, queue_offset, key, decode_properties(props).get("TAGS")


# ---- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PopGroupPlan:
    name: str
    config: PopConfig
    topics: tuple[str, ...]
    tags: str | None  # the receives' tag filter
    consumers: int

    def matches(self, tags_hash_: int) -> bool:
        if self.tags is None:
            return True
        return tags_hash_ in {tags_hash(t) for t in self.tags.split("||")}


@dataclass(frozen=True, slots=True)
class PopKnobs:
    groups: tuple[PopGroupPlan, ...]
    invisible_ms: tuple[int, ...]  # what receives ask
    receive_every_ms: tuple[int, int]  # an idle consumer asks again after
    max_messages: int  # what a receive asks for (now and then fewer)
    late: float  # the chance that work outlasts the message's invisible time
    weights: tuple[int, int, int, int]  # ack, nack, new invisible time then ack, forget

    @classmethod
    def from_seed(cls, seed: int, topics: Sequence[str]) -> PopKnobs | None:
        """None for a seed without POP consumers (most: their runs stay as they were)."""
        rng = random.Random(f"{seed}/pop")
        if rng.random() >= POP_CHANCE:
            return None
        retries: tuple[dict[str, Any], ...] = (
            {"policy": "list", "delays_ms": [0]},
            {"policy": "list", "delays_ms": [20, 100]},
            {"policy": "exponential", "initial_ms": 10, "multiplier": 3, "max_ms": 200},
        )
        groups = []
        for i in range(rng.randint(1, 2)):
            config = PopConfig.from_json(
                {
                    "fifo": rng.random() < 0.5,
                    "max_delivery_attempts": rng.randint(2, 4),
                    "retry": rng.choice(retries),
                    "start": "earliest",
                }
            )
            names = tuple(sorted(rng.sample(list(topics), rng.randint(1, len(topics)))))
            tags = rng.choice((None, None, "a||b"))
            groups.append(PopGroupPlan(f"pg{i}", config, names, tags, rng.randint(2, 3)))
        return cls(
            groups=tuple(groups),
            invisible_ms=rng.choice(((100, 200), (100, 300), (150,))),
            receive_every_ms=(rng.choice((5, 20)), rng.choice((40, 100))),
            max_messages=rng.choice((8, 16, 32)),
            late=rng.choice((0.03, 0.1)),
            weights=rng.choice(((88, 4, 4, 4), (75, 8, 7, 10), (60, 12, 8, 20))),
        )


@dataclass(slots=True)
class Holding:
    """A message a consumer holds: its handle, and what it will do with it when."""

    key: MsgKey
    topic: str
    handle: str
    epoch: int
    attempt: int
    act_at: int  # simulated ms
    plan: str  # "ack" | "nack" | "change" | "forget"


@dataclass(slots=True)
class PopConsumer:
    name: str
    plan: PopGroupPlan
    held: list[Holding] = field(default_factory=list)
    attempt: int = 0  # the request awaiting a reply; 0 = none
    receives: int = 0
    # A FIFO receive whose answer was lost, to ask again with the same attempt_id:
    # (topic, attempt_id, max_messages, invisible_ms).
    retry: tuple[str, str, int, int] | None = None


# ---- what the log says ----------------------------------------------------------------------


class PopChecker:
    """The POP invariants (module docstring), from the clients' answers and the log."""

    def __init__(self, sim: BrokerSimulation, model: LogModel, knobs: PopKnobs | None) -> None:
        self.sim = sim
        self.model = model
        self.plans = {p.name: p for p in knobs.groups} if knobs is not None else {}
        # The log: each POP entry's log time and kind; per message the receive entries
        # naming it, the ack entries naming it, its dead letters.
        self.ts = 0
        self.time: dict[int, int] = {}
        self.kinds: dict[int, str] = {}
        self.named: dict[MsgKey, list[int]] = {}
        self.acks: dict[MsgKey, list[int]] = {}
        self.dead: dict[MsgKey, list[int]] = {}
        # The clients
        self.history: dict[MsgKey, History] = {}
        self.by_queue: dict[QueueKey, dict[int, list[int]]] = {}  # offset -> epochs seen
        # Replicas: the POP state by applied index (the first node's to get there)
        self.replicas = SameAtIndex()
        # Retention: the highest log head a node had while it was MASTER; a group cannot
        # get the messages before it (exempt from "every message is done").
        self.gone_pos = 0

    def fail(self, what: str) -> None:
        self.sim.checker.fail(f"POP: {what}")

    def _created(self, topic: str, index: int) -> int | None:
        inc = self.model.topic_before(topic, index)
        return None if inc is None else inc.created

    def _hist(self, key: MsgKey) -> History:
        h = self.history.get(key)
        if h is None:
            h = self.history[key] = History()
        return h

    def _config(self, group: str) -> PopConfig:
        return self.plans[group].config

    # ---- fed by the log model, in commit order -------------------------------------------

    def _tick(self, index: int, stamp: int) -> int:
        self.ts = max(self.ts, stamp)
        self.time[index] = self.ts
        return self.ts

    def log_op(self, index: int, stamp: int, op: dict[str, Any]) -> None:
        """A committed ``pop.*`` operation."""
        kind = str(op["op"])
        self._tick(index, stamp)
        self.kinds[index] = kind
        if kind == "pop.config":
            plan = self.plans.get(str(op["group"]))
            if plan is None or PopConfig.from_json(op["config"]) != plan.config:
                self.fail(f"entry {index} configures {op['group']} as {op['config']}")
            return
        group, topic = str(op["group"]), str(op["topic"])
        created = self._created(topic, index)
        if created is None:
            return  # no such topic: the applier does nothing with it either
        if kind == "pop.receive":
            for q, _start, _end, offsets, *_since in op["picks"]:
                for o in offsets:
                    self.named.setdefault((group, topic, created, q, o), []).append(index)
        elif kind == "pop.ack":
            for q, o, _epoch in op["handles"]:
                self.acks.setdefault((group, topic, created, q, o), []).append(index)

    def log_dead_letter(self, index: int, m: StoredMessage, key: str) -> None:
        """A committed message of ``%DLQ%<group>``: a dead letter, checked."""
        group = m.topic[len(DLQ_PREFIX) :]
        p = m.properties
        if PROP_POP_EPOCH not in p:
            self.fail(f"entry {index}: {m.topic} holds {key}, no dead letter")
            return
        self._tick(index, m.store_timestamp)
        topic, epoch = p[PROP_DLQ_ORIGIN_TOPIC], int(p[PROP_POP_EPOCH])
        q, o = int(p[PROP_DLQ_ORIGIN_QUEUE_ID]), int(p[PROP_DLQ_ORIGIN_QUEUE_OFFSET])
        created = self._created(topic, epoch)
        plan = self.plans.get(group)
        if created is None or plan is None:
            self.fail(f"entry {index}: dead letter of {topic}/{q}@{o} (epoch {epoch}) of {group}")
            return
        mk = (group, topic, created, q, o)
        where = f"dead letter {index} of {_name(mk)}"
        mq = self.model.queues.get((topic, created, q))
        if mq is None or o >= len(mq.ids) or mq.ids[o] != key:
            self.fail(f"{where} holds {key}, not the message at that offset")
        attempts = int(p[PROP_DELIVERY_ATTEMPTS])
        if attempts != plan.config.max_delivery_attempts:
            self.fail(f"{where} after {attempts} attempts, not {plan.config.max_delivery_attempts}")
        self.sim.stats["pop dead letters"] += 1
        earlier = self.dead.setdefault(mk, [])
        if earlier:
            self.fail(f"{where}: dead-lettered twice (first at entry {earlier[0]})")
        earlier.append(index)
        h = self.history.get(mk)
        if h is None:
            return
        if h.acked is not None:
            self.fail(f"{where}: its handle {h.acked} was acked (answered OK)")
        prev = h.before(index)
        if prev is not None:
            self._check_due(
                mk, h, prev, self.time[index], f"{where} at log time {self.time[index]}"
            )
        later = [s.epoch for s in h.seen if s.epoch > index]
        if later:
            self.fail(f"{where}: delivered again after it, at entry {later[0]}")

    # ---- the clients' answers ----------------------------------------------------------------

    def delivered(
        self,
        consumer: str,
        plan: PopGroupPlan,
        topic: str,
        invisible_ms: int,
        answer: list[Received[Made]],
    ) -> list[tuple[MsgKey, int, int, str]]:
        """A receive answered these: check each; (key, epoch, attempt, handle) each."""
        out = []
        for r in answer:
            handle = parse_handle(r.receipt_handle)
            if handle is None:
                self.fail(f"{consumer} got handle {r.receipt_handle!r}")
                continue
            q, o, epoch = handle
            made_topic, made_q, made_o, body_key, tags = r.message
            where = f"{consumer} got {topic}/{q}@{o} (epoch {epoch})"
            if (made_topic, made_q, made_o) != (topic, q, o):
                self.fail(f"{where} with the message of {made_topic}/{made_q}@{made_o}")
            if epoch > self.model.end:
                self.fail(f"{where}: entry {epoch} is not committed (log end {self.model.end})")
            created = self._created(topic, epoch)
            if created is None:
                self.fail(f"{where}: no such topic at entry {epoch}")
                continue
            key = (plan.name, topic, created, q, o)
            if epoch not in self.named.get(key, []):
                self.fail(f"{where}: entry {epoch} is no receive of {plan.name} naming it")
            mq = self.model.queues.get((topic, created, q))
            if mq is None or o >= len(mq.ids) or mq.ids[o] != body_key:
                self.fail(f"{where} with body {body_key}, not the queue's message there")
            if plan.tags is not None and tags not in plan.tags.split("||"):
                self.fail(f"{where} with tags {tags!r}; the group receives {plan.tags!r}")
            want = self.time[epoch] + invisible_ms
            if r.invisible_until != want:
                self.fail(
                    f"{where} invisible until {r.invisible_until}, not its entry's log time "
                    f"{self.time[epoch]} + {invisible_ms} ms"
                )
            self._seen(key, Seen(epoch, r.delivery_attempt, r.invisible_until, consumer, True))
            out.append((key, epoch, r.delivery_attempt, r.receipt_handle))
        return out

    def released(self, key: MsgKey, epoch: int, visible_at: int, due: int) -> None:
        """A nack or new invisible time is sent on handle ``epoch`` now: from here the
        message may be visible from ``visible_at`` and due from ``due`` (log ms)."""
        self._hist(key).releases.append((epoch, visible_at, due))

    def changed(
        self, consumer: str, key: MsgKey, epoch: int, inv_ms: int, r: Received[None]
    ) -> int:
        """A new invisible time was answered for handle ``epoch``: the new handle's."""
        handle = parse_handle(r.receipt_handle)
        assert handle is not None
        new = handle[2]
        where = f"{consumer}'s new invisible time for {_name(key)} (epoch {epoch} -> {new})"
        if self.kinds.get(new) != "pop.invisible":
            self.fail(f"{where}: entry {new} is no pop.invisible")
        if r.invisible_until != self.time[new] + inv_ms:
            self.fail(f"{where}: until {r.invisible_until}, not {self.time[new]} + {inv_ms}")
        h = self._hist(key)
        prev = h.before(new)
        if prev is None or prev.epoch != epoch:
            self.fail(f"{where}: the latest handle a client saw before it is {prev}")
        elif r.delivery_attempt != prev.attempt:
            self.fail(f"{where}: attempt {prev.attempt} became {r.delivery_attempt}")
        self._seen(key, Seen(new, r.delivery_attempt, r.invisible_until, consumer, False))
        return new

    def acked(self, consumer: str, key: MsgKey, epoch: int) -> None:
        """An ack of handle ``epoch`` was answered OK."""
        h = self._hist(key)
        where = f"{consumer}'s ack of {_name(key)} (epoch {epoch}) answered OK"
        if h.acked is not None and h.acked != epoch:
            self.fail(f"{where}, and before it the ack of epoch {h.acked}")
        h.acked = epoch
        later = [s for s in h.seen if s.epoch > epoch]
        if later:
            self.fail(f"{where}, but it was delivered again: {later[0]}")
        if self.dead.get(key):
            self.fail(f"{where}, but it was dead-lettered at entry {self.dead[key][0]}")

    # ---- the rules -----------------------------------------------------------------------------

    def _seen(self, key: MsgKey, s: Seen) -> None:
        h = self._hist(key)
        at, x = h.insert(s)
        if x is not None:
            if (x.attempt, x.visible_at) != (s.attempt, s.visible_at):
                self.fail(f"{_name(key)}: epoch {s.epoch} answered as {x} and as {s}")
            return
        if h.acked is not None and s.epoch > h.acked:
            self.fail(f"{_name(key)} was acked (epoch {h.acked}) and delivered again: {s}")
        for d in self.dead.get(key, []):
            if d < s.epoch:
                self.fail(f"{_name(key)} was dead-lettered at entry {d} and delivered again: {s}")
        prev = h.seen[at - 1] if at > 0 else None
        nxt = h.seen[at + 1] if at + 1 < len(h.seen) else None
        self._check_step(key, h, prev, s)
        if nxt is not None:
            self._check_step(key, h, s, nxt)
        if s.received:
            self.by_queue.setdefault(key[:4], {}).setdefault(key[4], []).append(s.epoch)
            if self._config(key[0]).fifo:
                self._check_fifo(key, s)

    def _unobserved(self, key: MsgKey, h: History, lo: int, hi: int) -> int:
        """Receive entries in (lo, hi) naming the message whose answer no client saw."""
        seen = {x.epoch for x in h.seen}
        return sum(1 for i in self.named.get(key, []) if lo < i < hi and i not in seen)

    def _check_step(self, key: MsgKey, h: History, prev: Seen | None, cur: Seen) -> None:
        """``cur`` after ``prev``, the seen before it (by epoch)."""
        if not cur.received:
            return  # checked by ``changed``: the holder's new handle
        skipped = self._unobserved(key, h, -1 if prev is None else prev.epoch, cur.epoch)
        lo = 1 if prev is None else prev.attempt + 1
        if not lo <= cur.attempt <= lo + skipped:
            self.fail(
                f"{_name(key)}: attempt {cur.attempt} at epoch {cur.epoch} after "
                f"{'none' if prev is None else f'attempt {prev.attempt} at epoch {prev.epoch}'}"
                f" ({skipped} answers no client saw in between)"
            )
        if prev is not None:
            ts = self.time[cur.epoch]
            self._check_due(
                key,
                h,
                prev,
                ts,
                f"delivered to {cur.consumer} at log time {ts} (epoch {cur.epoch})",
            )

    def _check_due(self, key: MsgKey, h: History, prev: Seen, ts: int, what: str) -> None:
        for why in h.too_early(prev, self._config(key[0]).retry, ts):
            self.fail(f"{_name(key)} {what}, {why}")

    def _check_fifo(self, key: MsgKey, s: Seen) -> None:
        """FIFO: ``s`` hands out ``key`` at its entry's log time; no other message of the
        queue may be in flight and not due then, and ``s`` (as a flight) holds the
        deliveries of the queue's other messages a client saw after it."""
        offsets = self.by_queue.get(key[:4], {})
        o = key[4]
        for other, epochs in offsets.items():
            if other == o:
                continue
            okey = (*key[:4], other)
            oh = self.history[okey]
            # ``other``'s flight when ``s`` was handed out
            prev = oh.before(s.epoch)
            if prev is not None:
                self._check_blocked(okey, oh, prev, key, s)
            # ``s``'s flight when each later delivery of ``other`` was handed out
            for e in epochs:
                if e > s.epoch and self.history[key].before(e) is s:
                    later = next(x for x in oh.seen if x.epoch == e)
                    self._check_blocked(key, self.history[key], s, okey, later)

    def _check_blocked(self, okey: MsgKey, oh: History, prev: Seen, key: MsgKey, s: Seen) -> None:
        """``okey``'s flight ``prev`` (unless it ended before ``s``) blocks ``s``."""
        ended = [
            i for i in self.acks.get(okey, []) + self.dead.get(okey, []) if prev.epoch < i < s.epoch
        ]
        if ended:
            return  # an ack or dead letter in the log may have ended it
        _, due = oh.floors(prev, self._config(okey[0]).retry)
        ts = self.time[s.epoch]
        if ts < due:
            self.fail(
                f"FIFO: {_name(key)} delivered at log time {ts} (epoch {s.epoch}) while "
                f"{_name(okey)} is in flight (epoch {prev.epoch}, due at {due})"
            )

    # ---- replicas ------------------------------------------------------------------------------

    def check_replica(self, node_id: str, applied: int, state: PopState) -> None:
        """Every node's POP state is the same at the same applied index."""
        if not self.plans:
            return
        other = self.replicas.differs(node_id, applied, state.to_json())
        if other is not None:
            self.fail(f"{node_id}'s state at applied index {applied} differs from {other}'s")

    # ---- liveness and the end ------------------------------------------------------------------

    def pending(self, bn: BrokerNode | None) -> list[MsgKey]:
        """Messages of the groups' topics not done in ``bn``'s state (not exempt)."""
        if not self.plans:
            return []
        if bn is None:
            return [("", "", 0, 0, 0)]  # no master: not done
        out: list[MsgKey] = []
        state = bn.meta.pop
        for plan in self.plans.values():
            for topic in plan.topics:
                t = self.model.current(topic)
                if t is None:
                    continue
                for q in range(t.queues):
                    qs = state.queue(plan.name, topic, q)
                    for o in self._due_offsets(plan, topic, t.created, q):
                        if qs is None or o >= qs.next or o in qs.flights:
                            out.append((plan.name, topic, t.created, q, o))
        return out

    def _due_offsets(self, plan: PopGroupPlan, topic: str, created: int, q: int) -> list[int]:
        """The offsets of the queue the group must end: not passed over by its tag filter,
        not deleted by retention on a master."""
        mq = self.model.queues.get((topic, created, q))
        if mq is None:
            return []
        return [
            o
            for o, (clo, _size, th) in enumerate(mq.units)
            if plan.matches(th) and clo >= self.gone_pos
        ]

    def final(self, bn: BrokerNode) -> None:
        """After convergence: every message done in the state was acked or dead-lettered
        in the log; the state counts exactly the dead letters of the current topics; the
        groups' configurations are the admin's."""
        if not self.plans:
            return
        state = bn.meta.pop
        for plan in self.plans.values():
            if state.groups.get(plan.name) != plan.config:
                self.fail(f"{plan.name}'s configuration is {state.groups.get(plan.name)}")
            for topic in plan.topics:
                t = self.model.current(topic)
                if t is None:
                    continue
                for q in range(t.queues):
                    for o in self._due_offsets(plan, topic, t.created, q):
                        key = (plan.name, topic, t.created, q, o)
                        if not self.acks.get(key) and not self.dead.get(key):
                            self.fail(
                                f"{_name(key)} is done for the group, never acked nor dead-lettered"
                            )
                copies = sum(
                    1 for k, v in self.dead.items() if v and k[:3] == (plan.name, topic, t.created)
                )
                counted = state.counts(plan.name, topic)["dead_lettered"]
                if copies != counted:
                    self.fail(
                        f"{plan.name}: {copies} dead letters of {topic} in the log, "
                        f"the state counts {counted}"
                    )


def _name(key: MsgKey) -> str:
    group, topic, created, q, o = key
    return f"{group} {topic}@{created}/{q}@{o}"


# ---- the clients ------------------------------------------------------------------------------


class PopWorkload(SideClients):
    """The POP admin and consumers of one run, on the simulation's events: each request
    goes to a node the client believes is MASTER (``BrokerSimulation._request``) and
    runs the node's real ``PopGroups`` there (``_serve``). Its draws come from a stream
    of their own."""

    def __init__(self, sim: BrokerSimulation, knobs: PopKnobs, checker: PopChecker) -> None:
        super().__init__(sim, f"{sim.seed}/pop-events")
        self.knobs = knobs
        self.checker = checker
        self.consumers = [
            PopConsumer(f"{p.name}c{i}", p) for p in knobs.groups for i in range(p.consumers)
        ]
        self.to_configure = list(knobs.groups)
        self.admin_attempt = 0
        self._pending: tuple[int, int] | None = None  # (now_ms, how many), cached

    def start(self) -> None:
        self._later(1, 10, "pop admin", self._admin)
        for c in self.consumers:
            self._later(1, 50, f"pop {c.name}", lambda c=c: self._step(c))

    def pending(self) -> int:
        """Messages not done yet in the master's state (cached per simulated ms)."""
        now = self.sim.now_ms
        if self._pending is None or self._pending[0] != now:
            self._pending = (now, len(self.checker.pending(self.sim._master_view())))
        return self._pending[1]

    def active(self) -> bool:
        """Clients work while messages may come (the simulation's workload, delay
        messages not delivered yet), then until all is done."""
        return self.sim.messages_coming() or bool(self.to_configure) or self.pending() > 0

    def busy(self) -> bool:
        """Not converged: a request outstanding, a group not configured, work left."""
        return (
            bool(self.to_configure)
            or bool(self.admin_attempt)
            or any(c.attempt for c in self.consumers)
            or self.pending() > 0
        )

    # ---- the admin: each group's configuration --------------------------------------------

    def _admin(self) -> None:
        if not self.to_configure:
            return
        self._later(30, 70, "pop admin", self._admin)
        plan = self.to_configure[0]
        view = self.sim._master_view()
        if view is not None and view.meta.pop.groups.get(plan.name) == plan.config:
            self.to_configure.pop(0)
            return
        if self.admin_attempt or view is None:
            return
        a = self.admin_attempt = self._next_attempt()
        self.sim.trace(f"pop configure {plan.name} {plan.config.to_json()}")

        def reply(kind: str, payload: Any) -> None:
            if a == self.admin_attempt:
                self.admin_attempt = 0

        doc = plan.config.to_json()
        if not self._send("pop configure", lambda bn: bn.pop.configure(plan.name, doc), reply):
            self.admin_attempt = 0

    # ---- a consumer --------------------------------------------------------------------------

    def _soon(self, c: PopConsumer) -> None:
        self._later(1, 10, f"pop {c.name}", lambda: self._step(c))

    def _idle(self, c: PopConsumer) -> None:
        self._later(*self.knobs.receive_every_ms, f"pop {c.name}", lambda: self._step(c))

    def _step(self, c: PopConsumer) -> None:
        if c.attempt:
            return  # its reply or time-out goes on
        if not self.active():
            return
        now = self.sim.now_ms
        due = sorted((h for h in c.held if h.act_at <= now), key=lambda h: h.act_at)
        if due:
            h = due[0]
            if h.plan == "forget":  # a slow or crashed consumer: it comes back
                c.held.remove(h)
                self.sim.trace(f"pop {c.name} forgets {_name(h.key)}")
                self.sim.stats["pop forgotten"] += 1
                self._soon(c)
            elif h.plan == "ack":
                batch = [x for x in due if x.plan == "ack" and x.topic == h.topic]
                self._ack(c, batch[: self.rng.choice((1, 4, MAX_ACK))])
            elif h.plan == "nack":
                self._nack(c, h)
            else:
                self._change(c, h)
            return
        view = self.sim._master_view()
        ready = view is not None and view.meta.pop.groups.get(c.plan.name) == c.plan.config
        if c.retry is None and (not ready or len(c.held) >= MAX_HELD):
            self._idle(c)
            return
        self._receive(c)

    def _work(
        self, key: MsgKey, topic: str, handle: str, epoch: int, attempt: int, inv_ms: int
    ) -> Holding:
        """What the consumer will do with a message it got (invisible ``inv_ms``), and
        when: within its invisible time, or now and then a while after it."""
        plan = self.rng.choices(("ack", "nack", "change", "forget"), self.knobs.weights)[0]
        if self.rng.random() < self.knobs.late:
            work_ms = self.rng.randint(inv_ms, 2 * inv_ms + 50)
        else:
            work_ms = self.rng.randint(1, max(1, inv_ms * 2 // 3))
        return Holding(key, topic, handle, epoch, attempt, self.sim.now_ms + work_ms, plan)

    def _receive(self, c: PopConsumer) -> None:
        if c.retry is not None:
            topic, aid, most, inv = c.retry
            self.sim.stats["pop receives retried with their attempt_id"] += 1
        else:
            topic = self.rng.choice(c.plan.topics)
            most = (
                self.rng.randint(1, self.knobs.max_messages)
                if self.rng.random() < 0.3
                else self.knobs.max_messages
            )
            inv = self.rng.choice(self.knobs.invisible_ms)
            c.receives += 1
            aid = f"{c.name}-{c.receives}" if c.plan.config.fifo else None
        a = c.attempt = self._next_attempt()
        self.sim.trace(f"pop {c.name} receive {topic} max={most} inv={inv} aid={aid}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":  # checked even when late: the master handed them out
                got = self.checker.delivered(c.name, c.plan, topic, inv, payload)
                self.sim.stats["pop delivered"] += len(got)
                self.sim.stats["pop redelivered"] += sum(1 for _, _, n, _ in got if n > 1)
                if a == c.attempt:
                    c.held += [self._work(k, topic, hd, e, n, inv) for k, e, n, hd in got]
            if a != c.attempt:
                return
            c.attempt = 0
            self.sim.trace(
                f"pop {c.name} receive {kind} {len(payload) if kind == 'ok' else payload}"
            )
            self.sim.stats[f"pop receive {kind}"] += 1
            if kind == "ok":
                c.retry = None
            elif kind == "unknown" and aid is not None:
                c.retry = (topic, aid, most, inv)
            elif kind == "refused":
                view = self.sim._master_view()
                if view is not None and topic not in view.meta.topics:
                    c.retry = None  # its topic is gone: nothing to ask again
            if kind == "ok" and payload:
                self._soon(c)
            else:
                self._idle(c)

        def receive(bn: BrokerNode) -> Coroutine[Any, Any, Any]:
            return bn.pop.receive(
                _made,
                c.plan.name,
                topic,
                max_messages=most,
                invisible_ms=inv,
                wait_ms=0,
                tags=c.plan.tags,
                attempt_id=aid,
            )

        if not self._send("pop receive", receive, reply):
            c.attempt = 0
            self._idle(c)

    def _settled(self, c: PopConsumer, a: int, kind: str, back: list[Holding]) -> bool:
        """The common end of an ack, nack or change: False for a late reply. A refused
        request is tried again (its handles back in hand); after an unknown outcome the
        consumer lets its messages go (they come back if it did not apply)."""
        if a != c.attempt:
            return False
        c.attempt = 0
        if kind == "refused":
            for h in back:
                h.act_at = self.sim.now_ms + self.rng.randint(5, 50)
            c.held += back
        self._soon(c)
        return True

    def _ack(self, c: PopConsumer, batch: list[Holding]) -> None:
        for h in batch:
            c.held.remove(h)
        topic = batch[0].topic
        a = c.attempt = self._next_attempt()
        self.sim.trace(f"pop {c.name} ack {[_name(h.key) for h in batch]}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":
                for h, held in zip(batch, payload, strict=True):
                    if held:
                        self.checker.acked(c.name, h.key, h.epoch)
                    self.sim.stats["pop acked" if held else "pop acks of stale handles"] += 1
            if self._settled(c, a, kind, batch):
                self.sim.trace(f"pop {c.name} ack {kind} {payload}")

        handles = [h.handle for h in batch]
        if not self._send("pop ack", lambda bn: bn.pop.ack(c.plan.name, topic, handles), reply):
            c.attempt = 0
            c.held += batch
            self._idle(c)

    def _nack(self, c: PopConsumer, h: Holding) -> None:
        c.held.remove(h)
        delay = self.rng.choice((None, 0, 30))
        wait = c.plan.config.retry.delay(h.attempt) if delay is None else delay
        at = self.sim.clock() + wait
        self.checker.released(h.key, h.epoch, at, at)
        a = c.attempt = self._next_attempt()
        self.sim.trace(f"pop {c.name} nack {_name(h.key)} delay={delay}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":
                self.sim.stats["pop nacked" if payload[0] else "pop acks of stale handles"] += 1
            if self._settled(c, a, kind, [h]):
                self.sim.trace(f"pop {c.name} nack {kind} {payload}")

        def nack(bn: BrokerNode) -> Coroutine[Any, Any, Any]:
            return bn.pop.nack(c.plan.name, h.topic, [h.handle], delay)

        if not self._send("pop nack", nack, reply):
            c.attempt = 0
            c.held.append(h)
            self._idle(c)

    def _change(self, c: PopConsumer, h: Holding) -> None:
        c.held.remove(h)
        inv = self.rng.choice((0, 100, 500))
        at = self.sim.clock() + inv
        self.checker.released(h.key, h.epoch, at, at + c.plan.config.retry.delay(h.attempt))
        a = c.attempt = self._next_attempt()
        self.sim.trace(f"pop {c.name} invisible {_name(h.key)} {inv} ms")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":
                new = self.checker.changed(c.name, h.key, h.epoch, inv, payload)
                self.sim.stats["pop invisible times changed"] += 1
                if a == c.attempt:
                    later = self._work(
                        h.key, h.topic, payload.receipt_handle, new, h.attempt, max(inv, 100)
                    )
                    if later.plan == "change":
                        later.plan = "ack"
                    c.held.append(later)
            if self._settled(c, a, kind, []):  # refused: stale (or no master): let it go
                self.sim.trace(f"pop {c.name} invisible {kind} {payload}")

        def change(bn: BrokerNode) -> Coroutine[Any, Any, Any]:
            return bn.pop.change_invisible(c.plan.name, h.topic, h.handle, inv)

        if not self._send("pop invisible", change, reply):
            c.attempt = 0
            c.held.append(h)
            self._idle(c)
