"""``BrokerSettings``: every limit and knob of one broker node, with sensible defaults.

The replication settings (``core``, ``store``, ``transport``) are dledger's own; the
broker builds its ``ServerConfig`` from them so one object describes the whole node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from consumequeue import ConsumeQueueSettings, KeyIndexSettings
from dledger.core.settings import CoreSettings
from dledger.runtime.server import ServerConfig, parse_peers
from dledger.runtime.transport import TransportSettings
from dledger.store import StoreSettings

from .message import MAX_PROPERTIES_SIZE

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits (docs/http.md); over a limit → 413/422 before anything is written."""

    max_body_bytes: int = 4 * MiB
    # A message's PROPERTIES block as stored: RocketMQ reads its length as a signed
    # short, so no more than MAX_PROPERTIES_SIZE (32,767) can be allowed.
    max_properties_bytes: int = MAX_PROPERTIES_SIZE
    max_messages_per_request: int = 1000
    max_request_bytes: int = 16 * MiB
    max_pull_messages: int = 1000
    # An Arrow pull page (``Broker.pull_page``) is columnar bytes with no object per
    # message, so it may hold more: fewer, larger requests for bulk readers (Spark).
    max_arrow_pull_messages: int = 10_000
    max_wait_ms: int = 30_000
    max_key_query_results: int = 1024
    max_queues_per_topic: int = 1024
    max_keys_per_message: int = 32
    # Units a pull with a tag filter passes over before it answers NO_MATCHED_MSG with
    # where it got to (RocketMQ's maxFilterMessageCount is 16,000).
    max_filter_scan_units: int = 16_384
    # HTTP request bodies other than produce (topic create, offsets, group pull, ...):
    # refused (413) before they are read or parsed past this.
    max_small_body_bytes: int = 64 * 1024
    # A produce body is counted before anything is built from it: no more JSON strings
    # and scalars than this many per message (a message needs a dozen).
    max_json_strings_per_message: int = 256
    # What one pull, group pull or key query answers, in stored message bytes (at least
    # one message, so one big message never stalls a consumer); an Arrow pull page's
    # records likewise.
    max_response_bytes: int = 32 * MiB
    max_arrow_page_bytes: int = 64 * MiB
    # Parked long polls (pull and group pull with wait_ms > 0), in all and per client
    # (its token, or its address): over either → 429 BUSY with Retry-After.
    max_long_polls: int = 1024
    max_long_polls_per_client: int = 64
    # Each queue holds a file descriptor and a mapping of its consume-queue segment (its
    # disk blocks are allocated as it fills: an idle queue takes a page): over either →
    # 429 LIMIT_REACHED, nothing written.
    max_topics: int = 1024
    max_total_queues: int = 8192
    # Groups that commit offsets (each keeps a table per topic): a new one past it → 429.
    max_groups: int = 10_000
    # POP groups (docs/consuming.md): messages of one queue in flight for a group at once
    # (RocketMQ's popInflightMessageThreshold), handles per ack/nack, invisible times.
    max_pop_in_flight_per_queue: int = 2000
    max_receipt_handles: int = 1024
    min_invisible_ms: int = 100
    max_invisible_ms: int = 12 * 3_600_000
    # Delay messages (docs/producing.md): how far ahead a message may be scheduled
    # (RocketMQ's timerMaxDelaySec: 3 days).
    max_delay_ms: int = 3 * 24 * 3_600_000

    def __post_init__(self) -> None:
        if not 0 <= self.max_properties_bytes <= MAX_PROPERTIES_SIZE:
            raise ValueError(
                f"max_properties_bytes: {self.max_properties_bytes}, must be"
                f" 0..{MAX_PROPERTIES_SIZE} (RocketMQ reads a record's PROPERTIES length as a"
                " signed short)"
            )


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    node_id: str = "n0"
    group: str = "g0"
    peers: str = "n0-127.0.0.1:9080"  # DLedger's "n0-host:port;n1-host:port" (Raft ports)
    data_dir: Path = Path("ledgermq-data")
    flush: Literal["async", "sync"] = "sync"
    peer_urls: dict[str, str] = field(default_factory=dict)  # node id → HTTP URL
    # node id → "host:port" of its RocketMQ 5 gRPC front (docs/rocketmq.md): where a slave
    # forwards what needs the master; shown in GET /v1/cluster.
    peer_grpc: dict[str, str] = field(default_factory=dict)
    advertised_url: str | None = None
    # node id → the URL a browser reaches it at, where that differs from its HTTP URL
    # (compose: a container's name inside, a published port on the host): the console
    # asks these, and CORS admits their origins (docs/console.md).
    console_urls: dict[str, str] = field(default_factory=dict)
    auto_create_topics: bool = True
    # The Raft runtime on an event loop and thread of its own, where no HTTP request can
    # stall its heartbeats and votes (``dledger.runtime.server``); off: on the HTTP loop
    raft_thread: bool = True
    # Joining a running group: this node starts as a learner of the members ``peers``
    # names (every current member, and itself); the master adds it (``cluster add``).
    # Like ``peers``, it counts on the first start only: then the log's configuration rules.
    join: bool = False
    default_queues: int = 8
    # A produce request's messages for one queue are stored as one batch record
    # (``broker.batch``): one log entry, one append, one dispatch step for all of them.
    # Unpinned messages of such a request all go to one queue (round robin per request,
    # like Kafka's sticky partitioner), so that they form one batch.
    batch_records: bool = True
    limits: Limits = field(default_factory=Limits)
    # The producer-session table is bounded: the least recently used session is evicted
    # (the same one on every replica, since eviction follows the log order).
    max_producer_sessions: int = 100_000
    # ... and by the results they keep (each its last batch's, ~25 bytes each in the
    # metadata snapshot): 500,000 keep it ~12 MB, under what a snapshot may send.
    max_session_results: int = 500_000
    # The send window (broker/sendwindow.py): a RocketMQ client's message id resent
    # within this many ids and this much log time of its first send is answered with
    # that send's result, not stored again. Replicated state: give every node the same.
    send_window_ids: int = 100_000
    send_window_ms: int = 600_000
    dispatch_batch_entries: int = 2048  # entries per dispatch step before yielding the loop
    dispatch_checkpoint_interval_ms: int = 1000
    # Metadata snapshots (docs/formats.md): written after this many applied entries or this
    # long, whichever first; the newest few are kept.
    snapshot_interval_entries: int = 100_000
    snapshot_interval_ms: int = 60_000
    snapshots_kept: int = 2
    master_catch_up_timeout_ms: int = 30_000  # a new leader's wait for NOOP + dispatch
    # The last role changes a node keeps in memory for GET /v1/cluster/history (the
    # console's master history): elections, leaders learned, promotions, transfers.
    role_history_size: int = 200
    append_timeout_ms: int = 10_000  # produce waits this long for commit + dispatch
    # Transactions (docs/http.md): RocketMQ's check schedule (transactionTimeOut 6 s,
    # transactionCheckInterval 30 s, transactionCheckMax 15, then rollback); at most so
    # many pending at once (429 over it); resolutions remembered for repeats.
    tx_first_check_ms: int = 6_000
    tx_check_interval_ms: int = 30_000
    tx_max_checks: int = 15
    max_pending_transactions: int = 100_000
    # Delay messages due within this much of now wait in memory (the near window); the
    # rest are read from the timer queue when the window moves on (broker/timers).
    timer_window_ms: int = 60_000
    # A write that arrives while the master hands leadership over waits this long at
    # most for the transfer to end (most end within a heartbeat or two), then goes to
    # whoever is master (this node again if it failed), instead of a 503 the client
    # would back off from: writes pause for the transfer, not longer.
    transfer_hold_ms: int = 1000
    retention_check_interval_ms: int = 1000
    # Writes are refused (507 DISK_FULL) while the data directory's file system has less
    # free space than this, so the derived files of what was acknowledged (a key-index
    # file, allocated in full when created, and the consume queues' blocks, allocated
    # ahead of their writes) always fit.
    # None: one key-index file and four consume-queue segments (~66 MiB by default).
    disk_reserve_bytes: int | None = None
    disk_check_interval_ms: int = 1000
    consume_queue: ConsumeQueueSettings = field(default_factory=ConsumeQueueSettings)
    key_index: KeyIndexSettings = field(default_factory=KeyIndexSettings)
    core: CoreSettings = field(default_factory=CoreSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    seed: int | None = None

    def __post_init__(self) -> None:
        peers = parse_peers(self.peers)
        if self.node_id not in peers:
            raise ValueError(f"node id {self.node_id!r} is not among the peers {sorted(peers)}")
        if not 1 <= self.default_queues <= self.limits.max_queues_per_topic:
            raise ValueError("default_queues must be between 1 and max_queues_per_topic")
        if self.flush not in ("async", "sync"):
            raise ValueError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        if self.dispatch_checkpoint_interval_ms < 1:
            raise ValueError("dispatch_checkpoint_interval_ms must be >= 1")
        if self.role_history_size < 1:
            raise ValueError("role_history_size must be >= 1")
        if self.send_window_ids < 1 or self.send_window_ms < 1:
            raise ValueError("send_window_ids, send_window_ms: >= 1")
        if min(self.tx_first_check_ms, self.tx_check_interval_ms, self.tx_max_checks) < 0:
            raise ValueError("tx_first_check_ms, tx_check_interval_ms, tx_max_checks: >= 0")

    @property
    def disk_reserve(self) -> int:
        if self.disk_reserve_bytes is not None:
            return self.disk_reserve_bytes
        return self.key_index.file_bytes + 4 * self.consume_queue.segment_bytes

    @property
    def peer_map(self) -> dict[str, str]:
        return parse_peers(self.peers)

    @property
    def store_host(self) -> tuple[str, int]:
        """STOREHOST of every record this node writes: its Raft address."""
        host, _, port = self.peer_map[self.node_id].rpartition(":")
        return host, int(port)

    def server_config(self) -> ServerConfig:
        return ServerConfig(
            group=self.group,
            self_id=self.node_id,
            peers=self.peer_map,
            data_dir=self.data_dir,
            # the first members' incarnations go into the log (``membership``): a node
            # whose data directory was lost cannot vote as the member it was
            core=replace(self.core, flush=self.flush, seal_members=True),
            store=self.store,
            transport=self.transport,
            seed=self.seed,
            # The broker's log is written only through the broker (its checks, its
            # tokens): a raw append on the Raft port could put a record with a wrong
            # queue offset into every replica, and a raw read bypasses the HTTP tokens.
            client_requests=frozenset({"metadata"}),
            own_thread=self.raft_thread,
            learners=frozenset({self.node_id}) if self.join else frozenset(),
        )
