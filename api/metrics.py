"""``/metrics``: Prometheus text for one node.

prometheus-client (the reference implementation, well kept and dependency-free) renders
the exposition format and keeps the histograms; each app has its own registry so several
nodes in one process (tests) do not share series. Event metrics (latencies, counters) are
recorded as they happen; state metrics (Raft indexes, queue offsets, consumer lag) are
read from the broker when scraped, so they cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.broker import Broker
from broker.status import BrokerStatus

# Seconds, from one fsync'd local append (~1 ms) to a slow quorum (seconds).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

RAFT_ROLES = ("LEADER", "FOLLOWER", "CANDIDATE")


class NodeMetrics:
    def __init__(self, broker: Broker, *, consumer_lag_series_limit: int = 10_000) -> None:
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
        self.errors = Counter("ledgermq_http_errors", "error answers by code", ["code"], registry=r)
        self.long_polls = Gauge(
            "ledgermq_long_polls_waiting", "pull requests parked until data arrives", registry=r
        )
        r.register(_StateCollector(broker, consumer_lag_series_limit))
        broker.server.commit_observers.append(lambda s, _n: self.commit_latency.observe(s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges read from the broker at scrape time."""

    def __init__(self, broker: Broker, lag_limit: int) -> None:
        self.broker = broker
        self.lag_limit = lag_limit

    def describe(self) -> list[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        if b.server.core is None or b.dispatcher is None:
            return
        st = b.status()
        yield from _node_metrics(b, st)
        yield from _log_metrics(st)
        if b.dispatcher.installing:  # the queues are being replaced: no per-queue series
            return
        yield from _queue_metrics(b, self.lag_limit)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _node_metrics(b: Broker, st: BrokerStatus) -> Iterator[Metric]:
    """The node's Raft term and role, and what it refused or failed on."""
    yield _gauge("ledgermq_raft_term", "current Raft term", st.term)
    role = GaugeMetricFamily("ledgermq_raft_role", "1 for this node's Raft role", labels=["role"])
    for name in RAFT_ROLES:
        role.add_metric([name], 1.0 if st.raft_role == name else 0.0)
    yield role
    yield _gauge("ledgermq_broker_master", "1 when MASTER", 1.0 if b.is_master else 0.0)
    if b.server.transport is not None:
        yield CounterMetricFamily(
            "ledgermq_raft_auth_failures",
            "inbound Raft connections refused by the peer-secret handshake",
            value=b.server.transport.auth_failures,
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
    yield _gauge(
        "ledgermq_dispatch_stalled",
        "1 while dispatch is stalled on a disk error (writes are refused meanwhile)",
        0.0 if st.dispatch_stall is None else 1.0,
    )
    yield _gauge(
        "ledgermq_node_failed",
        "1 once the node stopped working (crash-only: it is exiting)",
        0.0 if st.failed is None else 1.0,
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


def _queue_metrics(b: Broker, lag_limit: int) -> Iterator[Metric]:
    """Every queue's offsets, and each group's lag behind them (at most ``lag_limit``
    series: a bound on the scrape)."""
    lo_g = GaugeMetricFamily(
        "ledgermq_queue_min_offset", "first retained offset", labels=["topic", "queue_id"]
    )
    hi_g = GaugeMetricFamily(
        "ledgermq_queue_max_offset", "next offset to write", labels=["topic", "queue_id"]
    )
    bounds: dict[tuple[str, int], int] = {}
    for t in b.list_topics():
        for qid in range(t.queues):
            lo, hi = b.queue_bounds(t.name, qid)
            bounds[t.name, qid] = hi
            lo_g.add_metric([t.name, str(qid)], lo)
            hi_g.add_metric([t.name, str(qid)], hi)
    yield lo_g
    yield hi_g
    lag = GaugeMetricFamily(
        "ledgermq_consumer_lag",
        "max offset minus the group's committed offset",
        labels=["group", "topic", "queue_id"],
    )
    series = 0
    for group, topics in sorted(b.meta.offsets.items()):
        for topic, offsets in sorted(topics.items()):
            for qid, committed in sorted(offsets.items()):
                top = bounds.get((topic, qid))
                if top is None or series >= lag_limit:
                    continue
                series += 1
                lag.add_metric([group, topic, str(qid)], max(0, top - committed))
    yield lag
