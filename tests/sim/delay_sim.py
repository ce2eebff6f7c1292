"""Delay messages on the broker simulation (issue 29): seeded producers schedule delay
messages through the master's real ``Timers`` (``broker/timers/service.py``) and recall
some, every node runs the release loop (``Timers.step``, the one ``Timers.run`` turns)
on the simulated clock, through crashes, partitions, failovers, retention and installs,
and ``DelayChecker`` checks the committed log and every replica's ``TimerState`` after
every event.

The workload (``DelayKnobs``, from a stream of the seed's own, so a seed drawn without
delay messages runs as it did before): one or two producers send batches of delay
messages (in a producer session, retried with it until acknowledged) while the faults
go on (and after them until each sent ``MIN_BATCHES``), each due now (or at a time
already past), soon, or up to ``MAX_DELAY_MS`` later, some pinned to a queue or with a
sharding key (a batch refused for a queue its topic no longer has, made again with
fewer, is sent again unpinned); a client recalls some acknowledged ones, well before
their time, around it, or after it, and now and then asks again. The near window
(``timer_window_ms``) is short in most seeds, so timers wait in the log and a refill
reads them from the timer queue. The release loop (``TimerLoop``) runs on every
node as ``Timers.run`` does: a turn when the first timer in the heap falls due, when
woken (a timer scheduled earlier, a cancel), after ``IDLE_S`` or after ``RETRY_S``.

What is checked, against the committed log (``LogModel`` hands each timer record, copy
and timer operation to ``DelayChecker`` in commit order; the entries are the same on
every replica, which the model checks):

- a timer's record holds what was sent: its time is the one asked, or (a time past)
  at most the record's store time;
- a copy (a record carrying ``TIMER_ORIGIN``) delivers a timer scheduled before it,
  with its message (body), its time (``TIMER_DELIVER_MS``), into its topic and pinned
  queue, and is stored (the master's stamp) never before that time;
- each timer has at most one copy, and none once a cancel or drop ended it: a recall
  that applied first leaves no copy, and a recall after the copy changes nothing;
- a drop ends only a timer whose topic was deleted since it was scheduled (perhaps made
  again by now: the master saw it gone);
- answers: a scheduled message's recall handle names the timer holding it, with its
  time; two answers for one batch agree; a recall answered "recalled" (200) found its
  timer ended by a cancel, one answered ``ALREADY_DELIVERED`` by its copy (or a drop);
  a recall of an acknowledged message is never "not found";
- replicas: every node's ``TimerState`` is the same at the same applied index, and
  counts what the log holds up to it (scheduled, delivered, cancelled, dropped,
  pending);
- the release loop never spins: a turn that released nothing does not ask for another
  at once, again and again, at the same simulated time;
- after healing, within ``DELAY_DONE_WITHIN_MS`` ("liveness: delay"), every timer is
  done and every batch acknowledged; in the end every timer was delivered exactly once,
  or cancelled, or dropped.
"""

from __future__ import annotations

import bisect
import functools
import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from broker.errors import AlreadyDeliveredError, InvalidArgumentError, RecallHandleNotFoundError
from broker.message import StoredMessage
from broker.produce import NewMessage
from broker.timers.applier import PROP_TIMER_DELIVER_MS, PROP_TIMER_ORIGIN
from broker.timers.service import IDLE_S, RETRY_S, parse_recall_handle
from broker.timers.state import STATS, TimerState

from .clients import Batch, ProducerClient, SameAtIndex, SideClients, user_topics

if TYPE_CHECKING:
    from .broker_sim import BrokerNode, BrokerSimulation, LogModel
    from .sim import SimNode

DELAY_CHANCE = 0.25  # of the seeds run delay messages (drawn from the seed's "delay" stream)
DELAY_DONE_WITHIN_MS = 10_000  # after healing: every timer done, every batch acknowledged
MAX_DELAY_MS = 2_500  # the latest time a message asks for, from when it is first sent
SPIN_TURNS = 100  # turns in a row at one simulated ms that release nothing: a spin
MIN_BATCHES = 3  # a producer sends this many batches at least (after the faults if need be)
MAX_RECALL_TRIES = 1_000  # a bound on one recall's retries (liveness fails long before)

Answer = tuple[int, str, int]  # (commitlog offset, recall handle, deliver_at_ms)
QUEUE_GONE = "queue gone"  # a produce refused: a pinned queue its topic has not (any more)


def deliver_ms_of(m: StoredMessage) -> int:
    """A timer record's (or copy's) time, 0 when it has none."""
    raw = m.properties.get(PROP_TIMER_DELIVER_MS, "")
    return int(raw) if raw.isdigit() else 0


# ---- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DelayKnobs:
    producers: int
    batch_max: int
    produce_every_ms: tuple[int, int]
    delays: tuple[int, int, int, int]  # weights: past or now, soon, later, latest
    recall: float  # the chance an acknowledged message is recalled
    pin: float  # the chance a message is pinned to a queue (as many have a sharding key)
    window_ms: int  # ``timer_window_ms``: short, so refills read timers from the log

    @classmethod
    def from_seed(cls, seed: int) -> DelayKnobs | None:
        """None for a seed without delay messages (most: their runs stay as they were)."""
        rng = random.Random(f"{seed}/delay")
        if rng.random() >= DELAY_CHANCE:
            return None
        return cls(
            producers=rng.randint(1, 2),
            batch_max=rng.choice((1, 2, 4)),
            produce_every_ms=(rng.choice((10, 40)), rng.choice((100, 300))),
            delays=rng.choice(((1, 2, 4, 3), (2, 4, 2, 1), (0, 1, 3, 6))),
            recall=rng.choice((0.1, 0.3, 0.5)),
            pin=rng.choice((0.0, 0.2, 0.4)),
            window_ms=rng.choice((150, 400, 1000, 60_000)),
        )


@dataclass(slots=True)
class Recall:
    timer: int
    handle: str
    repeat: bool  # ask again once answered (a repeat answers the same)
    answer: str | None = None  # the first one
    attempt: int = 0
    tries: int = 0


# ---- what the log says ------------------------------------------------------------------------


@dataclass(slots=True)
class Timer:
    key: str  # the message's "producer|seq|index"
    index: int  # its record's entry
    record: int  # its record's commitlog offset
    deliver_ms: int
    topic: str
    queue_id: int | None  # pinned
    tags: str | None
    stored: tuple[int, int]  # its record's (term, store time)
    ended: tuple[str, int] | None = None  # (delivered | cancelled | dropped, entry index)
    copies: list[int] = field(default_factory=list)  # entries


class DelayChecker:
    """The delay-message invariants (module docstring), from the log and the answers."""

    def __init__(self, sim: BrokerSimulation, model: LogModel, knobs: DelayKnobs | None) -> None:
        self.sim = sim
        self.model = model
        self.on = knobs is not None
        self.window_ms = 0 if knobs is None else knobs.window_ms
        self.requested: dict[str, int] = {}  # key -> the deliver_at_ms sent
        self.timers: list[Timer] = []  # by timer (the record's queue offset)
        self.ends: dict[str, list[int]] = {k: [] for k in STATS}  # entries, in log order
        self.answers: dict[tuple[str, int], list[Answer]] = {}
        self.recalls: dict[int, str] = {}  # timer -> the first recall answer
        self.replicas = SameAtIndex()

    def fail(self, what: str) -> None:
        self.sim.checker.fail(f"delay: {what}")

    # ---- fed by the log model, in commit order ---------------------------------------------

    def log_scheduled(self, index: int, m: StoredMessage, key: str, timer: int) -> None:
        """A committed record of the timer topic: timer ``timer`` scheduled."""
        if timer != len(self.timers):
            self.fail(f"entry {index}: timer {timer} scheduled after {len(self.timers)} timers")
        at, asked = deliver_ms_of(m), self.requested.get(key)
        if asked is None or not (at == asked or asked < at <= m.store_timestamp):
            self.fail(
                f"entry {index}: timer {timer} of {key} at {at}, asked {asked} "
                f"(stored at {m.store_timestamp})"
            )
        qid = m.properties.get("REAL_QID")
        self.timers.append(
            Timer(
                key,
                index,
                m.physical_offset,
                at,
                m.properties.get("REAL_TOPIC", ""),
                None if qid is None else int(qid),
                m.properties.get("TAGS"),
                (self.model.term, m.store_timestamp),
            )
        )
        self.ends["scheduled"].append(index)

    def _timer(self, index: int, what: str, timer: int) -> Timer | None:
        if not 0 <= timer < len(self.timers):
            self.fail(f"entry {index}: {what} of timer {timer}, never scheduled")
            return None
        return self.timers[timer]

    def _end(self, t: Timer, how: str, index: int) -> None:
        if t.ended is None:
            t.ended = (how, index)
            self.ends[how].append(index)

    def log_copy(self, index: int, m: StoredMessage, key: str) -> None:
        """A committed copy (it carries ``TIMER_ORIGIN``): a delivery, checked."""
        timer = int(m.properties[PROP_TIMER_ORIGIN])
        t = self._timer(index, "a copy", timer)
        if t is None:
            return
        where = f"entry {index}, the copy of timer {timer} ({t.key} at {t.deliver_ms})"
        if key != t.key:
            self.fail(f"{where} holds {key}")
        if (m.topic, deliver_ms_of(m), m.properties.get("TAGS")) != (t.topic, t.deliver_ms, t.tags):
            self.fail(
                f"{where} goes to {m.topic} at {deliver_ms_of(m)} with tags "
                f"{m.properties.get('TAGS')!r}, not {t.topic} at {t.deliver_ms} with {t.tags!r}"
            )
        if t.queue_id is not None and m.queue_id != t.queue_id:
            self.fail(f"{where} is in queue {m.queue_id}, pinned to {t.queue_id}")
        if m.store_timestamp < t.deliver_ms:
            self.fail(f"{where} stored at {m.store_timestamp}, before its time")
        if t.copies:
            self.fail(f"{where}: delivered twice (first at entry {t.copies[0]})")
        if t.ended is not None and t.ended[0] != "delivered":
            self.fail(f"{where}: delivered after it was {t.ended[0]} at entry {t.ended[1]}")
        if self.recalls.get(timer) == "recalled":
            self.fail(f"{where}: delivered after its recall was answered OK")
        t.copies.append(index)
        self._end(t, "delivered", index)
        stats = self.sim.stats
        stats["delay delivered"] += 1
        stats["delay delivered late (ms)"] += m.store_timestamp - t.deliver_ms
        stats["delay delivered by a new master"] += self.model.term > t.stored[0]
        stats["delay delivered beyond the window"] += t.deliver_ms - t.stored[1] > self.window_ms

    def log_op(self, index: int, op: dict[str, Any]) -> None:
        """A committed ``timer.*`` operation."""
        kind = str(op["op"])
        t = self._timer(index, kind, int(op["timer"]))
        if t is None:
            return
        if kind == "timer.cancel":
            self._end(t, "cancelled", index)
        elif kind == "timer.drop":
            now = self.model.current(t.topic)
            if now is not None and now is self.model.topic_before(t.topic, t.index):
                self.fail(f"entry {index} drops timer {op['timer']} of {t.topic}, never deleted")
            self._end(t, "dropped", index)
            self.sim.stats["delay dropped"] += 1
        else:
            self.fail(f"entry {index}: unknown timer operation {kind!r}")

    # ---- the clients' answers ----------------------------------------------------------------

    def scheduled(self, pid: str, seq: int, answer: list[Answer]) -> None:
        """A delay produce answered OK (perhaps late): each result names its timer."""
        first = self.answers.setdefault((pid, seq), answer)
        if first != answer:
            self.fail(f"producer {pid} seq {seq} answered {first} and later {answer}")
        for k, (clo, handle, at) in enumerate(answer):
            key = f"{pid}|{seq}|{k}"
            timer = parse_recall_handle(handle)
            t = None if timer is None or timer >= len(self.timers) else self.timers[timer]
            if t is None or (t.key, t.record, t.deliver_ms) != (key, clo, at):
                self.fail(f"{key} answered as {(clo, handle, at)}, the log has {t}")

    def recalled(self, timer: int, answer: str) -> None:
        """A recall of ``timer`` answered: "recalled" (200), "delivered" (409) or "not
        found" (404)."""
        t = self.timers[timer]
        first = self.recalls.setdefault(timer, answer)
        where = f"the recall of timer {timer} ({t.key} at {t.deliver_ms}) answered {answer}"
        if first != answer:
            self.fail(f"{where}, first {first}")
        if answer == "not found":
            self.fail(where)
        ended = t.ended[0] if t.ended is not None else None
        if (answer == "recalled") != (ended == "cancelled") or ended is None:
            self.fail(f"{where}; the log {'has it ' + ended if ended else 'does not end it'}")
        self.sim.stats[f"delay recalls answered {answer}"] += 1

    # ---- replicas -----------------------------------------------------------------------------

    def check_replica(self, node_id: str, applied: int, state: TimerState) -> None:
        """Every node's timer state is the same at the same applied index, and counts
        what the log holds up to there."""
        if not self.on:
            return
        other = self.replicas.differs(node_id, applied, state.to_json())
        if other is not None:
            self.fail(f"{node_id}'s timers at applied index {applied} differ from {other}'s")
        want = {k: bisect.bisect_right(v, applied) for k, v in self.ends.items()}
        pending = want["scheduled"] - want["delivered"] - want["cancelled"] - want["dropped"]
        if (state.stats, state.end, state.pending) != (want, want["scheduled"], pending):
            self.fail(
                f"{node_id}'s timers at applied index {applied}: {state.stats}, end "
                f"{state.end}, {state.pending} pending; the log: {want}, {pending} pending"
            )

    # ---- liveness and the end ------------------------------------------------------------------

    def pending(self, bn: BrokerNode | None) -> list[int]:
        """Timers not done in ``bn``'s state (``[-1]`` without a master)."""
        if not self.on:
            return []
        if bn is None:
            return [-1]
        s = bn.meta.timers
        return [t for t in range(s.floor, s.end) if not s.is_done(t)]

    def final(self) -> None:
        """After convergence: every timer delivered exactly once, or cancelled, or
        dropped (with no copy)."""
        if not self.on:
            return  # (no stats: a seed without delay messages traces as before)
        for timer, t in enumerate(self.timers):
            if t.ended is None:
                self.fail(f"timer {timer} ({t.key} at {t.deliver_ms}) never ended")
            elif (t.ended[0] == "delivered") != bool(t.copies):
                self.fail(f"timer {timer} ({t.key}) {t.ended[0]}, copies at {t.copies}")
        self.sim.stats["delay timers"] = len(self.timers)
        for how in ("cancelled", "dropped"):
            self.sim.stats[f"delay {how}"] = len(self.ends[how])


# ---- the clients ------------------------------------------------------------------------------


class DelayWorkload(SideClients):
    """The delay producers and the recalling client of one run; their draws come from a
    stream of their own."""

    def __init__(self, sim: BrokerSimulation, knobs: DelayKnobs, checker: DelayChecker) -> None:
        super().__init__(sim, f"{sim.seed}/delay-events")
        self.knobs = knobs
        self.checker = checker
        self.producers = [ProducerClient(f"d{i}") for i in range(knobs.producers)]
        self.recalls: list[Recall] = []  # asked and not answered yet (or to ask again)

    def start(self) -> None:
        for p in self.producers:
            self._later(1, 50, f"delay {p.pid}", functools.partial(self._produce, p))

    def busy(self) -> bool:
        """Not converged: a batch or a recall not answered, a timer not done."""
        return (
            any(p.batch is not None for p in self.producers)
            or bool(self.recalls)
            or bool(self.checker.pending(self.sim._master_view()))
        )

    # ---- producing ---------------------------------------------------------------------------

    def _deliver_at(self) -> int:
        r = self.rng
        kind = r.choices(range(4), self.knobs.delays)[0]
        delay = (
            r.choice((-50, 0)),
            r.randint(1, 100),
            r.randint(100, 1000),
            r.randint(1000, MAX_DELAY_MS),
        )[kind]
        return self.sim.clock() + delay

    def _new_batch(self, p: ProducerClient, topic: str, queues: int) -> Batch:
        r, msgs = self.rng, []
        for k in range(r.randint(1, self.knobs.batch_max)):
            key = f"{p.pid}|{p.next_seq}|{k}"
            at = self._deliver_at()
            pin = r.random()
            msgs.append(
                NewMessage(
                    body=f"{key}|".encode() + b"y" * r.randint(0, 200),
                    tags=r.choice((None, "a", "b")),
                    keys=tuple(f"k{r.randint(0, 30)}" for _ in range(r.randint(0, 1))),
                    queue_id=r.randrange(queues) if pin < self.knobs.pin else None,
                    sharding_key=f"s{r.randint(0, 5)}"
                    if self.knobs.pin <= pin < 2 * self.knobs.pin
                    else None,
                    deliver_at_ms=at,
                )
            )
            self.sim.model.sent.add(key)
            self.checker.requested[key] = at
        b = Batch(p.pid, p.next_seq, topic, msgs)
        p.next_seq += 1
        return b

    def _produce(self, p: ProducerClient) -> None:
        if p.attempt:
            return  # its reply or time-out goes on
        if p.batch is None:
            if not (self.sim.faults_on or (self.sim.workload_on and p.next_seq < MIN_BATCHES)):
                return  # new delay messages while the faults go on (and a few at least)
            view = self.sim._master_view()
            topics = [] if view is None else user_topics(view)
            if view is None or not topics:
                self._later(20, 100, f"delay {p.pid}", lambda: self._produce(p))
                return
            topic = self.rng.choice(topics)
            p.batch = self._new_batch(p, topic, view.meta.topics[topic].queues)
        b = p.batch
        b.attempts += 1
        a = p.attempt = self._next_attempt()
        self.sim.trace(f"delay produce {b.pid} seq={b.seq} #{b.attempts} {b.topic}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok" and payload != QUEUE_GONE:
                self.checker.scheduled(b.pid, b.seq, payload)
            if a != p.attempt:
                return  # a late answer to an attempt the client gave up on
            p.attempt = 0
            self.sim.stats[f"delay produce {kind}"] += 1
            if payload == QUEUE_GONE:  # (refused: its topic was made again with fewer)
                self.sim.stats["delay produces refused a pinned queue"] += 1
                b.messages = [replace(m, queue_id=None) for m in b.messages]
            if kind != "ok" or payload == QUEUE_GONE:
                self.sim.trace(f"delay produce {b.pid} seq={b.seq} {kind} {payload}")
                self._later(10, 150, f"delay {p.pid}", lambda: self._produce(p))
                return
            p.batch = None
            for _clo, handle, at in payload:
                if self.rng.random() < self.knobs.recall:
                    self._plan_recall(handle, at)
            self._later(*self.knobs.produce_every_ms, f"delay {p.pid}", lambda: self._produce(p))

        async def produce(bn: BrokerNode) -> list[Answer] | str:
            try:
                rs = await bn.timers.produce(b.topic, b.messages, b.pid, b.seq)
            except InvalidArgumentError as e:
                if "is not in 0.." not in e.message:
                    raise
                return QUEUE_GONE  # (any other refusal of what no node takes fails the seed)
            return [(r.commitlog_offset, r.recall_handle, r.deliver_at_ms) for r in rs]

        if not self._send("delay produce", produce, reply):
            p.attempt = 0
            self._later(20, 100, f"delay {p.pid}", lambda: self._produce(p))

    # ---- recalling ---------------------------------------------------------------------------

    def _plan_recall(self, handle: str, at: int) -> None:
        """Recall a message well before its time, around it, or after it."""
        r = self.rng
        when = at + r.choice((-r.randint(100, 1000), r.randint(-30, 30), r.randint(1, 300)))
        timer = parse_recall_handle(handle)
        assert timer is not None
        c = Recall(timer, handle, repeat=r.random() < 0.2)
        after = max(1, when - self.sim.clock())
        self.sim.at(self.sim.now_ms + after, "delay recall", lambda: self._recall(c))

    def _recall(self, c: Recall) -> None:
        if c.attempt:
            return
        if c not in self.recalls:
            self.recalls.append(c)
        c.tries += 1
        if c.tries > MAX_RECALL_TRIES:
            self.checker.fail(f"the recall of timer {c.timer}: {c.tries} tries")
        a = c.attempt = self._next_attempt()
        self.sim.trace(f"delay recall {c.handle} #{c.tries}")

        def reply(kind: str, payload: Any) -> None:
            if kind == "ok":
                self.checker.recalled(c.timer, payload)
            if a != c.attempt:
                return
            c.attempt = 0
            self.sim.trace(f"delay recall {c.handle} {kind} {payload}")
            if kind != "ok":
                self._later(10, 150, "delay recall", lambda: self._recall(c))
            elif c.answer is None and c.repeat:
                c.answer = payload
                self.sim.stats["delay recalls asked again"] += 1
                self._later(1, 300, "delay recall", lambda: self._recall(c))
            else:
                self.recalls.remove(c)

        async def recall(bn: BrokerNode) -> str:  # (as the route: its topic, then cancel)
            try:
                await bn.timers.topic_of(c.handle)
                await bn.timers.cancel(c.handle)
            except AlreadyDeliveredError:
                return "delivered"
            except RecallHandleNotFoundError:
                return "not found"
            return "recalled"

        if not self._send("delay recall", recall, reply):
            c.attempt = 0
            self._later(20, 100, "delay recall", lambda: self._recall(c))


# ---- the release loop -------------------------------------------------------------------------


class TimerLoop:
    """``Timers.run`` of one broker incarnation on the simulation's events: each turn is
    the real ``Timers.step``, run as a task of the node (``BrokerSimulation._serve``: a
    crash ends it, a pause holds it); the next turn comes when the first timer in the
    heap falls due (at most ``IDLE_S`` later) or when the node's ``Wake`` is set while
    the loop waits, at once after a release, ``RETRY_S`` after a failed one."""

    def __init__(self, sim: BrokerSimulation, n: SimNode, bn: BrokerNode) -> None:
        self.sim, self.n, self.bn = sim, n, bn
        self.turn = 0  # the turn scheduled now: an older one is void
        self.waiting = False  # between turns: a wake starts the next one at once
        self.idle = (0, 0)  # (ms, turns there in a row that released nothing and go on)
        bn.wake.on_set = self._woken

    def start(self) -> None:
        self._next(0, wakeable=False)

    def _gone(self) -> bool:
        return self.sim.brokers.get(self.n.node_id) is not self.bn

    def _next(self, after_ms: int, *, wakeable: bool) -> None:
        self.turn += 1
        turn, self.waiting = self.turn, wakeable
        self.sim.at(
            self.sim.now_ms + after_ms, f"timers {self.n.node_id}", lambda: self._turn(turn)
        )

    def _woken(self) -> None:
        if self.waiting and not self._gone():
            self._next(0, wakeable=False)

    def _turn(self, turn: int) -> None:
        if turn != self.turn or self._gone():
            return
        self.waiting = False
        if self.n.paused:
            self.bn.held.append((lambda: self._turn(turn), _ignore))
            return
        timers = self.bn.timers
        done = functools.partial(self._ended, timers.released)
        self.sim._serve(self.n, self.bn, "timers", timers.step(), done, lambda wait: wait)

    def _ended(self, released: int, kind: str, wait: Any) -> None:
        if self._gone():
            return  # the node crashed: the loop died with it
        node, now = self.n.node_id, self.sim.now_ms
        more = self.bn.timers.released - released
        if more:
            self.sim.trace(f"timers {node} released {more}")
        if kind != "ok":
            self.sim.trace(f"timers {node} {kind}: {wait}")
            self.sim.stats["delay releases failed"] += 1
            self._next(round(RETRY_S * 1000), wakeable=False)
            return
        if wait == 0:
            if not more:
                turns = self.idle[1] + 1 if self.idle[0] == now else 1
                self.idle = (now, turns)
                if turns >= SPIN_TURNS:
                    self.sim.checker.fail(
                        f"delay: the release loop on {node} ({self.bn.role.value}) turned "
                        f"{turns} times at {now} ms releasing nothing: it spins"
                    )
            self._next(0, wakeable=False)
            return
        idle_ms = round(IDLE_S * 1000)
        self._next(idle_ms if wait is None else min(idle_ms, round(wait * 1000)), wakeable=True)


def _ignore(kind: str, payload: Any) -> None:
    """The reply of a turn held while its node is paused (its own reply comes later)."""
