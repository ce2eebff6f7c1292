"""A deterministic simulator: whole DLedger clusters in one thread (TigerBeetle's VOPR).

The real core (:class:`~dledger.core.node.DLedgerCore`) and the real file store
(:class:`~dledger.store.file_store.FileStore`, its flush thread off) run against a seeded
network (loss, delay and so reordering, duplication, symmetric and asymmetric
partitions, clogged links), a seeded disk (a crash loses every unsynced byte except a
torn prefix of the last write) and a seeded schedule of crashes, restarts and pauses.
One ``random.Random(seed)`` derives every knob; time is simulated milliseconds.

After every event the invariants are checked (``Checker``); after the fault phase the
cluster is healed and must elect a leader within ``LEADER_WITHIN_MS``, acknowledge an
append within ``ACK_WITHIN_MS`` (each its own "liveness:" failure; the workload goes on
until one is) and converge within a bound, ending with byte-identical data files (from
the highest log begin on, where retention deleted heads).
``trace_digest`` hashes the whole event trace: the same seed gives the same digest. A
failure names the command that replays its seed.

With ``app=True`` (``run_seed``) every node also runs a tiny application, ``SimApp``: a
count and a chained CRC of the committed entry bodies it applied. It writes snapshots at
seeded times and registers them with the core; retention then deletes log heads below
them, so a node that was down or cut off long enough gets INSTALL_SNAPSHOT.
Its knobs (``AppKnobs``) come from a stream of their own, so a run without the app (the
broker simulation) draws exactly what it drew before. After convergence every node's
application state must equal the leader's and the fold of the committed bodies.

Connections (issue 18): a closed connection is an event distinct from silence. A crash
is a process's (its kernel closes its sockets: every live peer it can reach gets
``peer_connection_lost`` after a network delay) or, in a seeded share, a machine's
(silence, as a pause or a partition always is). A seeded "flap" resets the connection
between two live nodes: both see it close, nothing else happens. Their draws come from a
stream of their own (``conn-<seed>``), so the other knobs of a seed stay as they were.

Leadership transfers (issue 26): in the fault phase, at a seeded rate, the leader is asked
to hand leadership to a live follower (``DLedgerCore.transfer_leadership``, as the
broker's admin endpoint does) and, in the seed's shares (``TransferKnobs``), the target
crashes right after (before the request, Raft's TimeoutNow, reaches it), is partitioned
off, or loses the request (the first copy, and none, two or all of those the leader sends
again), or nothing goes wrong. Each transfer and its outcome (``TransferDone``) is
traced and counted (``Simulation.transfers``). While one runs the leader refuses appends;
a transfer that never ends would leave it refusing for good, which the liveness checks
after healing catch (``plant_stuck_transferee`` plants that bug for the tests). Their
draws come from streams of their own (``transfer-<seed>``); a seed drawn without
transfers, or run with ``transfers=False`` (the seeds pinned for a behaviour of their
exact trace), runs as it did before them.

Membership changes (issue 33), with ``membership=True`` (``MemberKnobs``, their own
streams; off by default, so every other seed runs as it did): one or two spare nodes run
from the start as joining learners, and in the fault phase the leader is asked, at a
seeded rate, to add a node that is not a member as a learner, promote a learner, or
remove a learner or another voter; removed nodes run on (a member's frames from them are
dropped) and may be added back later, with their old logs. Every committed configuration
entry must differ from the one committed before it by at most one voter (``Checker``),
on top of every check above; convergence and the final checks are over the members of
the last leader's configuration.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import random
import shutil
import struct
import tempfile
import weakref
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core import node as core_node
from dledger.core.membership import (
    AddLearner,
    Configuration,
    MembershipChange,
    Promote,
    Remove,
    changed_voters,
)
from dledger.core.messages import (
    InstallSnapshotRequest,
    LeadershipTransferRequest,
    PushEntryRequest,
    RaftMessage,
    Role,
)
from dledger.core.node import DLedgerCore, Ready
from dledger.core.settings import CoreSettings
from dledger.core.snapshot import Snapshot
from dledger.runtime.ready import deliver_ready, persist_ready
from dledger.store import MAGIC_CONFIG, MAGIC_NORMAL, Entry, FileStore, StoreSettings

TICK_MS = 10
STORE = StoreSettings(
    data_file_size=16 * 1024,
    index_file_size=1024,
    clean_interval_ms=3_600_000,
    checkpoint_interval_ms=3_600_000,
)


# Liveness (issue 26): after healing, a leader (in the broker simulation: a MASTER) must
# exist within LEADER_WITHIN_MS, and an append must be acknowledged within ACK_WITHIN_MS,
# each with its own failure message (``LIVENESS``), well before the generic "no
# convergence" (``Knobs.converge_ms``) would say it. Measured with transfers on: over
# 200 Raft seeds and 400 broker seeds the first leader came at most 2.0 s after healing
# (the first MASTER 1.4 s), the first acknowledgement 2.4 s (a produce 2.0 s).
LEADER_WITHIN_MS = 5_000
ACK_WITHIN_MS = 6_000
LIVENESS = "liveness:"  # every liveness failure's message starts so


def replay_command(
    seed: int, fault_ms: int = 8_000, transfers: bool = True, membership: bool = False
) -> str:
    more = f" --fault-ms {fault_ms}" if fault_ms != 8_000 else ""
    more += "" if transfers else " --no-transfers"
    more += " --membership" if membership else ""
    return f".venv/bin/python -m tests.sim --seed {seed}{more} --verbose"


class InvariantViolationError(AssertionError):
    pass


_BUG_EVENTS = frozenset({"dispatcher_error", "install_refused", "two_leaders", "diverged"})


@dataclass
class Knobs:
    """Every fault rate of one run, drawn from the seed."""

    n_nodes: int
    loss: float
    dup: float
    delay_ms: tuple[int, int]
    crash_per_s: float
    pause_per_s: float
    partition_per_s: float
    clog_per_s: float
    crash_mid_ready: float
    propose_every_ms: tuple[int, int]
    fault_ms: int
    converge_ms: int

    @classmethod
    def from_rng(cls, rng: random.Random, fault_ms: int) -> Knobs:
        lo = rng.randint(1, 5)
        return cls(
            n_nodes=rng.choice((3, 3, 3, 5, 1)) if rng.random() < 0.9 else 5,
            loss=rng.choice((0.0, 0.01, 0.05, 0.15)),
            dup=rng.choice((0.0, 0.02, 0.1)),
            delay_ms=(lo, lo + rng.choice((2, 10, 40, 120))),
            crash_per_s=rng.choice((0.0, 0.2, 0.5)),
            pause_per_s=rng.choice((0.0, 0.1, 0.3)),
            partition_per_s=rng.choice((0.0, 0.1, 0.3)),
            clog_per_s=rng.choice((0.0, 0.2)),
            crash_mid_ready=rng.choice((0.0, 0.002, 0.01)),
            propose_every_ms=(rng.choice((5, 20)), rng.choice((40, 150))),
            fault_ms=fault_ms,
            converge_ms=15_000,
        )


@dataclass
class AppKnobs:
    """The application's snapshots and the log's retention. Drawn from a stream of their
    own (``app-<seed>``): turning the app off changes no other draw of the seed."""

    snapshot_every_ms: tuple[int, int] | None  # None: the app never snapshots
    retain_every_ms: tuple[int, int] | None  # None: retention never runs
    data_file_size: int
    crash_after_install: float  # power lost between the app's install and the log reset
    # what one InstallSnapshotRequest carries: a few bytes sends the app's 20-byte
    # snapshot in chunks, each of them lost, late or repeated like any message
    snapshot_chunk_bytes: int

    @classmethod
    def from_seed(cls, seed: int) -> AppKnobs:
        rng = random.Random(f"app-{seed}")
        snapshots = rng.random() < 0.75
        retain = snapshots and rng.random() < 0.8
        return cls(
            snapshot_every_ms=(rng.choice((100, 300)), rng.choice((800, 2000)))
            if snapshots
            else None,
            retain_every_ms=(rng.choice((100, 400)), rng.choice((1000, 2500))) if retain else None,
            data_file_size=rng.choice((4096, 4096, 16 * 1024)),
            crash_after_install=rng.choice((0.0, 0.0, 0.3)),
            snapshot_chunk_bytes=rng.choice((CoreSettings().snapshot_chunk_bytes, 3, 8)),
        )


@dataclass
class ConnKnobs:
    """Connection closes (issue 18, see the module docstring), from a stream of their own
    (``conn-<seed>``): how many crashes are a process's (they close its connections; the
    rest are a machine's, silent) and how often a link between two live nodes resets."""

    process_crash_share: float
    flap_per_s: float

    @classmethod
    def from_seed(cls, seed: int) -> ConnKnobs:
        rng = random.Random(f"conn-{seed}")
        return cls(rng.choice((1.0, 0.7, 0.5)), rng.choice((0.0, 0.0, 0.5, 2.0)))


TRANSFER_KINDS = ("crash", "partition", "drop", "clean")


@dataclass
class TransferKnobs:
    """Leadership transfers in the fault phase (issue 26), from a stream of their own
    (``transfer-<seed>``, like ``ConnKnobs``): how often the leader is asked to hand
    leadership to a follower (as the broker's admin endpoint does) and, per kind of
    ``TRANSFER_KINDS``, the weight of what happens right after: the target crashes
    before it can campaign, is partitioned off, the ``LeadershipTransferRequest`` (Raft's
    TimeoutNow) to it is lost, or nothing goes wrong. ``enabled=False`` (the seeds pinned
    for a behaviour of their exact trace): no transfer at all."""

    per_s: float
    weights: tuple[int, ...]  # of TRANSFER_KINDS, in that order

    @classmethod
    def from_seed(cls, seed: int, enabled: bool = True) -> TransferKnobs:
        rng = random.Random(f"transfer-{seed}")
        per_s = rng.choice((0.0, 0.5, 1.0, 2.0))
        weights = tuple(rng.choice((0, 1, 1, 2)) for _ in TRANSFER_KINDS)
        if not any(weights):
            weights = (0, 0, 0, 1)
        return cls(per_s if enabled else 0.0, weights)


@dataclass
class MemberKnobs:
    """Membership changes in the fault phase (issue 33), from a stream of their own
    (``member-<seed>``): how often the leader is asked for a change, and how many spare
    nodes (not members at first) run beside the cluster. ``enabled=False`` (the
    default of ``Simulation``): none of it."""

    per_s: float
    spares: int

    @classmethod
    def from_seed(cls, seed: int, enabled: bool = False) -> MemberKnobs:
        rng = random.Random(f"member-{seed}")
        per_s, spares = rng.choice((0.5, 1.0, 2.0, 4.0)), rng.choice((1, 2))
        return cls(per_s, spares) if enabled else cls(0.0, 0)


class CrashAfterInstallError(Exception):
    """The seeded power loss right after the application installed a snapshot."""


@dataclass(frozen=True)
class SimApp:
    """The application's state machine: how many NORMAL entries it applied and a chained
    CRC of their bodies, up to log index ``applied``. Its snapshot is these three."""

    applied: int = -1
    count: int = 0
    digest: int = 0

    _CODEC = struct.Struct(">qqI")

    def apply(self, e: Entry) -> SimApp:
        assert e.index == self.applied + 1, (e.index, self.applied)
        if e.magic != MAGIC_NORMAL:
            return replace(self, applied=e.index)
        return SimApp(e.index, self.count + 1, zlib.crc32(e.body, self.digest))

    def encode(self) -> bytes:
        return self._CODEC.pack(self.applied, self.count, self.digest)

    @classmethod
    def decode(cls, data: bytes) -> SimApp:
        return cls(*cls._CODEC.unpack(data))


@dataclass
class SimNode:
    node_id: str
    directory: Path
    store: FileStore | None = None
    core: DLedgerCore | None = None
    paused: bool = False
    inbox: list[RaftMessage] = field(default_factory=list)  # held while paused
    closed: list[str] = field(default_factory=list)  # peers whose close came while paused
    restarts: int = 0
    applied: int = -1  # the highest committed index this incarnation reported
    app: SimApp | None = None  # in memory: lost in a crash
    app_snapshot: bytes | None = None  # durable: the application's snapshot file
    installs: int = 0
    # membership (issue 33): a spare starts only when it is first added, with the
    # configuration of that moment as its bootstrap (voters, learners: the operator's
    # ``--peers``); None for the cluster's first nodes
    bootstrap: tuple[dict[str, str], dict[str, str]] | None = None
    joined: bool = True
    wipes: int = 0  # how many times its data directory was wiped to join again

    @property
    def alive(self) -> bool:
        return self.core is not None


class Checker:
    """Raft's safety properties, checked after every event (the issue's list)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.leader_of_term: dict[int, str] = {}
        self.votes: dict[tuple[str, int], str] = {}
        self.committed: dict[int, tuple[int, int]] = {}  # index -> (term, chain)
        self.max_committed = -1
        self.committed_in_term: dict[int, int] = {}  # term seen at commit -> max index
        self.leader_mark: dict[str, tuple[int, int, int]] = {}  # node -> (term, idx, chain)
        self.acked: dict[int, bytes] = {}  # index -> body of an acknowledged append
        self.committed_body: dict[int, bytes | None] = {}  # None: not a NORMAL entry
        # committed configuration entries by index, and the configuration before them
        self.configs: dict[int, Configuration] = {}
        self.first_config = Configuration.of(sim.peers)

    def fail(self, what: str) -> None:
        raise InvariantViolationError(f"seed {self.sim.seed} t={self.sim.now_ms}: {what}")

    def on_hard_state(self, node: str, term: int, voted_for: str | None) -> None:
        if voted_for is None:
            return
        prev = self.votes.setdefault((node, term), voted_for)
        if prev != voted_for:
            self.fail(f"{node} voted for {prev} and {voted_for} in term {term}")

    def on_commit(self, node: SimNode, old: int, new: int) -> None:
        store = node.store
        assert store is not None
        for i in range(max(old + 1, store.ledger_begin_index), new + 1):
            e = store.get(i)
            seen = self.committed.setdefault(i, (e.term, e.chain_crc))
            if seen != (e.term, e.chain_crc):
                self.fail(f"{node.node_id} applied {e.term}/{e.chain_crc} at {i}, seen {seen}")
            self.committed_body.setdefault(i, e.body if e.magic == MAGIC_NORMAL else None)
            if e.magic == MAGIC_CONFIG and i not in self.configs:
                self._check_config(i, Configuration.decode(e.body))
        self.max_committed = max(self.max_committed, new)
        term = node.core.member_state.curr_term if node.core is not None else -1
        self.committed_in_term[term] = max(self.committed_in_term.get(term, -1), new)

    def _check_config(self, index: int, config: Configuration) -> None:
        """Single-server changes: a committed configuration differs from the one
        committed before it (and the next one committed after it) by at most one voter,
        so any majority of one overlaps any majority of the other."""
        self.configs[index] = config
        before = [i for i in self.configs if i < index]
        after = [i for i in self.configs if i > index]
        prev = self.configs[max(before)] if before else self.first_config
        pairs = [(prev, config)] + ([(config, self.configs[min(after)])] if after else [])
        for a, b in pairs:
            if changed_voters(a, b) > 1:
                self.fail(
                    f"committed configuration at {index} moves {changed_voters(a, b)} voters:"
                    f" {a.voters} -> {b.voters}"
                )

    def on_acked(self, first_index: int, bodies: Iterable[bytes]) -> None:
        for k, body in enumerate(bodies):
            self.acked[first_index + k] = body

    def check(self) -> None:
        alive = [n for n in self.sim.nodes if n.core is not None and n.store is not None]
        for n in alive:
            core, store = n.core, n.store
            assert core is not None and store is not None
            if core.member_state.role is Role.LEADER:
                self._check_leader(n, core, store)
            else:
                self.leader_mark.pop(n.node_id, None)
        self._check_log_matching(alive)

    def _check_leader(self, n: SimNode, core: DLedgerCore, store: FileStore) -> None:
        term = core.member_state.curr_term
        other = self.leader_of_term.setdefault(term, n.node_id)
        if other != n.node_id:
            self.fail(f"two leaders in term {term}: {other} and {n.node_id}")
        mark = self.leader_mark.get(n.node_id)
        if mark is not None and mark[0] == term:
            _, idx, chain = mark
            if store.ledger_end_index < idx or _term_chain(store, idx)[1] not in (chain, None):
                self.fail(f"leader {n.node_id} overwrote its log at {idx} in term {term}")
        end = store.ledger_end_index
        if end >= store.ledger_begin_index:
            self.leader_mark[n.node_id] = (term, end, store.get(end).chain_crc)
        # Leader completeness (§5.4.1): entries committed by the time of this term
        c = max((i for t, i in self.committed_in_term.items() if t <= term), default=-1)
        if c >= 0 and (end < c or _term_chain(store, c) not in (self.committed[c], (None, None))):
            self.fail(f"leader {n.node_id} (term {term}) lacks committed entry {c}")

    def _check_log_matching(self, alive: list[SimNode]) -> None:
        for a, b in itertools.combinations(alive, 2):
            sa, sb = a.store, b.store
            assert sa is not None and sb is not None
            i = min(sa.ledger_end_index, sb.ledger_end_index)
            lo = max(sa.ledger_begin_index, sb.ledger_begin_index)
            if i < lo:
                continue
            ea, eb = sa.get(i), sb.get(i)
            if ea.term == eb.term and ea.chain_crc != eb.chain_crc:
                self.fail(f"{a.node_id} and {b.node_id} differ before index {i} (term {ea.term})")


def _term_chain(store: FileStore, index: int) -> tuple[int | None, int | None]:
    """(term, chain CRC) of entry ``index``, also when it is the one before the log head;
    (None, None) when retention deleted it (a snapshot covers it)."""
    if index == store.ledger_begin_index - 1:
        return store.ledger_before_begin_term, store.ledger_before_begin_chain
    if index < store.ledger_begin_index:
        return None, None
    e = store.get(index)
    return e.term, e.chain_crc


class Simulation:
    def __init__(
        self,
        seed: int,
        root: Path,
        *,
        fault_ms: int = 8_000,
        verbose: bool = False,
        app: bool = False,
        transfers: bool = True,
        membership: bool = False,
    ):
        self.seed = seed
        self.rng = random.Random(seed)
        self.knobs = Knobs.from_rng(self.rng, fault_ms)
        self.app = app
        self.app_knobs = AppKnobs.from_seed(seed)
        self.app_rng = random.Random(f"app-events-{seed}")  # the app's own draws
        self.store_settings = (
            replace(STORE, data_file_size=self.app_knobs.data_file_size) if app else STORE
        )
        self.installs = 0
        self.chunked_installs = 0  # of them, sent in more than one chunk
        self.crashes_after_install = 0
        self.root = root
        self.verbose = verbose
        self.now_ms = 0
        self._seq = itertools.count()
        self._events: list[tuple[int, int, str, Callable[[], None]]] = []
        self._digest = hashlib.sha256()
        self.trace_lines = 0
        k = self.knobs.n_nodes
        ids = [f"n{i}" for i in range(k)]
        self.peers = {i: f"127.0.0.1:{20000 + j}" for j, i in enumerate(ids)}
        # Membership (issue 33): spare nodes, not members at first (see the docstring)
        self.member_knobs = MemberKnobs.from_seed(seed, membership)
        self.member_rng = random.Random(f"member-events-{seed}")
        self.member_changes: Counter[str] = Counter()
        spares = [f"n{k + j}" for j in range(self.member_knobs.spares)]
        self.addresses = {
            **self.peers,
            **{i: f"127.0.0.1:{20000 + k + j}" for j, i in enumerate(spares)},
        }
        self.spare_ids = frozenset(spares)
        self.nodes = [SimNode(i, root / i) for i in ids] + [
            SimNode(i, root / i, joined=False) for i in spares
        ]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.cut: set[tuple[str, str]] = set()
        self.clog: dict[tuple[str, str], int] = {}
        self.checker = Checker(self)
        self.proposals: dict[tuple[str, int, int], list[bytes]] = {}
        self._body_seq = itertools.count()
        self.faults_on = True
        self.settings = CoreSettings(
            snapshot_chunk_bytes=self.app_knobs.snapshot_chunk_bytes, seal_members=membership
        )
        self.conn_knobs = ConnKnobs.from_seed(seed)
        self.conn_rng = random.Random(f"conn-events-{seed}")  # the connections' own draws
        self.early_pre_votes = 0  # started (a follower saw its leader's connection close)
        self.early_elections = 0  # granted: the follower campaigned at once
        self.flaps = 0
        # Leadership transfers (issue 26): their knobs and draws from streams of their own
        self.transfer_knobs = TransferKnobs.from_seed(seed, transfers)
        self.transfer_rng = random.Random(f"transfer-events-{seed}")
        # "<kind> asked", "<kind> refused <code>", "<kind> <code>" (the outcome), and
        # "<kind> succeeded" (SUCCESS) or "<kind> failed" (any other code)
        self.transfers: Counter[str] = Counter()
        self._transfer_kinds: dict[tuple[str, int, int], str] = {}  # (node, gen, id) -> kind
        # (leader, target, request id; None: the request being made now) -> how many
        # more copies of that LeadershipTransferRequest the network loses (None: all)
        self._transfer_drops: dict[tuple[str, str, int | None], int | None] = {}
        # Liveness after healing: when it began, when a leader and an acknowledged
        # append were first seen after it (None: not yet)
        self.healed_ms: int | None = None
        self.first_leader_ms: int | None = None
        self.first_ack_ms: int | None = None
        self._workload_end_ms = fault_ms + 2000

    # ---- trace -------------------------------------------------------------------------

    def trace(self, line: str) -> None:
        self._digest.update(f"{self.now_ms} {line}\n".encode())
        self.trace_lines += 1
        if self.verbose:
            print(f"{self.now_ms:>7} {line}")

    @property
    def trace_digest(self) -> str:
        return self._digest.hexdigest()

    def at(self, t_ms: int, name: str, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t_ms, next(self._seq), name, fn))

    # ---- nodes -------------------------------------------------------------------------

    def start(self, n: SimNode) -> None:
        n.store = FileStore(
            n.directory,
            self.store_settings,
            background=False,
            new_incarnation=lambda: f"{n.node_id}.{self.member_rng.getrandbits(32):08x}",
        )
        voters, learners = n.bootstrap or (self.peers, {})
        n.core = DLedgerCore(
            group="g0",
            self_id=n.node_id,
            peers={**voters, **learners},
            store=n.store,
            rng=random.Random((self.member_rng if n.bootstrap else self.rng).getrandbits(64)),
            settings=self.settings,
            now_ms=self.now_ms,
            event_log=lambda name, fields: self._core_event(n, name, fields),
            learners=learners,
        )
        self.trace(
            f"start {n.node_id} end={n.store.ledger_end_index} term={n.core.member_state.curr_term}"
        )
        self.at(
            self.now_ms + self.rng.randint(1, TICK_MS),
            f"tick {n.node_id}",
            lambda: self._tick(n, n.restarts),
        )
        if self.app:
            self._start_app(n)

    def _core_event(self, n: SimNode, name: str, fields: dict[str, Any]) -> None:
        """Events that are bugs here: the simulated store never moves under the core (one
        thread), and a snapshot never contradicts a committed entry (§5.4)."""
        if name in _BUG_EVENTS:
            self.checker.fail(f"{n.node_id}: {name} {fields}")
        if name == "early_pre_vote":
            self.early_pre_votes += 1
            self.early_elections += fields["granted"] > self.knobs.n_nodes // 2

    def crash(self, n: SimNode, *, mid_ready: bool = False) -> None:
        store = n.store
        assert store is not None
        synced_data, synced_index = store.data_flushed_pos, store.index_flushed_pos
        end_pos = store.ledger_end_pos
        self._end_process(n)
        torn = self._lose_unsynced(n.directory, synced_data, end_pos, synced_index)
        self.trace(f"crash {n.node_id} mid_ready={mid_ready} torn={torn}")
        if self.conn_rng.random() < self.conn_knobs.process_crash_share:
            for other in self.nodes:
                if other is not n:
                    self._close(n.node_id, other)

    @staticmethod
    def _end_process(n: SimNode) -> None:
        """``n``'s process is gone: its files let go unsynced, its memory lost."""
        assert n.store is not None
        n.store.abandon()
        n.store = n.core = None
        n.app = None
        n.paused = False
        n.inbox.clear()
        n.closed.clear()
        n.restarts += 1

    def _lose_unsynced(self, d: Path, synced: int, end_pos: int, synced_index: int) -> int:
        """The seeded disk: bytes past the synced point are lost, but a random prefix of
        them (the last, torn write) may have reached the platter."""
        keep = synced + (self.rng.randint(0, end_pos - synced) if end_pos > synced else 0)
        for f in sorted((d / "data").iterdir()):
            _zero_from(f, keep - int(f.name))
        for f in sorted((d / "index").iterdir()):
            _zero_from(f, synced_index - int(f.name))
        return keep - synced

    def _tick(self, n: SimNode, generation: int) -> None:
        if n.core is None or n.restarts != generation:
            return
        if not n.paused:
            self.run(n, lambda c: c.tick(self.now_ms))
        self.at(self.now_ms + TICK_MS, f"tick {n.node_id}", lambda: self._tick(n, generation))

    def run(self, n: SimNode, action: Callable[[DLedgerCore], Any]) -> Any:
        """Feed one input to a node and handle its Readies in the production order."""
        core, store = n.core, n.store
        assert core is not None and store is not None
        result = action(core)
        while True:
            ready = core.ready()
            if not ready:
                return result
            if (
                self.faults_on
                and ready.must_sync
                and self.rng.random() < self.knobs.crash_mid_ready
            ):
                self.crash(n, mid_ready=True)  # power lost before the sync completed
                self.at(
                    self.now_ms + self.rng.randint(50, 2000),
                    f"restart {n.node_id}",
                    lambda: self.start(n) if n.core is None else None,
                )
                return result
            if ready.hard_state is not None:
                hs = ready.hard_state
                # a node wiped and added back is another voter (its votes are new)
                who = n.node_id if not n.wipes else f"{n.node_id}#{n.wipes}"
                self.checker.on_hard_state(who, hs.term, hs.voted_for)
            old_commit = n.applied
            try:
                synced = persist_ready(
                    store,
                    ready,
                    sync_log=True,
                    install=(lambda snap: self._install(n, snap)) if self.app else None,
                )
            except CrashAfterInstallError:
                self.crash(n, mid_ready=True)  # the app has the snapshot, the log is old
                self.at(
                    self.now_ms + self.rng.randint(50, 2000),
                    f"restart {n.node_id}",
                    lambda: self.start(n) if n.core is None else None,
                )
                return result
            deliver_ready(
                core,
                ready,
                synced,
                send=lambda ms: self.send(n, ms),
                on_ready=lambda r, c=old_commit: self._on_ready(n, r, c),
            )

    def _on_ready(self, n: SimNode, r: Ready, old_commit: int) -> None:
        if r.committed_index is not None and r.committed_index > old_commit:
            self.checker.on_commit(n, old_commit, r.committed_index)
            n.applied = r.committed_index
            self.trace(f"commit {n.node_id} {r.committed_index}")
        for done in r.proposals:
            key = (n.node_id, n.restarts, done.proposal.proposal_id)
            bodies = self.proposals.pop(key, [])
            self.trace(f"proposal {n.node_id} {done.proposal.first_index} {done.code.name}")
            if done.code is DLedgerCode.SUCCESS:
                self.checker.on_acked(done.proposal.first_index, bodies)
                self._proposal_acknowledged()
        for t in r.transfers:
            kind = self._transfer_kinds.pop((n.node_id, n.restarts, t.transfer_id), "unknown")
            ok = t.code is DLedgerCode.SUCCESS
            self.transfers[f"{kind} {t.code.name}"] += 1
            self.transfers[f"{kind} {'succeeded' if ok else 'failed'}"] += 1
            self.trace(f"transfer done {n.node_id} #{t.transfer_id} {kind} {t.code.name}")
        for rc in r.role_changes:
            self.trace(f"role {n.node_id} {rc.role.value} term={rc.term} leader={rc.leader_id}")
        if self.app and r.committed_index is not None:
            self._apply(n)

    # ---- the application: state machine, snapshots, retention -------------------------------

    def _start_app(self, n: SimNode) -> None:
        """Recovery: the app's state is its snapshot file; the log has everything after
        it (retention stops at the snapshot, an install resets the log after the app)."""
        store = n.store
        assert store is not None
        n.app = SimApp.decode(n.app_snapshot) if n.app_snapshot is not None else SimApp()
        if store.ledger_begin_index - 1 > n.app.applied:
            self.checker.fail(
                f"{n.node_id}'s log begins at {store.ledger_begin_index}, after its"
                f" application's snapshot at {n.app.applied}"
            )
        self._apply(n)
        gen = n.restarts
        k = self.app_knobs
        if k.snapshot_every_ms is not None:
            self.at(
                self.now_ms + self.app_rng.randint(*k.snapshot_every_ms),
                f"snapshot {n.node_id}",
                lambda: self._snapshot_event(n, gen),
            )
        if k.retain_every_ms is not None:
            self.at(
                self.now_ms + self.app_rng.randint(*k.retain_every_ms),
                f"retain {n.node_id}",
                lambda: self._retain_event(n, gen),
            )

    def _apply(self, n: SimNode) -> None:
        store, app = n.store, n.app
        assert store is not None and app is not None
        for i in range(app.applied + 1, store.committed_index + 1):
            app = app.apply(store.get(i))
        n.app = app
        self._register(n)

    def _register(self, n: SimNode) -> None:
        """Register the app's durable snapshot with the core (after a restart too; it
        is refused while the log has not committed that far yet: try again later)."""
        core = n.core
        if core is None or n.app_snapshot is None:
            return
        snap = SimApp.decode(n.app_snapshot)
        if core.snapshot is not None and core.snapshot.last_index >= snap.applied:
            return
        if snap.applied <= core.store.committed_index:
            core.set_snapshot(snap.applied, n.app_snapshot)
        elif self.member_knobs.per_s and core.member_state.role is Role.LEADER:
            # A leader behind its own snapshot commits up to it (``set_snapshot``). The
            # other seeds keep their pinned traces: they never ask.
            self.run(n, lambda c: c.set_snapshot(snap.applied, n.app_snapshot or b""))

    def _snapshot_event(self, n: SimNode, gen: int) -> None:
        if n.core is None or n.restarts != gen:
            return
        app = n.app
        assert app is not None
        if not n.paused and app.applied >= 0:
            old = SimApp.decode(n.app_snapshot).applied if n.app_snapshot else -1
            if self.member_knobs.per_s and app.applied <= old:
                self._register(n)  # not registered yet (a leader behind it, say)
            if app.applied > old:
                n.app_snapshot = app.encode()  # written atomically: durable from here
                self._register(n)
                self.trace(f"snapshot {n.node_id} {app.applied}")
        k = self.app_knobs.snapshot_every_ms
        assert k is not None
        self.at(
            self.now_ms + self.app_rng.randint(*k),
            f"snapshot {n.node_id}",
            lambda: self._snapshot_event(n, gen),
        )

    def _retain_event(self, n: SimNode, gen: int) -> None:
        if n.core is None or n.restarts != gen:
            return
        store, snap = n.store, n.core.snapshot
        assert store is not None
        if not n.paused and snap is not None:
            before = store.ledger_begin_index
            store.set_retention_floor(snap.next_pos)  # never past the app's snapshot
            store.clean(force=True)
            if store.ledger_begin_index != before:
                self.trace(f"retain {n.node_id} begin={store.ledger_begin_index}")
        k = self.app_knobs.retain_every_ms
        assert k is not None
        self.at(
            self.now_ms + self.app_rng.randint(*k),
            f"retain {n.node_id}",
            lambda: self._retain_event(n, gen),
        )

    def _install(self, n: SimNode, snap: Snapshot) -> None:
        """The app's snapshot installer: durable before it returns (persist_ready resets
        the log only afterwards)."""
        n.app_snapshot = snap.data
        n.app = SimApp.decode(snap.data)
        assert n.app.applied == snap.last_index
        n.installs += 1
        self.installs += 1
        if len(snap.data) > self.settings.snapshot_chunk_bytes:
            self.chunked_installs += 1  # it arrived in pieces
        self.trace(f"install {n.node_id} {snap.last_index} next_pos={snap.next_pos}")
        if self.faults_on and self.app_rng.random() < self.app_knobs.crash_after_install:
            self.crashes_after_install += 1
            raise CrashAfterInstallError

    # ---- network -----------------------------------------------------------------------

    def send(self, src: SimNode, msgs: Iterable[RaftMessage]) -> None:
        k = self.knobs
        for m in msgs:
            dst = m.remote_id
            if isinstance(m, LeadershipTransferRequest) and self._lose_transfer_request(m):
                self.trace(f"lost {dst}<-{src.node_id} {_describe(m)}")
                continue
            if self.faults_on and ((src.node_id, dst) in self.cut or self.rng.random() < k.loss):
                continue
            copies = 2 if self.faults_on and self.rng.random() < k.dup else 1
            for _ in range(copies):
                delay = self.rng.randint(*k.delay_ms) + self.clog.get((src.node_id, dst), 0)
                self.at(self.now_ms + delay, "deliver", lambda m=m: self._deliver(m))

    def _deliver(self, m: RaftMessage) -> None:
        n = self.by_id[m.remote_id]
        if n.core is None:
            return
        if n.paused:
            n.inbox.append(m)
            return
        self.trace(f"recv {m.remote_id}<-{m.local_id} {_describe(m)}")
        self.run(n, lambda c: c.step(m, self.now_ms))

    def _close(self, src: str, dst: SimNode) -> None:
        """``dst`` sees its connections with ``src`` end, after a network delay, unless
        the network between them is cut (the FIN or RST is lost too)."""
        if (src, dst.node_id) in self.cut:
            return
        delay = self.conn_rng.randint(*self.knobs.delay_ms)
        gen = dst.restarts
        self.at(self.now_ms + delay, "closed", lambda: self._closed(dst, src, gen))

    def _closed(self, n: SimNode, peer: str, generation: int) -> None:
        if n.core is None or n.restarts != generation:
            return
        if n.paused:
            n.closed.append(peer)  # read when the process runs again
            return
        self.trace(f"closed {n.node_id}<-{peer}")
        self.run(n, lambda c: c.peer_connection_lost(peer, self.now_ms))

    def _fault_flap(self) -> None:
        """Reset the connection between two live nodes: both see it close."""
        alive = [n for n in self.nodes if n.core is not None]
        if len(alive) < 2:
            return
        a, b = self.conn_rng.sample(alive, 2)
        self.flaps += 1
        self.trace(f"flap {a.node_id}<->{b.node_id}")
        self._close(a.node_id, b)
        self._close(b.node_id, a)

    # ---- workload ----------------------------------------------------------------------

    @property
    def workload_on(self) -> bool:
        """Clients work in the fault phase, for 2 s after it and, after that, until an
        append made after healing is acknowledged (``ACK_WITHIN_MS`` bounds the wait)."""
        return self.faults_on or self.now_ms < self._workload_end_ms or self.first_ack_ms is None

    def _propose(self) -> None:
        leaders = [
            n
            for n in self.nodes
            if n.core is not None and not n.paused and n.core.member_state.role is Role.LEADER
        ]
        if leaders:
            n = self.rng.choice(leaders)
            bodies = [
                f"s{self.seed}-b{next(self._body_seq)}".encode() * self.rng.randint(1, 20)
                for _ in range(self.rng.randint(1, 4))
            ]

            def act(c: DLedgerCore) -> None:
                p = c.propose(bodies, self.now_ms)
                self.proposals[(n.node_id, n.restarts, p.proposal_id)] = bodies
                self.trace(f"propose {n.node_id} {p.first_index}+{len(bodies)}")

            try:
                self.run(n, act)
            except DLedgerError as e:  # refusals are part of the workload
                self.trace(f"propose {n.node_id} refused {e.code.name}")
        if self.workload_on:
            self.at(
                self.now_ms + self.rng.randint(*self.knobs.propose_every_ms),
                "propose",
                self._propose,
            )

    # ---- faults ------------------------------------------------------------------------

    def _fault(self) -> None:
        if not self.faults_on:
            return
        k, rng = self.knobs, self.rng
        kinds = [
            ("crash", k.crash_per_s),
            ("pause", k.pause_per_s),
            ("partition", k.partition_per_s),
            ("clog", k.clog_per_s),
        ]
        for kind, rate in kinds:
            if rng.random() < rate * 0.1:  # checked every 100 ms
                getattr(self, f"_fault_{kind}")()
        if self.conn_rng.random() < self.conn_knobs.flap_per_s * 0.1:
            self._fault_flap()
        if self.transfer_rng.random() < self.transfer_knobs.per_s * 0.1:
            self._fault_transfer()
        if self.member_rng.random() < self.member_knobs.per_s * 0.1:
            self._fault_member()
        self.at(self.now_ms + 100, "fault", self._fault)

    # ---- membership changes (issue 33) -------------------------------------------------

    def _fault_member(self) -> None:
        """Ask the leader for one membership change, drawn from those its configuration
        allows: add a node that is not a member (a spare, or one removed before) as a
        learner, promote or remove a learner, remove another voter. Refusals (the last
        change not committed yet, a learner too far behind) are counted and traced."""
        rng = self.member_rng
        sources = self._transfer_sources()
        if not sources:
            return
        src = rng.choice(sources)
        assert src.core is not None
        config = src.core.member_state.config
        options: list[MembershipChange] = [
            AddLearner(n.node_id, self.addresses[n.node_id])
            for n in self.nodes
            if n.node_id not in config.members
        ]
        for learner in config.learners:
            options += [Promote(learner), Promote(learner), Remove(learner)]
        options += [Remove(v) for v in config.voters if v != src.node_id]
        if not options:
            return
        change = rng.choice(options)
        what = f"{type(change).__name__} {change.node_id}"
        try:
            p = self.run(src, lambda c: c.change_membership(change, self.now_ms))
        except DLedgerError as e:
            self.member_changes[f"refused {e.code.name}"] += 1
            self.trace(f"member {src.node_id} {what} refused {e.code.name}")
            return
        self.member_changes[type(change).__name__] += 1
        self.trace(f"member {src.node_id} {what} at {p.first_index}")
        if isinstance(change, AddLearner):
            self._join(self.by_id[change.node_id], config)

    def _join(self, n: SimNode, config: Configuration) -> None:
        """Start ``n`` as the operator starts a joining node: an empty data directory
        (a removed node's is wiped first) and ``--peers`` naming the configuration's
        members, itself as a learner."""
        if n.core is not None:
            self._end_process(n)
        if n.directory.exists():
            n.wipes += 1
        shutil.rmtree(n.directory, ignore_errors=True)
        n.app_snapshot = None
        n.applied = -1
        voters = {i: m.addr for i, m in config.members.items() if m.voter}
        learners = {i: m.addr for i, m in config.members.items() if not m.voter}
        n.bootstrap = (voters, {**learners, n.node_id: self.addresses[n.node_id]})
        n.joined = True
        self.trace(f"join {n.node_id}")
        self.start(n)

    # ---- leadership transfers (issue 26) ----------------------------------------------

    def _transfer_sources(self) -> list[SimNode]:
        """Who an administrator asks to hand leadership over: the leader (running)."""
        return [
            n
            for n in self.nodes
            if n.core is not None and not n.paused and n.core.member_state.role is Role.LEADER
        ]

    def _fault_transfer(self) -> None:
        """Ask the leader to hand leadership to a live follower and, by the seed's weights
        (``TransferKnobs``), make it go wrong right after: the target crashes within a
        few ms, before the request (Raft's TimeoutNow) reaches it, so before it can
        campaign; or it is partitioned off from everyone (the request already in flight
        arrives, nothing it sends gets out); or the request to it is lost; or nothing
        happens. The outcome comes back as a ``TransferDone`` (``_on_ready``). Draws
        only from the transfers' own stream."""
        rng = self.transfer_rng
        sources = self._transfer_sources()
        if not sources:
            return
        src = rng.choice(sources)
        targets = [n for n in self.nodes if n is not src and n.core is not None]
        if not targets:
            return
        to = rng.choice(targets)
        kind = rng.choices(TRANSFER_KINDS, weights=self.transfer_knobs.weights)[0]
        self.transfers[f"{kind} asked"] += 1
        self.trace(f"transfer {src.node_id}->{to.node_id} {kind}")
        now = (src.node_id, to.node_id, None)
        if kind == "drop":
            self._transfer_drops[now] = 1
        try:
            tid = self.run(src, lambda c: c.transfer_leadership(to.node_id, self.now_ms))
        except DLedgerError as e:  # not leader, already transferring, target too far behind
            self.transfers[f"{kind} refused {e.code.name}"] += 1
            self.trace(f"transfer {src.node_id}->{to.node_id} refused {e.code.name}")
            return
        finally:
            self._transfer_drops.pop(now, None)
        self._transfer_kinds[(src.node_id, src.restarts, tid)] = kind
        more = ""
        if kind == "drop":  # the leader sends the request again while unanswered
            again = rng.choice((0, 2, None))  # how many of those are lost too (None: all)
            if again != 0:
                self._transfer_drops[(src.node_id, to.node_id, tid)] = again
            more = f", {'all' if again is None else again} more copies lost"
        self.trace(f"transfer {src.node_id}->{to.node_id} #{tid} running{more}")
        if kind == "crash":
            soon = rng.randint(0, self.knobs.delay_ms[0] - 1)  # before any delivery
            gen = to.restarts
            self.at(self.now_ms + soon, f"crash {to.node_id}", lambda: self._crash_target(to, gen))
        elif kind == "partition":
            ids = [n.node_id for n in self.nodes if n is not to]
            for other in ids:
                self.cut.update({(other, to.node_id), (to.node_id, other)})
            self.trace(f"partition {[to.node_id]} one_way=False")
            self.at(self.now_ms + rng.randint(200, 4000), "heal", self._heal_partition)

    def _lose_transfer_request(self, m: LeadershipTransferRequest) -> bool:
        """Whether the network loses this copy of a transfer's request (a "drop" transfer:
        the first copy, and some or all of those the leader sends again); none once
        faults stop (after healing the network loses nothing)."""
        if not self.faults_on:
            return False
        for key in ((m.local_id, m.remote_id, None), (m.local_id, m.remote_id, m.req_id)):
            if key in self._transfer_drops:
                left = self._transfer_drops[key]
                if left is None:
                    return True
                if left <= 1:
                    del self._transfer_drops[key]
                else:
                    self._transfer_drops[key] = left - 1
                return True
        return False

    def _crash_target(self, n: SimNode, generation: int) -> None:
        if n.core is None or n.restarts != generation or not self.faults_on:
            return
        self.crash(n)
        self.at(
            self.now_ms + self.transfer_rng.randint(100, 3000),
            f"restart {n.node_id}",
            lambda: self.start(n) if n.core is None else None,
        )

    # ---- liveness after healing (issue 26) ---------------------------------------------

    leader_what = "leader"  # what must exist, in the liveness failure's words
    ack_what = "append"  # what must be acknowledged

    def _live_leader(self) -> SimNode | None:
        """A node that leads and can take appends (the broker: a MASTER)."""
        for n in self.nodes:
            if n.core is not None and n.core.member_state.role is Role.LEADER:
                return n
        return None

    def _proposal_acknowledged(self) -> None:
        """A proposal of the workload committed: its client's acknowledgement here."""
        self._acknowledged()

    def _acknowledged(self) -> None:
        """An append was acknowledged to its client."""
        if self.healed_ms is not None and self.first_ack_ms is None:
            self.first_ack_ms = self.now_ms
            self.trace(f"liveness: first acknowledgement {self.now_ms - self.healed_ms} ms")

    def _note_leader(self) -> None:
        if self.healed_ms is None or self.first_leader_ms is not None:
            return
        n = self._live_leader()
        if n is not None:
            self.first_leader_ms = self.now_ms
            self.trace(f"liveness: {n.node_id} leads {self.now_ms - self.healed_ms} ms")

    def _liveness_status(self) -> str:
        """Each node's roles, for a liveness failure's message."""
        return "; ".join(self._node_liveness(n) for n in self.nodes)

    def _node_liveness(self, n: SimNode) -> str:
        if n.core is None or n.store is None:
            return f"{n.node_id} down"
        ms, store = n.core.member_state, n.store
        return (
            f"{n.node_id} {ms.role.value} term={ms.curr_term} leader={ms.leader_id} "
            f"transferee={ms.transferee} end={store.ledger_end_index} "
            f"committed={store.committed_index}"
        )

    def _check_leader_liveness(self) -> None:
        if self.first_leader_ms is None:
            self.checker.fail(
                f"{LIVENESS} no {self.leader_what} {LEADER_WITHIN_MS} ms after healing: "
                f"{self._liveness_status()}"
            )

    def _check_ack_liveness(self) -> None:
        if self.first_ack_ms is None:
            self.checker.fail(
                f"{LIVENESS} no {self.ack_what} acknowledged {ACK_WITHIN_MS} ms after healing: "
                f"{self._liveness_status()}"
            )

    def _fault_crash(self) -> None:
        alive = [n for n in self.nodes if n.core is not None]
        if not alive:
            return
        n = self.rng.choice(alive)
        self.crash(n)
        self.at(
            self.now_ms + self.rng.randint(100, 3000),
            f"restart {n.node_id}",
            lambda: self.start(n) if n.core is None else None,
        )

    def _fault_pause(self) -> None:
        alive = [n for n in self.nodes if n.core is not None and not n.paused]
        if not alive:
            return
        n = self.rng.choice(alive)
        n.paused = True
        self.trace(f"pause {n.node_id}")
        self.at(
            self.now_ms + self.rng.randint(100, 2500),
            f"resume {n.node_id}",
            lambda: self._resume(n, n.restarts),
        )

    def _resume(self, n: SimNode, generation: int) -> None:
        if n.core is None or n.restarts != generation or not n.paused:
            return
        n.paused = False
        self.trace(f"resume {n.node_id}")
        held, n.inbox = n.inbox, []
        closed, n.closed = n.closed, []
        for peer in closed:
            self._closed(n, peer, generation)
        for m in held:
            self._deliver(m)

    def _fault_partition(self) -> None:
        ids = [n.node_id for n in self.nodes]
        if len(ids) < 2:
            return
        side = set(self.rng.sample(ids, self.rng.randint(1, len(ids) // 2)))
        one_way = self.rng.random() < 0.3
        for a in ids:
            for b in ids:
                if (a in side) != (b in side) and not (one_way and a in side):
                    self.cut.add((a, b))
        self.trace(f"partition {sorted(side)} one_way={one_way}")
        self.at(self.now_ms + self.rng.randint(200, 4000), "heal", self._heal_partition)

    def _heal_partition(self) -> None:
        self.cut.clear()
        self.trace("heal")

    def _fault_clog(self) -> None:
        ids = [n.node_id for n in self.nodes]
        if len(ids) < 2:
            return
        a, b = self.rng.sample(ids, 2)
        self.clog[(a, b)] = self.rng.randint(100, 1500)
        self.trace(f"clog {a}->{b} {self.clog[(a, b)]}")
        self.at(
            self.now_ms + self.rng.randint(200, 3000), "unclog", lambda: self.clog.pop((a, b), None)
        )

    # ---- the run -----------------------------------------------------------------------

    def _advance(self, until_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        budget = 5_000_000  # bounded: no run processes more events than this
        while self._events and budget > 0:
            t, _, _, fn = self._events[0]
            if t > until_ms:
                break
            heapq.heappop(self._events)
            self.now_ms = t
            fn()
            self.checker.check()
            self._note_leader()
            budget -= 1
            if stop is not None and stop():
                return True
        self.now_ms = max(self.now_ms, until_ms)
        return False

    def execute(self) -> None:
        k = self.knobs
        self.trace(f"knobs {k}")
        if self.app:
            self.trace(f"app {self.app_knobs}")
        self.trace(f"connections {self.conn_knobs}")
        self.trace(f"transfers {self.transfer_knobs}")
        if self.member_knobs.per_s:
            self.trace(f"membership {self.member_knobs}")
        for n in self.nodes:
            if n.joined:
                self.start(n)
        self.at(1, "propose", self._propose)
        self.at(100, "fault", self._fault)
        self._advance(k.fault_ms)
        # liveness: heal everything and require a leader and convergence within a bound
        self.faults_on = False
        self.cut.clear()
        self.clog.clear()
        for n in self.nodes:
            if n.core is None and n.joined:
                self.start(n)
            elif n.paused:
                self._resume(n, n.restarts)
        self.trace("healed")
        self.healed_ms = self.now_ms
        self._note_leader()
        self.at(self.now_ms + LEADER_WITHIN_MS, "liveness", self._check_leader_liveness)
        self.at(self.now_ms + ACK_WITHIN_MS, "liveness", self._check_ack_liveness)
        deadline = self.now_ms + k.converge_ms
        self._advance(self._workload_end_ms)
        if not self._advance(deadline, self.converged):
            self.checker.fail(
                f"no convergence {k.converge_ms} ms after healing: "
                f"{[n.core.status() for n in self.nodes if n.core]}"
            )
        self.trace("converged")
        self.final_checks()

    def converged(self) -> bool:
        if self.first_ack_ms is None:
            return False  # the workload goes on until then
        cores = [n.core for n in self.nodes if n.joined]
        leaders = [c for c in cores if c is not None and c.member_state.role is Role.LEADER]
        if len(leaders) != 1:
            return False
        lead = leaders[0]
        end = lead.store.ledger_end_index
        cores = [n.core for n in self.members()]
        if any(c is None for c in cores):
            return False
        return all(
            c is not None
            and c.member_state.curr_term == lead.member_state.curr_term
            and c.member_state.leader_id == lead.member_state.self_id
            and c.store.ledger_end_index == end
            and c.store.committed_index == end
            for c in cores
        )

    def members(self) -> list[SimNode]:
        """The nodes of the leader's configuration (all of them without membership
        changes): removed nodes run on, and are neither converged nor compared."""
        lead = self._live_leader()
        if lead is None or lead.core is None:
            return list(self.nodes)
        config = lead.core.member_state.config
        return [n for n in self.nodes if n.node_id in config.members]

    def final_checks(self) -> None:
        members = self.members()
        stores = [n.store for n in members]
        assert all(s is not None for s in stores)
        first = stores[0]
        assert first is not None
        bodies = self.checker.committed_body
        for index, body in self.checker.acked.items():
            if index >= first.ledger_begin_index:
                if first.get(index).body != body:
                    self.checker.fail(f"acknowledged entry {index} lost or changed")
            elif bodies.get(index) != body:  # a snapshot covers it: the apps are checked
                self.checker.fail(f"acknowledged entry {index} was committed otherwise")
        for s in stores:
            assert s is not None
            s.sync()
        # Byte-identical from the highest log begin on (positions are the same everywhere)
        begin = max(s.ledger_begin_pos for s in stores if s is not None)
        end = first.ledger_end_pos
        images = [_data_image(n.directory, begin) for n in members]
        for n, img in zip(members, images, strict=True):
            if img[: end - begin] != images[0][: end - begin] or len(img) < end - begin:
                self.checker.fail(
                    f"{n.node_id}'s data files differ from {members[0].node_id}'s"
                    f" in [{begin}, {end})"
                )
            if img[end - begin :].count(0) != len(img) - (end - begin):
                self.checker.fail(f"{n.node_id}'s data files hold bytes after the log end {end}")
        if self.app:
            self._final_app_checks()

    def _final_app_checks(self) -> None:
        """Every application applied every committed entry, to the same state, and that
        state is the fold of the committed bodies (an install carried it correctly)."""
        members = self.members()
        committed = members[0].store.committed_index if members[0].store else -1
        ref = SimApp()
        bodies = self.checker.committed_body
        for i in range(committed + 1):
            if i not in bodies:
                self.checker.fail(f"committed entry {i} was never seen by the checker")
            body = bodies[i]
            ref = SimApp(i, ref.count + (body is not None), ref.digest)
            if body is not None:
                ref = replace(ref, digest=zlib.crc32(body, ref.digest))
        for n in members:
            if n.app != ref:
                self.checker.fail(f"{n.node_id}'s application is {n.app}, the log gives {ref}")

    def close(self) -> None:
        for n in self.nodes:
            if n.store is not None:
                n.store.close()


def _describe(m: RaftMessage) -> str:
    kind = type(m).__name__
    if isinstance(m, PushEntryRequest):
        return f"{kind} {m.type.name} t={m.term} #{m.req_id} first={m.first_index} n={m.count}"
    if isinstance(m, InstallSnapshotRequest):
        return (
            f"{kind} t={m.term} #{m.req_id} last={m.last_included_index} pos={m.next_pos}"
            f" bytes={m.offset}+{len(m.data)}/{m.total}"
        )
    code = getattr(m, "code", None) or getattr(m, "vote_result", None)
    return f"{kind} t={m.term} #{m.req_id} {getattr(code, 'name', '')}"


def _zero_from(f: Path, rel: int) -> None:
    size = f.stat().st_size
    rel = max(rel, 0)
    if rel >= size:
        return
    with f.open("r+b") as fh:
        fh.seek(rel)
        fh.write(bytes(size - rel))


def _data_image(d: Path, from_pos: int = 0) -> bytes:
    """The data files' bytes from position ``from_pos`` on (segments are contiguous)."""
    out = bytearray()
    for f in sorted((d / "data").iterdir()):
        start = int(f.name)
        raw = f.read_bytes()
        lo = max(from_pos - start, 0)
        if lo < len(raw):
            if start + lo != from_pos + len(out):
                raise InvariantViolationError(f"{d}: no data at [{from_pos + len(out)}, {start})")
            out += raw[lo:]
    return bytes(out)


def plant_stuck_transferee(setattr_: Callable[[Any, str, Any], None]) -> None:
    """Issue 26's symptom as a planted bug, for tests (pass ``monkeypatch.setattr``): a
    leadership transfer that fails leaves ``member_state.transferee`` set, so its leader
    refuses every append (LEADER_TRANSFERRING) for as long as it leads in that term. It
    wraps the core's output, ``ready()``, so whatever ends the transfer (the transferee's
    answer, ``_expire_transfers``: its silence or the deadline, its lost connection) the
    leader keeps the transferee it had."""
    real_transfer, real_ready = DLedgerCore.transfer_leadership, DLedgerCore.ready
    running: weakref.WeakKeyDictionary[DLedgerCore, dict[int, tuple[str, int]]]
    running = weakref.WeakKeyDictionary()  # core -> transfer id -> (target, term)

    def transfer_leadership(core: DLedgerCore, to: str, now_ms: int) -> int:
        transfer_id = real_transfer(core, to, now_ms)
        running.setdefault(core, {})[transfer_id] = (to, core.member_state.curr_term)
        return transfer_id

    def ready(core: DLedgerCore) -> Ready:
        r = real_ready(core)
        ms = core.member_state
        for done in r.transfers:
            to, term = running.get(core, {}).pop(done.transfer_id, (None, -1))
            failed = done.code is not DLedgerCode.SUCCESS
            if failed and to is not None and ms.role is Role.LEADER and ms.curr_term == term:
                ms.transferee = to
        return r

    setattr_(DLedgerCore, "transfer_leadership", transfer_leadership)
    setattr_(DLedgerCore, "ready", ready)


def plant_promote_every_learner(setattr_: Callable[[Any, str, Any], None]) -> None:
    """A bug in the change rule, for tests (pass ``monkeypatch.setattr``): promoting one
    learner promotes every learner, so one change can add two voters and a majority of
    the old configuration need not overlap one of the new."""
    real = core_node.check_change

    def check_change(config: Configuration, change: MembershipChange, leader_id: str) -> Any:
        new = real(config, change, leader_id)
        if isinstance(change, Promote):
            members = {i: replace(m, voter=True) for i, m in new.members.items()}
            new = Configuration.checked(members)
        return new

    setattr_(core_node, "check_change", check_change)


def sim_root() -> Path:
    """A scratch directory on tmpfs when there is one: fsync there costs nothing."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="ledgermq-sim-", dir=base))


def run_seed(
    seed: int,
    *,
    fault_ms: int = 8_000,
    verbose: bool = False,
    app: bool = True,
    transfers: bool = True,
    membership: bool = False,
) -> Simulation:
    """Run one seed; ``transfers=False``: no leadership transfers (``TransferKnobs``);
    ``membership=True``: membership changes (``MemberKnobs``)."""
    root = sim_root()
    sim = Simulation(
        seed,
        root,
        fault_ms=fault_ms,
        verbose=verbose,
        app=app,
        transfers=transfers,
        membership=membership,
    )
    try:
        sim.execute()
    except BaseException as e:
        e.add_note(f"replay: {replay_command(seed, fault_ms, transfers, membership)}")
        raise
    finally:
        sim.close()
        shutil.rmtree(root, ignore_errors=True)
    return sim
