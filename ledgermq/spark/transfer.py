"""The Spark source's traffic with the brokers: queue bounds, offsets by time, reading a
queue range as Arrow record batches, producing chunks under a producer session, group
commits. No Spark here: ``ledgermq.client`` does the HTTP, failover and bounded retries.

Which node answers:
- planning (``queue_bounds``, ``offsets_for_times``) asks *every* broker of the list and
  takes, per queue, the largest answer. A node's queues hold only committed, dispatched
  messages, so no node overstates; the largest answer is the freshest (what a client that
  just produced expects to read), and nodes that do not answer are skipped;
- reading (``read_range``) goes to whichever node the client's rotation picks, so the
  tasks of a job spread over the cluster. A node that does not hold the planned range yet
  (a follower behind the master) is long-polled and, pull by pull, the others are tried,
  until ``read_timeout_ms`` passes without progress;
- writes go to the master (the client finds it and follows redirects).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa

from ledgermq.client import (
    Admin,
    InvalidArgumentError,
    LedgerMQError,
    Producer,
    SequenceTooOldError,
    TopicNotFoundError,
)

from .offsets import QueueRange, data_lost, plan_ranges, resolve
from .options import Connection, ReadOptions
from .pages import from_received, from_stream
from .produce import chunk_messages, messages_from_batch
from .pull import Puller

log = logging.getLogger(__name__)

PLANNING_ATTEMPTS_PER_NODE = 3
# The prefetching thread and its consumer look up from a blocked handoff this often (to
# notice that the other side stopped), and a stopped helper is waited for this long.
HANDOFF_POLL_S = 0.1
HELPER_JOIN_S = 30.0
# A pull that finds nothing yet is held this long by the broker (long polling) before the
# reader asks again, possibly another node.
LAGGING_WAIT_MS = 1000


class SourceError(RuntimeError):
    """The brokers cannot serve what the source needs (the message says what and where)."""


# ---- planning ---------------------------------------------------------------------------------


def _each_broker(conn: Connection, op: Callable[[Admin], Any], what: str) -> list[Any]:
    """``op`` against every broker of the list on its own; the answers of those that
    answered. None answering is ``SourceError`` naming each one's error."""
    answers, errors = [], []
    # One node among several: a node that does not answer is given up on quickly (a
    # couple of tries), since the others are asked too.
    settings = replace(
        conn.client_settings(),
        max_attempts=min(conn.max_attempts, PLANNING_ATTEMPTS_PER_NODE),
        backoff_cap_s=0.5,
    )
    for url in conn.brokers:
        try:
            with Admin([url], settings=settings) as admin:
                answers.append(op(admin))
        except TopicNotFoundError as e:
            errors.append(f"{url}: {e.code} {e}")  # this node may not know it *yet*
        except LedgerMQError as e:
            if e.status is not None and 400 <= e.status < 500 and e.status not in (408, 429):
                raise SourceError(f"{what}: {url} answered {e.code}: {e}") from None
            errors.append(f"{url}: {e.code} {e}")
    if not answers:
        raise SourceError(f"{what}: no broker answered ({'; '.join(errors)})")
    return answers


def queue_bounds(
    conn: Connection, topic: str, queue_ids: Sequence[int] | None
) -> dict[int, tuple[int, int]]:
    """queue → (min offset, max offset) for the queues read (all, or ``queue_ids``)."""
    answers = _each_broker(conn, lambda a: a.describe_topic(topic), f"describe topic {topic}")
    counts = {len(d.queues) for d in answers}
    if len(counts) != 1:
        # A topic deleted and created again with another queue count, mid-flight.
        raise SourceError(f"topic {topic}: brokers disagree on its queue count {sorted(counts)}")
    bounds: dict[int, tuple[int, int]] = {}
    for d in answers:
        for q in d.queues:
            lo, hi = bounds.get(q.queue_id, (0, 0))
            bounds[q.queue_id] = (max(lo, q.min_offset), max(hi, q.max_offset))
    if queue_ids is None:
        return dict(sorted(bounds.items()))
    missing = sorted(set(queue_ids) - set(bounds))
    if missing:
        raise SourceError(f"topic {topic} has queues 0..{len(bounds) - 1}, not {missing}")
    return {q: bounds[q] for q in queue_ids}


def offsets_for_times(conn: Connection, topic: str, stamps: Mapping[int, int]) -> dict[int, int]:
    """queue → the first offset stored at or after its time (the largest answer: see the
    module docstring)."""
    if not stamps:
        return {}

    def ask(admin: Admin) -> dict[int, int]:
        return {q: admin.offset_for_timestamp(topic, q, ts) for q, ts in stamps.items()}

    answers = _each_broker(conn, ask, f"offsets by time in {topic}")
    return {q: max(a[q] for a in answers) for q in stamps}


def commit_group(conn: Connection, group: str, topic: str, offsets: Mapping[int, int]) -> bool:
    """Commit a group's offsets (informational: the checkpoint is the truth); a failure is
    logged, not raised."""
    if not offsets:
        return True
    try:
        with Admin(list(conn.brokers), settings=conn.client_settings()) as admin:
            admin.commit_offsets(group, topic, offsets)
    except LedgerMQError as e:
        log.warning("group %s: committing %s offsets failed: %s %s", group, topic, e.code, e)
        return False
    return True


def plan_batch(opts: ReadOptions) -> list[QueueRange]:
    """A batch read's ranges: the options' offsets resolved against the queues' bounds
    (and the offsets of any timestamps), checked (``offsets.plan_ranges``)."""
    conn, topic = opts.connection, opts.topic
    bounds = queue_bounds(conn, topic, opts.queue_ids)
    queues = list(bounds)
    stamps = {**opts.starting.timestamps_for(queues)}
    start_by_time = offsets_for_times(conn, topic, stamps)
    end_by_time = offsets_for_times(conn, topic, opts.ending.timestamps_for(queues))
    start = resolve(opts.starting, queues, bounds, start_by_time)
    end = resolve(opts.ending, queues, bounds, end_by_time)
    # A time past a queue's last message resolves to its max offset: an empty range.
    end = {q: max(e, min(start[q], bounds[q][1])) for q, e in end.items()}
    return plan_ranges(start, end, bounds, fail_on_data_loss=opts.fail_on_data_loss)


# ---- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadSettings:
    pull_batch_size: int = 10_000
    pull_format: str = "arrow"
    fail_on_data_loss: bool = True
    read_timeout_ms: int = 60_000
    prefetch_pages: int = 1


@dataclass(frozen=True, slots=True)
class _Page:
    status: str
    next_offset: int
    min_offset: int
    count: int
    batches: list[pa.RecordBatch]


def _pull(
    puller: Puller, topic: str, q: int, offset: int, *, n: int, wait_ms: int, fmt: str
) -> _Page:
    try:
        return _pull_page(puller, topic, q, offset, n=n, wait_ms=wait_ms, fmt=fmt)
    except InvalidArgumentError as e:
        if "max_messages" not in str(e):
            raise
        raise SourceError(
            f"a broker refused pages of {n} messages ({e}): set pullBatchSize to its limit"
        ) from None


def _pull_page(
    puller: Puller, topic: str, q: int, offset: int, *, n: int, wait_ms: int, fmt: str
) -> _Page:
    if fmt == "json":
        r = puller.pull(topic, q, offset, n=n, wait_ms=wait_ms)
        batches = [from_received(r.messages)] if r.messages else []
        return _Page(r.status, r.next_offset, r.min_offset, len(r.messages), batches)
    a = puller.pull_arrow(topic, q, offset, n=n, wait_ms=wait_ms)
    batches = from_stream(a.content) if a.count else []
    if sum(b.num_rows for b in batches) != a.count:
        raise SourceError(f"queue {q}: a page said {a.count} messages but held another number")
    return _Page(a.status, a.next_offset, a.min_offset, a.count, batches)


def read_range(
    conn: Connection,
    topic: str,
    r: QueueRange,
    settings: ReadSettings,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[pa.RecordBatch]:
    """The messages ``[r.start, r.end)`` of one queue as record batches, in order, each
    exactly once; pages as the broker sent them (``pull_batch_size`` messages at most),
    pulled up to ``prefetch_pages`` ahead of the caller by a helper thread, so the broker
    works on the next page while Spark takes the last one."""
    with _pooled_puller(conn) as puller:
        pages_ = _found_pages(puller, topic, r, settings, clock)
        for batches in _ahead(pages_, settings.prefetch_pages):
            yield from batches


def _found_pages(
    puller: Puller,
    topic: str,
    r: QueueRange,
    settings: ReadSettings,
    clock: Callable[[], float],
) -> Iterator[list[pa.RecordBatch]]:
    """The batches of each page found in ``[r.start, r.end)``: the pull loop of
    ``read_range`` (data loss, lagging nodes, the read timeout)."""
    offset = r.start
    timeout_s = settings.read_timeout_ms / 1000
    deadline = clock() + timeout_s
    wait_ms = 0
    while offset < r.end:
        n = min(settings.pull_batch_size, r.end - offset)
        page = _pull(
            puller, topic, r.queue_id, offset, n=n, wait_ms=wait_ms, fmt=settings.pull_format
        )
        if page.status == "FOUND":
            if not 0 < page.count <= n or page.next_offset != offset + page.count:
                raise SourceError(
                    f"queue {r.queue_id}: a pull from {offset} of {n} gave {page.count} "
                    f"messages and next offset {page.next_offset}"
                )
            yield page.batches
            offset, wait_ms, deadline = page.next_offset, 0, clock() + timeout_s
        elif page.status == "OFFSET_ILLEGAL" and offset < page.min_offset:
            offset = min(
                r.end,
                data_lost(
                    r.queue_id,
                    offset,
                    page.min_offset,
                    fail_on_data_loss=settings.fail_on_data_loss,
                ),
            )
        elif clock() >= deadline:
            raise SourceError(
                f"queue {r.queue_id} of {topic}: offsets {offset}..{r.end - 1} were planned "
                f"but no broker served them within {settings.read_timeout_ms} ms "
                f"(last answer {page.status}, next offset {page.next_offset})"
            )
        else:
            wait_ms = LAGGING_WAIT_MS  # this node lags: long-poll, then maybe another


T = TypeVar("T")


def _ahead(items: Iterator[T], depth: int) -> Iterator[T]:
    """``items``, produced by a helper thread at most ``depth`` items ahead of the
    consumer (``depth`` 0: in the caller's thread). The helper's error is raised here;
    a consumer that stops early stops the helper at its next item."""
    if depth < 1:
        yield from items
        return
    slots: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                slots.put((kind, value), timeout=HANDOFF_POLL_S)
                return True
        return False

    def run() -> None:
        try:
            for item in items:
                if not put("item", item):
                    return
            put("done", None)
        except BaseException as e:  # handed to the consumer, who raises it
            put("error", e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a generator's clean-up runs in the thread that ran it

    helper = threading.Thread(target=run, name="ledgermq-prefetch", daemon=True)
    helper.start()
    try:
        while True:
            try:
                kind, value = slots.get(timeout=HANDOFF_POLL_S)
            except queue.Empty:
                if not helper.is_alive() and slots.empty():
                    raise SourceError("the prefetching thread ended without a word") from None
                continue
            if kind == "item":
                yield value
            elif kind == "done":
                return
            else:
                raise value
    finally:
        stop.set()
        helper.join(timeout=HELPER_JOIN_S)


# Pullers (with their keep-alive connections and TLS context) are kept per process and
# connection settings: Spark reuses its Python workers from task to task.
_POOL: dict[Connection, list[Puller]] = {}
_POOL_LOCK = threading.Lock()
POOLED_PULLERS_PER_CONNECTION = 4


def close_pool() -> None:
    """Close the pooled pullers' connections (at exit, or when a caller is done)."""
    with _POOL_LOCK:
        pullers = [p for free in _POOL.values() for p in free]
        _POOL.clear()
    for p in pullers:
        p.close()


atexit.register(close_pool)


@contextlib.contextmanager
def _pooled_puller(conn: Connection) -> Iterator[Puller]:
    with _POOL_LOCK:
        free = _POOL.setdefault(conn, [])
        puller = free.pop() if free else None
    if puller is None:
        puller = Puller(list(conn.brokers), conn.client_settings())
    ok = False
    try:
        yield puller
        ok = True
    finally:
        with _POOL_LOCK:
            free = _POOL.setdefault(conn, [])
            keep = ok and len(free) < POOLED_PULLERS_PER_CONNECTION
            if keep:
                free.append(puller)
        if not keep:
            puller.close()


# ---- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProduceReport:
    acknowledged: int = 0  # messages the broker answered with their results
    skipped: int = 0  # messages of chunks an earlier attempt of the session had stored


def produce_chunks(
    conn: Connection, topic: str, producer_id: str, chunks: Iterable[list[dict[str, Any]]]
) -> ProduceReport:
    """Send each chunk as one request of the producer session ``producer_id``, chunk k
    with sequence k. A retried task sends the same chunks under the same session: the
    broker answers a chunk it already holds from the session (``SEQUENCE_TOO_OLD`` for an
    earlier one, the original results for the last one) instead of storing it again."""
    acknowledged = skipped = 0
    with Producer(
        list(conn.brokers), settings=conn.client_settings(), producer_id=producer_id
    ) as producer:
        for chunk in chunks:
            try:
                producer.send(topic, chunk)
                acknowledged += len(chunk)
            except SequenceTooOldError:
                skipped += len(chunk)
    return ProduceReport(acknowledged, skipped)


def write_batches(
    conn: Connection,
    topic: str,
    producer_id: str,
    batches: Iterable[pa.RecordBatch],
    *,
    max_messages: int,
    max_bytes: int,
) -> ProduceReport:
    """A task's Arrow batches, produced in chunks under the session ``producer_id``."""

    def messages() -> Iterator[dict[str, Any]]:
        row = 0
        for batch in batches:
            yield from messages_from_batch(batch, row)
            row += batch.num_rows

    chunks = chunk_messages(messages(), max_messages=max_messages, max_bytes=max_bytes)
    return produce_chunks(conn, topic, producer_id, chunks)
