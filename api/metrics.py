"""``/metrics``: Prometheus text for one node, rendered off the event loop.

prometheus-client (the reference implementation, well kept and dependency-free) renders
the exposition format and keeps the histograms; each app has its own registry so several
nodes in one process (tests) do not share series. Event metrics (latencies, counters) are
recorded as they happen, under prometheus-client's own locks; state metrics (Raft
indexes, queue offsets, consumer lag) are read from the broker when scraped, so they cost
nothing between scrapes.

A scrape must not cost the loop that also runs Raft (issue 32: six concurrent scrapes of
1,000 topics x 8 queues kept the leader silent for 2.67 s). So ``NodeMetrics.render``:

- copies the broker state it needs into plain values **on the loop** (the broker is only
  ever changed there, so no read races a write), ``SNAPSHOT_SLICE`` queues or offset
  tables per turn of the loop (``StateSnapshot.take``): 8,000 queues take ~3 ms in all,
  in eight turns;
- formats the text **in a worker thread** from that copy (``StateSnapshot`` is not
  shared with the loop once taken, and the registry's metrics lock themselves);
- renders **once for concurrent scrapes** and keeps the answer ``cache_s`` (1 s): six
  scrapes at once cost one render.

Each queue's offsets are read as they are at its turn, not all at one instant (as a
scrape always saw a moving log); a topic deleted meanwhile is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.broker import Broker
from broker.status import BrokerStatus

from .version import PYTHON, VERSION

# Seconds, from one fsync'd local append (~1 ms) to a slow quorum (seconds).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

RAFT_ROLES = ("LEADER", "FOLLOWER", "CANDIDATE")
SNAPSHOT_SLICE = 1024  # queues (or a group's offset tables) copied per turn of the loop
METRICS_CACHE_S = 1.0  # a rendered exposition answers the scrapes of this long


class NodeMetrics:
    def __init__(
        self,
        broker: Broker,
        *,
        consumer_lag_series_limit: int = 10_000,
        cache_s: float = METRICS_CACHE_S,
    ) -> None:
        self.broker = broker
        self.lag_limit = consumer_lag_series_limit
        self.cache_s = cache_s
        self.renders = 0  # expositions rendered (the rest of the scrapes used one of them)
        self._cached: tuple[float, bytes] | None = None  # (taken at, loop time; text)
        self._rendering: asyncio.Task[bytes] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.produce_latency = Histogram(
            "ledgermq_produce_latency_seconds",
            "produce request: received to committed and dispatched (append latency)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_latency = Histogram(
            "ledgermq_raft_commit_latency_seconds",
            "Raft proposal to quorum commit, per proposal",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.produced_messages = Counter(
            "ledgermq_produced_messages", "messages produced", ["topic"], registry=r
        )
        self.produced_bytes = Counter(
            "ledgermq_produced_bytes", "message body bytes produced", ["topic"], registry=r
        )
        self.pulled_messages = Counter(
            "ledgermq_pulled_messages", "messages served to consumers", ["topic"], registry=r
        )
        self.pulled_bytes = Counter(
            "ledgermq_pulled_bytes", "message body bytes served", ["topic"], registry=r
        )
        self._per_topic = (
            self.produced_messages,
            self.produced_bytes,
            self.pulled_messages,
            self.pulled_bytes,
        )
        self._counted: set[str] = set()  # topics with per-topic series
        self.errors = Counter("ledgermq_http_errors", "error answers by code", ["code"], registry=r)
        self.long_polls = Gauge(
            "ledgermq_long_polls_waiting", "pull requests parked until data arrives", registry=r
        )
        self.http_dropped = Counter(
            "ledgermq_http_connections_dropped",
            "HTTP connections closed or refused by a connection limit (api/http_protocol.py),"
            " by reason",
            ["reason"],
            registry=r,
        )
        self.http_connections = Gauge(
            "ledgermq_http_connections", "open HTTP connections", registry=r
        )
        Info("ledgermq_build", "this node's LedgerMQ and Python versions", registry=r).info(
            {"version": VERSION, "python": PYTHON}
        )
        # process_start_time_seconds (a restart loop shows as changes of it: the
        # LedgerMQNodeRestarting alert), CPU, memory and open files, from /proc on Linux.
        ProcessCollector(registry=r)
        broker.server.commit_observers.append(lambda s, _n: self.commit_latency.observe(s))

    def count_produced(self, topic: str, messages: int, body_bytes: int) -> None:
        """``messages`` produced into ``topic``, holding ``body_bytes`` of bodies."""
        self._counted.add(topic)
        self.produced_messages.labels(topic).inc(messages)
        self.produced_bytes.labels(topic).inc(body_bytes)

    def count_pulled(self, topic: str, messages: int, body_bytes: int) -> None:
        """``messages`` served to consumers of ``topic`` (pulls, group pulls, key queries),
        holding ``body_bytes`` of bodies."""
        if messages:
            self._counted.add(topic)
            self.pulled_messages.labels(topic).inc(messages)
            self.pulled_bytes.labels(topic).inc(body_bytes)

    def forget_deleted_topics(self) -> int:
        """Drop the per-topic series of topics that no longer exist (a scrape would
        otherwise show every deleted topic for ever: ~530 B a name); how many."""
        gone = [t for t in self._counted if t not in self.broker.meta.topics]
        for t in gone:
            self._counted.discard(t)
            for c in self._per_topic:
                with contextlib.suppress(KeyError):
                    c.remove(t)
        return len(gone)

    async def render(self) -> bytes:
        """The exposition: cached if fresh, else the render under way, else a new one."""
        loop = asyncio.get_running_loop()
        cached = self._cached
        if cached is not None and loop.time() - cached[0] < self.cache_s:
            return cached[1]
        if self._rendering is None:
            self._rendering = loop.create_task(self._render_fresh())
        # Shielded: a scrape that is cancelled does not cancel the others' render.
        return await asyncio.shield(self._rendering)

    async def _render_fresh(self) -> bytes:
        try:
            taken = asyncio.get_running_loop().time()
            self.forget_deleted_topics()
            state = await StateSnapshot.take(self.broker, self.lag_limit)
            text = await asyncio.to_thread(self.render_now, state)
            self._cached = (taken, text)
            return text
        finally:
            self._rendering = None

    def render_now(self, state: StateSnapshot | None) -> bytes:
        """The text of the registry and ``state`` (any thread: it reads no live state)."""
        self.renders += 1
        return generate_latest(_Exposition(self.registry, state))


class _Exposition(Collector):
    """The registry's metrics, then the state gauges of one snapshot."""

    def __init__(self, registry: CollectorRegistry, state: StateSnapshot | None) -> None:
        self.registry = registry
        self.state = state

    def collect(self) -> Iterable[Metric]:
        yield from self.registry.collect()
        if self.state is not None:
            yield from self.state.metrics()


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """What the state gauges show, copied from the broker on the loop."""

    status: BrokerStatus
    is_master: bool
    disk_full: bool  # Broker.disk_full: refusing to write for lack of disk, in any role
    last_failure_at: float | None  # Broker.last_failure_at (Unix s): this node's, or before
    raft_auth_failures: int | None  # None: no transport
    queues: list[tuple[str, int, int, int]] | None  # topic, queue_id, min, max; None: installing
    offsets: list[tuple[str, str, dict[int, int]]]  # group, topic, committed per queue_id
    pop: list[PopGroupTopic]
    timers: tuple[int, dict[str, int]]  # delay messages pending, and the counters
    transactions: tuple[int, dict[str, int]]  # transactions pending, and the counters
    lag_limit: int

    @classmethod
    async def take(cls, b: Broker, lag_limit: int) -> StateSnapshot | None:
        """Copy the state on the loop, yielding to it every ``SNAPSHOT_SLICE`` queues or
        groups; None before the node has started."""
        if b.server.core is None or b.dispatcher is None:
            return None
        transport = b.server.transport
        status = b.status()
        is_master = b.is_master
        disk_full = b.disk_full()
        last_failure_at = b.last_failure_at
        auth_failures = None if transport is None else transport.auth_failures
        queues = await _queue_bounds(b)
        offsets: list[tuple[str, str, dict[int, int]]] = []
        copied = 0
        for group, topics in sorted(b.meta.offsets.items()):
            for topic, committed in sorted(topics.items()):
                offsets.append((group, topic, dict(committed)))
            copied += len(topics)
            if copied >= SNAPSHOT_SLICE:
                copied = 0
                await asyncio.sleep(0)
        pop = await _pop_groups(b)
        timers = (b.meta.timers.pending, dict(b.meta.timers.stats))
        txs = b.meta.transactions
        transactions = (sum(1 for _ in txs.pending()), dict(txs.stats))
        return cls(
            status,
            is_master,
            disk_full,
            last_failure_at,
            auth_failures,
            queues,
            offsets,
            pop,
            timers,
            transactions,
            lag_limit,
        )

    def metrics(self) -> Iterator[Metric]:
        yield from _node_metrics(self)
        yield from _log_metrics(self.status)
        yield from _later_metrics(self.timers, self.transactions)
        if self.queues is not None:  # the queues were being replaced: no per-queue series
            yield from _queue_metrics(self.queues, self.offsets, self.lag_limit)
            yield from _pop_metrics(self.queues, self.pop, self.lag_limit)


@dataclass(frozen=True, slots=True)
class PopGroupTopic:
    """A POP group's state for one topic, copied: per queue (next offset, in flight),
    and its counters (``broker.pop.state.STATS``)."""

    group: str
    topic: str
    queues: dict[int, tuple[int, int]]
    counts: dict[str, int]


async def _pop_groups(b: Broker) -> list[PopGroupTopic]:
    """Every POP group's state per topic, yielding to the loop every ``SNAPSHOT_SLICE``
    queues."""
    state = b.meta.pop
    by_key: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
    copied = 0
    for (group, topic, qid), qs in list(state.queues.items()):
        by_key.setdefault((group, topic), {})[qid] = (qs.next, len(qs.flights))
        copied += 1
        if copied >= SNAPSHOT_SLICE:
            copied = 0
            await asyncio.sleep(0)
    return [
        PopGroupTopic(g, t, queues, state.counts(g, t)) for (g, t), queues in sorted(by_key.items())
    ]


async def _queue_bounds(b: Broker) -> list[tuple[str, int, int, int]] | None:
    """(topic, queue_id, min, max) of every queue, by topic name; None while a snapshot
    install replaces the queues."""
    out: list[tuple[str, int, int, int]] = []
    since_yield = 0
    for t in b.topics.all():
        if b.dispatcher is None or b.dispatcher.installing:
            return None
        if b.meta.topics.get(t.name) is not t:  # deleted (or made again) meanwhile
            continue
        for qid in range(t.queues):
            lo, hi = b.reads.queue_bounds(t.name, qid)
            out.append((t.name, qid, lo, hi))
        since_yield += t.queues
        if since_yield >= SNAPSHOT_SLICE:
            since_yield = 0
            await asyncio.sleep(0)
    return out


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _node_metrics(s: StateSnapshot) -> Iterator[Metric]:
    """The node's Raft term and role, and what it refused or failed on."""
    st = s.status
    yield _gauge("ledgermq_raft_term", "current Raft term", st.term)
    role = GaugeMetricFamily("ledgermq_raft_role", "1 for this node's Raft role", labels=["role"])
    for name in RAFT_ROLES:
        role.add_metric([name], 1.0 if st.raft_role == name else 0.0)
    yield role
    yield _gauge("ledgermq_broker_master", "1 when MASTER", 1.0 if s.is_master else 0.0)
    if s.raft_auth_failures is not None:
        yield CounterMetricFamily(
            "ledgermq_raft_auth_failures",
            "inbound Raft connections refused by the peer-secret handshake",
            value=s.raft_auth_failures,
        )
    refused = CounterMetricFamily(
        "ledgermq_raft_refused",
        "inbound Raft frames refused: undecodable, not from a member, client requests"
        " this node does not serve",
        labels=["reason"],
    )
    for reason in ("bad_frames", "stranger_frames", "client_requests", "limited"):
        refused.add_metric([reason], st.refused.get(reason, 0))
    yield refused
    yield CounterMetricFamily(
        "ledgermq_corrupt_entry_reads",
        "reads refused because this replica's copy of the entry is damaged"
        " (CORRUPT_ENTRY: the client reads another replica)",
        value=st.stats.get("corrupt_reads", 0),
    )
    yield CounterMetricFamily(
        "ledgermq_produce_deduplicated",
        "messages of a resend answered with what the first send stored, not stored again"
        " (a producer session's retry, a RocketMQ message id in the send window)",
        value=st.stats.get("deduplicated", 0),
    )
    yield _gauge(
        "ledgermq_raft_diverged",
        "1 while this node holds a committed entry its leader contradicts: the group lost"
        " acknowledged data (a node restarted empty under its old id voted); see the log",
        0.0 if st.diverged is None else 1.0,
    )
    yield _gauge(
        "ledgermq_dispatch_stalled",
        "1 while dispatch is stalled on a disk error (writes are refused meanwhile)",
        0.0 if st.dispatch_stall is None else 1.0,
    )
    yield _gauge(
        "ledgermq_disk_full",
        "1 while this node refuses to write for lack of disk, as master or slave: over"
        " --disk-full-ratio its log refuses appends (a slave the master's), under"
        " --disk-reserve-mb a master refuses writes (507 DISK_FULL)",
        1.0 if s.disk_full else 0.0,
    )
    yield _gauge(
        "ledgermq_node_failed",
        "1 once the node stopped working (crash-only: it is exiting)",
        0.0 if st.failed is None else 1.0,
    )
    yield _gauge(
        "ledgermq_last_failure_timestamp_seconds",
        "when the node of this data directory last failed (Unix seconds; 0: never), as"
        " the failing process wrote it there: its restart still shows it",
        s.last_failure_at or 0.0,
    )


def _log_metrics(st: BrokerStatus) -> Iterator[Metric]:
    """The log's indexes, the dispatch lag, and the leader's view of each peer."""
    yield _gauge("ledgermq_ledger_begin_index", "first log index kept", st.ledger_begin_index)
    yield _gauge("ledgermq_ledger_end_index", "last log index", st.ledger_end_index)
    yield _gauge("ledgermq_committed_index", "quorum-committed index", st.committed_index)
    yield _gauge("ledgermq_dispatched_index", "dispatched index", st.dispatched_index)
    yield _gauge(
        "ledgermq_dispatch_lag_entries",
        "committed entries not yet in the consume queues",
        max(0, st.committed_index - st.dispatched_index),
    )
    match = GaugeMetricFamily(
        "ledgermq_peer_match_index", "leader's view of each peer's log", labels=["peer"]
    )
    for peer, info in sorted(st.peers.items()):
        match.add_metric([peer], info.match_index)
    yield match


def _queue_metrics(
    queues: list[tuple[str, int, int, int]],
    offsets: list[tuple[str, str, dict[int, int]]],
    lag_limit: int,
) -> Iterator[Metric]:
    """Every queue's offsets, and each group's lag behind them (at most ``lag_limit``
    series: a bound on the scrape)."""
    lo_g = GaugeMetricFamily(
        "ledgermq_queue_min_offset", "first retained offset", labels=["topic", "queue_id"]
    )
    hi_g = GaugeMetricFamily(
        "ledgermq_queue_max_offset", "next offset to write", labels=["topic", "queue_id"]
    )
    bounds: dict[tuple[str, int], int] = {}
    for topic, qid, lo, hi in queues:
        bounds[topic, qid] = hi
        lo_g.add_metric([topic, str(qid)], lo)
        hi_g.add_metric([topic, str(qid)], hi)
    yield lo_g
    yield hi_g
    lag = GaugeMetricFamily(
        "ledgermq_consumer_lag",
        "max offset minus the group's committed offset",
        labels=["group", "topic", "queue_id"],
    )
    series = 0
    for group, topic, committed_by_queue in offsets:
        for qid, committed in sorted(committed_by_queue.items()):
            top = bounds.get((topic, qid))
            if top is None or series >= lag_limit:
                continue
            series += 1
            lag.add_metric([group, topic, str(qid)], max(0, top - committed))
    yield lag


def _pop_metrics(
    queues: list[tuple[str, int, int, int]], pop: list[PopGroupTopic], lag_limit: int
) -> Iterator[Metric]:
    """Per POP group and topic: in flight, lag (neither acked nor dead-lettered) and what
    happened to its messages (at most ``lag_limit`` group/topic pairs)."""
    labels = ["group", "topic"]
    in_flight = GaugeMetricFamily(
        "ledgermq_pop_in_flight", "messages handed out and not yet acked", labels=labels
    )
    lag = GaugeMetricFamily(
        "ledgermq_pop_lag", "messages neither acknowledged nor dead-lettered", labels=labels
    )
    events = CounterMetricFamily(
        "ledgermq_pop_messages",
        "what happened to a POP group's messages (the same on every node: replicated):"
        " delivered (first time or again), redelivered, acked, nacked, expired (invisible"
        " time passed with no ack or nack), dead_lettered",
        labels=[*labels, "event"],
    )
    bounds = {(topic, qid): hi for topic, qid, _, hi in queues}
    for p in pop[:lag_limit]:
        flying = sum(n for _, n in p.queues.values())
        waiting = sum(
            max(0, bounds.get((p.topic, qid), nxt) - nxt) for qid, (nxt, _) in p.queues.items()
        )
        in_flight.add_metric([p.group, p.topic], flying)
        lag.add_metric([p.group, p.topic], waiting + flying)
        for name, n in p.counts.items():
            events.add_metric([p.group, p.topic, name], n)
    yield in_flight
    yield lag
    yield events


def _later_metrics(
    timers: tuple[int, dict[str, int]], transactions: tuple[int, dict[str, int]]
) -> Iterator[Metric]:
    """Delay messages and transactions: what is pending, and what happened (replicated
    counters: the same on every node)."""
    yield _gauge("ledgermq_delay_pending", "delay messages not delivered yet", timers[0])
    events = CounterMetricFamily(
        "ledgermq_delay_messages",
        "delay messages: scheduled, delivered, cancelled, dropped (their topic was gone)",
        labels=["event"],
    )
    for name, n in timers[1].items():
        events.add_metric([name], n)
    yield events
    yield _gauge("ledgermq_transactions_pending", "transactions not resolved yet", transactions[0])
    tx = CounterMetricFamily(
        "ledgermq_transactions",
        "transactions: begun, committed, rolled_back, checks, expired (rolled back after the"
        " last check), copied (messages delivered), dropped (their topic was gone)",
        labels=["event"],
    )
    for name, n in transactions[1].items():
        tx.add_metric([name], n)
    yield tx
