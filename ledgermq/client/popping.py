"""A POP group's consumer (docs/client.md): ``PopOps`` (receive, ack, nack,
extend) and ``PopOps.run``, the loop behind ``PopConsumer.run``, written once. Besides
requests and sleeps the loop yields ``Spawn`` (run the handler on a message) and
``Collect`` (wait for handlers to end, answered with the ``Ended`` ones); the sync
driver performs them with threads, the async one with tasks (``drivers.ThreadWorkers``,
``drivers.TaskWorkers``).

Retries (the exchange's, as for every write): an ack or a nack answered with an unknown
outcome is sent again; a handle the first attempt already settled then answers
``INVALID_RECEIPT_HANDLE``, which changes nothing. A receive carries an ``attempt_id``
(a fresh one per call unless given), and its retries the same one: the master answers a
retry with what the lost attempt handed out while those messages are invisible. What a
lost receive handed out that its retry does not find (the lost attempt was applied only
after the retry looked) stays invisible for ``invisible_ms``, then is delivered again
with ``delivery_attempt`` + 1: nothing is lost, it is late. An extend whose outcome was
lost and that was applied answers ``INVALID_RECEIPT_HANDLE`` on its retry (the handle
changed): ``run`` then stops extending that message, which may go to another consumer
once its invisible time ends while the handler still runs (at least once).

Invariants of ``run``: at most ``concurrency`` handlers run at once, and a receive asks
for no more messages than there are free handlers; a running message's invisible time
is renewed when ``extend_at`` of it has passed (counted from before the request that
set it, so the renewal is early rather than late), and every wait of the loop (a
receive's long poll, a ``Collect``) ends by the next renewal; after ``stop()`` nothing
more is received and the loop ends once the running handlers have ended and been
settled, or after ``stop_timeout_s`` (their messages then come back after their
invisible time).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypedDict, TypeVar

from .consuming import Pacer
from .errors import InvalidReceiptHandleError, LedgerMQError
from .exchange import RECORD_PAGE, Action, Call, Exchange, Gen, Outcome
from .fetch import decode_received
from .operations import api_path
from .types import AckResult, PopMessage, decode_pop_message

T = TypeVar("T")

# Dead letters (broker/pop/applier.py's names; a test keeps them equal): a message whose
# attempts are spent is copied to the ordinary one-queue topic ``dlq_topic(group)`` with
# these properties.
DLQ_PREFIX = "%DLQ%"
DLQ_PROPERTIES = (
    "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_QUEUE_ID",
    "DLQ_ORIGIN_QUEUE_OFFSET",
    "DLQ_ORIGIN_MSG_ID",
    "DELIVERY_ATTEMPTS",
    "POP_EPOCH",
)


def dlq_topic(group: str) -> str:
    """Where a POP group's dead letters go."""
    return DLQ_PREFIX + group


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The limits of ``PopConsumer.run``."""

    concurrency: int = 8  # handlers running at once (threads, or tasks)
    invisible_ms: int = 30_000  # a received message's invisible time, renewed while handled
    extend_at: float = 0.5  # renew once this fraction of the invisible time has passed
    wait_ms: int = 1_000  # a receive's long poll (also how soon stop() ends one)
    batch: int = 32  # messages per receive at most (and no more than free handlers)
    tags: str | None = None  # only these tags: "A||B"
    max_messages: int | None = None  # end after receiving this many
    max_idle_s: float | None = None  # end when nothing arrived for this long
    stop_timeout_s: float = 30.0  # at the end, wait this long for running handlers
    nack_delay_ms: int | None = None  # a failed message goes again after (None: the group's)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.batch < 1 or self.wait_ms < 1 or self.invisible_ms < 1:
            raise ValueError("concurrency, batch, wait_ms and invisible_ms must be >= 1")
        if not 0 < self.extend_at < 1:
            raise ValueError("extend_at is a fraction of the invisible time: 0 < extend_at < 1")
        if self.stop_timeout_s < 0 or (self.nack_delay_ms is not None and self.nack_delay_ms < 0):
            raise ValueError("stop_timeout_s and nack_delay_ms must be >= 0")


class RunOptions(TypedDict, total=False):
    """``RunSettings`` fields as ``run`` keywords."""

    concurrency: int
    invisible_ms: int
    extend_at: float
    wait_ms: int
    batch: int
    tags: str | None
    max_messages: int | None
    max_idle_s: float | None
    stop_timeout_s: float
    nack_delay_ms: int | None


@dataclass(slots=True)
class RunStats:
    """What a ``run`` did so far (``PopConsumer.stats``)."""

    received: int = 0
    acked: int = 0  # the handler returned, the ack held
    nacked: int = 0  # the handler raised, the nack held
    extended: int = 0  # invisible times renewed
    stale: int = 0  # a handle no longer current at an extend, ack or nack: delivered again
    abandoned: int = 0  # handlers still running when the run ended (stop_timeout_s)


@dataclass(frozen=True, slots=True)
class Spawn:
    """Run the handler on ``message`` (a thread, or a task); ``token`` names the run."""

    token: int
    message: PopMessage


@dataclass(frozen=True, slots=True)
class Collect:
    """Wait up to ``timeout_s`` (or until ``stop()``) for handlers to end: answered with
    the ``Ended`` ones, every one that ended by then, maybe none."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class Ended:
    token: int
    error: BaseException | None  # what the handler raised; None: it returned


RunAction: TypeAlias = Action | Spawn | Collect
RunOutcome: TypeAlias = Outcome | list[Ended]
RunGen: TypeAlias = Generator[RunAction, RunOutcome | None, T]


@dataclass(slots=True)
class _Lease:
    """A running handler's message: its current handle and when to renew it."""

    handle: str
    renew_at: float  # the exchange's clock
    stale: bool = False  # the handle was lost: no renewal, no ack


def handle_of(m: PopMessage | str) -> str:
    return m if isinstance(m, str) else m.receipt_handle


def new_attempt_id() -> str:
    return f"r-{uuid.uuid4().hex}"


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class PopOps:
    """Receive, ack, nack and extend for one POP group and topic, and ``run``. Holds no
    state between operations: several may run at once."""

    def __init__(self, ex: Exchange, group: str, topic: str) -> None:
        self.ex = ex
        self.group = group
        self.topic = topic

    def _path(self, action: str) -> str:
        return api_path("groups", self.group, action)

    def receive(
        self,
        max_messages: int = 32,
        invisible_ms: int = 30_000,
        wait_ms: int = 0,
        tags: str | None = None,
        attempt_id: str | None = None,
    ) -> Gen[list[PopMessage]]:
        """Up to ``max_messages`` messages, each invisible to the rest of the group for
        ``invisible_ms``; waits up to ``wait_ms`` for one. Retried under one
        ``attempt_id`` (a fresh one unless given): see the module's docstring."""
        body: dict[str, Any] = {
            "topic": self.topic,
            "max_messages": max_messages,
            "invisible_ms": invisible_ms,
            "wait_ms": wait_ms,
            "attempt_id": attempt_id or new_attempt_id(),
        }
        if tags is not None:
            body["tags"] = tags
        accept = RECORD_PAGE if self.ex.settings.record_pull else None
        call = Call(
            "POST", self._path("receive"), body=body, write=True, wait_ms=wait_ms, accept=accept
        )
        reply = yield from self.ex.exchange(call)
        if reply.headers.get("content-type") == RECORD_PAGE:
            return decode_received(reply.content)
        if reply.body is None:
            raise LedgerMQError(
                "BAD_RECORD_PAGE", f"receive: answered {reply.headers.get('content-type')}"
            )
        return [decode_pop_message(m) for m in reply.body["messages"]]

    def _settle(
        self, action: str, handles: list[str], extra: dict[str, Any]
    ) -> Gen[list[AckResult]]:
        out: list[AckResult] = []
        for chunk in _chunks(handles, self.ex.settings.max_receipt_handles):
            body = {"topic": self.topic, "receipt_handles": chunk, **extra}
            reply = yield from self.ex.write("POST", self._path(action), body)
            out += [
                AckResult(str(r["receipt_handle"]), str(r["status"])) for r in reply.body["results"]
            ]
        return out

    def ack(self, messages: Iterable[PopMessage | str]) -> Gen[list[AckResult]]:
        """Done for the group: each message (or receipt handle) whose handle is current."""
        return (yield from self._settle("ack", [handle_of(m) for m in messages], {}))

    def nack(
        self, messages: Iterable[PopMessage | str], delay_ms: int | None = None
    ) -> Gen[list[AckResult]]:
        """Give messages back: delivered again after ``delay_ms`` (``None``: the group's
        retry delay for the next attempt)."""
        extra = {} if delay_ms is None else {"delay_ms": delay_ms}
        return (yield from self._settle("nack", [handle_of(m) for m in messages], extra))

    def dead_letter(self, messages: Iterable[PopMessage | str]) -> Gen[list[AckResult]]:
        """Copy each message (or receipt handle) whose handle is current into the group's
        dead letters (``dlq_topic(group)``) at once: done for the group, as after its
        last attempt."""
        return (yield from self._settle("dlq", [handle_of(m) for m in messages], {}))

    def extend(self, message: PopMessage | str, invisible_ms: int) -> Gen[str]:
        """The message stays invisible ``invisible_ms`` from now (longer or shorter); its
        new receipt handle (the old one is no longer current).
        ``InvalidReceiptHandleError`` when the handle is not current."""
        body: dict[str, Any] = {
            "topic": self.topic,
            "receipt_handle": handle_of(message),
            "invisible_ms": invisible_ms,
        }
        reply = yield from self.ex.write("POST", self._path("invisible"), body)
        return str(reply.body["receipt_handle"])

    # ---- run ---------------------------------------------------------------------------

    def run(
        self, s: RunSettings, stats: RunStats, stopping: Callable[[], bool]
    ) -> RunGen[RunStats]:
        """Receive and hand each message to a handler (``Spawn``); ack it when the
        handler returns, nack it when it raises, renew its invisible time while it runs.
        Ends when ``stopping()`` says so, after ``max_messages`` or ``max_idle_s`` (no
        message while a handler was free): no more receives, then the running handlers
        are waited for (``stop_timeout_s``). An error the exchange gives up on (after
        its retries, within ``deadline_s``) ends it by raising."""
        clock = self.ex.clock
        pacer = Pacer(clock, s.max_idle_s, s.max_messages, s.wait_ms, s.batch)
        leases: dict[int, _Lease] = {}
        tokens = itertools.count()
        ended: list[Ended] = []
        stop_at: float | None = None
        while True:  # every wait below is bounded; the loop ends as the docstring says
            yield from self._settle_ended(ended, leases, stats, s)
            if ended:
                pacer.busy()  # idle is nothing arriving while handlers wait for work
            yield from self._renew(leases, stats, s)
            # The next look at the handlers: by the next renewal, and every wait_ms.
            renew_in = min(self._renew_in(leases), s.wait_ms / 1000)
            free = s.concurrency - len(leases)
            want = pacer.next_fetch() if free > 0 and stop_at is None else None
            if stop_at is None and (stopping() or (free > 0 and want is None)):
                stop_at = clock() + s.stop_timeout_s
            if stop_at is not None:
                left = stop_at - clock()
                if not leases or left <= 0:
                    stats.abandoned = len(leases)
                    return stats
                ended = yield from self._collect(min(left, renew_in))
                continue
            if want is None:  # every handler is busy
                ended = yield from self._collect(renew_in)
                continue
            sent = clock()
            wait_ms = math.ceil(min(want[1], renew_in * 1000))  # never past a renewal
            got = yield from self.receive(min(want[0], free), s.invisible_ms, wait_ms, s.tags)
            pacer.got(len(got))
            stats.received += len(got)
            for m in got:
                token = next(tokens)
                leases[token] = _Lease(m.receipt_handle, sent + s.invisible_ms * s.extend_at / 1000)
                yield Spawn(token, m)
            ended = yield from self._collect(0)

    @staticmethod
    def _collect(timeout_s: float) -> RunGen[list[Ended]]:
        ended = yield Collect(max(0.0, timeout_s))
        assert isinstance(ended, list), "a driver answers every Collect with a list"
        return ended

    def _renew_in(self, leases: dict[int, _Lease]) -> float:
        """Seconds until the next renewal (infinite with none to renew)."""
        due = [lease.renew_at for lease in leases.values() if not lease.stale]
        return max(0.0, min(due) - self.ex.clock()) if due else math.inf

    def _renew(self, leases: dict[int, _Lease], stats: RunStats, s: RunSettings) -> Gen[None]:
        for lease in leases.values():
            sent = self.ex.clock()
            if lease.stale or lease.renew_at > sent:
                continue
            try:
                lease.handle = yield from self.extend(lease.handle, s.invisible_ms)
            except InvalidReceiptHandleError:
                lease.stale = True  # it goes (or went) to another consumer
                stats.stale += 1
                continue
            lease.renew_at = sent + s.invisible_ms * s.extend_at / 1000
            stats.extended += 1

    def _settle_ended(
        self, ended: list[Ended], leases: dict[int, _Lease], stats: RunStats, s: RunSettings
    ) -> Gen[None]:
        """Ack the messages whose handler returned, nack those whose handler raised."""
        done: list[str] = []
        failed: list[str] = []
        for e in ended:
            lease = leases.pop(e.token)
            if not lease.stale:
                (done if e.error is None else failed).append(lease.handle)
        if done:
            held = sum(r.ok for r in (yield from self.ack(done)))
            stats.acked += held
            stats.stale += len(done) - held
        if failed:
            held = sum(r.ok for r in (yield from self.nack(failed, s.nack_delay_ms)))
            stats.nacked += held
            stats.stale += len(failed) - held
