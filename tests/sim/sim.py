"""A deterministic simulator: whole DLedger clusters in one thread (TigerBeetle's VOPR).

The real core (:class:`~dledger.core.node.DLedgerCore`) and the real file store
(:class:`~dledger.store.file_store.FileStore`, its flush thread off) run against a seeded
network (loss, delay and so reordering, duplication, symmetric and asymmetric
partitions, clogged links), a seeded disk (a crash loses every unsynced byte except a
torn prefix of the last write) and a seeded schedule of crashes, restarts and pauses.
One ``random.Random(seed)`` derives every knob; time is simulated milliseconds.

After every event the invariants are checked (``Checker``); after the fault phase the
cluster is healed and must elect a leader and converge within a bound, ending with
byte-identical data files. ``trace_digest`` hashes the whole event trace: the same seed
gives the same digest. A failure names the command that replays its seed.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import Message, PushEntryRequest, Role
from dledger.core.node import DLedgerCore, Ready
from dledger.core.settings import CoreSettings
from dledger.runtime.ready import deliver_ready, persist_ready
from dledger.store import FileStore, StoreSettings

TICK_MS = 10
STORE = StoreSettings(
    data_file_size=16 * 1024,
    index_file_size=1024,
    clean_interval_ms=3_600_000,
    checkpoint_interval_ms=3_600_000,
)


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m tests.sim --seed {seed} --verbose"


class InvariantViolationError(AssertionError):
    pass


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
class SimNode:
    node_id: str
    directory: Path
    store: FileStore | None = None
    core: DLedgerCore | None = None
    paused: bool = False
    inbox: list[Message] = field(default_factory=list)  # held while paused
    restarts: int = 0
    applied: int = -1  # the highest committed index this incarnation reported

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
        self.max_committed = max(self.max_committed, new)
        term = node.core.ms.curr_term if node.core is not None else -1
        self.committed_in_term[term] = max(self.committed_in_term.get(term, -1), new)

    def on_acked(self, first_index: int, bodies: Iterable[bytes]) -> None:
        for k, body in enumerate(bodies):
            self.acked[first_index + k] = body

    def check(self) -> None:
        alive = [n for n in self.sim.nodes if n.core is not None and n.store is not None]
        for n in alive:
            core, store = n.core, n.store
            assert core is not None and store is not None
            if core.ms.role is Role.LEADER:
                self._check_leader(n, core, store)
            else:
                self.leader_mark.pop(n.node_id, None)
        self._check_log_matching(alive)

    def _check_leader(self, n: SimNode, core: DLedgerCore, store: FileStore) -> None:
        term = core.ms.curr_term
        other = self.leader_of_term.setdefault(term, n.node_id)
        if other != n.node_id:
            self.fail(f"two leaders in term {term}: {other} and {n.node_id}")
        mark = self.leader_mark.get(n.node_id)
        if mark is not None and mark[0] == term:
            _, idx, chain = mark
            if store.ledger_end_index < idx or store.get(idx).chain_crc != chain:
                self.fail(f"leader {n.node_id} overwrote its log at {idx} in term {term}")
        end = store.ledger_end_index
        if end >= 0:
            self.leader_mark[n.node_id] = (term, end, store.get(end).chain_crc)
        # Leader completeness (§5.4.1): entries committed by the time of this term
        c = max((i for t, i in self.committed_in_term.items() if t <= term), default=-1)
        if c >= 0 and (end < c or (store.get(c).term, store.get(c).chain_crc) != self.committed[c]):
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


class Simulation:
    def __init__(self, seed: int, root: Path, *, fault_ms: int = 8_000, verbose: bool = False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.knobs = Knobs.from_rng(self.rng, fault_ms)
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
        self.nodes = [SimNode(i, root / i) for i in ids]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.cut: set[tuple[str, str]] = set()
        self.clog: dict[tuple[str, str], int] = {}
        self.checker = Checker(self)
        self.proposals: dict[tuple[str, int, int], list[bytes]] = {}
        self._body_seq = itertools.count()
        self.faults_on = True
        self.settings = CoreSettings()

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
        n.store = FileStore(n.directory, STORE, background=False)
        n.core = DLedgerCore(
            group="g0",
            self_id=n.node_id,
            peers=self.peers,
            store=n.store,
            rng=random.Random(self.rng.getrandbits(64)),
            settings=self.settings,
            now_ms=self.now_ms,
        )
        self.trace(f"start {n.node_id} end={n.store.ledger_end_index} term={n.core.ms.curr_term}")
        self.at(
            self.now_ms + self.rng.randint(1, TICK_MS),
            f"tick {n.node_id}",
            lambda: self._tick(n, n.restarts),
        )

    def crash(self, n: SimNode, *, mid_ready: bool = False) -> None:
        store = n.store
        assert store is not None
        synced_data, synced_index = store.data_flushed_pos, store.index_flushed_pos
        end_pos = store.ledger_end_pos
        store.abandon()
        n.store = n.core = None
        n.paused = False
        n.inbox.clear()
        n.restarts += 1
        torn = self._lose_unsynced(n.directory, synced_data, end_pos, synced_index)
        self.trace(f"crash {n.node_id} mid_ready={mid_ready} torn={torn}")

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
                self.checker.on_hard_state(n.node_id, hs.term, hs.voted_for)
            old_commit = n.applied
            synced = persist_ready(store, ready, sync_log=True)
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
        for rc in r.role_changes:
            self.trace(f"role {n.node_id} {rc.role.value} term={rc.term} leader={rc.leader_id}")

    # ---- network -----------------------------------------------------------------------

    def send(self, src: SimNode, msgs: Iterable[Message]) -> None:
        k = self.knobs
        for m in msgs:
            dst = m.remote_id
            if self.faults_on and ((src.node_id, dst) in self.cut or self.rng.random() < k.loss):
                continue
            copies = 2 if self.faults_on and self.rng.random() < k.dup else 1
            for _ in range(copies):
                delay = self.rng.randint(*k.delay_ms) + self.clog.get((src.node_id, dst), 0)
                self.at(self.now_ms + delay, "deliver", lambda m=m: self._deliver(m))

    def _deliver(self, m: Message) -> None:
        n = self.by_id[m.remote_id]
        if n.core is None:
            return
        if n.paused:
            n.inbox.append(m)
            return
        self.trace(f"recv {m.remote_id}<-{m.local_id} {_describe(m)}")
        self.run(n, lambda c: c.step(m, self.now_ms))

    # ---- workload ----------------------------------------------------------------------

    def _propose(self) -> None:
        leaders = [
            n
            for n in self.nodes
            if n.core is not None and not n.paused and n.core.ms.role is Role.LEADER
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
        if self.faults_on or self.now_ms < self._workload_end_ms:
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
        self.at(self.now_ms + 100, "fault", self._fault)

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
            budget -= 1
            if stop is not None and stop():
                return True
        self.now_ms = max(self.now_ms, until_ms)
        return False

    def execute(self) -> None:
        k = self.knobs
        self.trace(f"knobs {k}")
        for n in self.nodes:
            self.start(n)
        self._workload_end_ms = k.fault_ms + 2000
        self.at(1, "propose", self._propose)
        self.at(100, "fault", self._fault)
        self._advance(k.fault_ms)
        # liveness: heal everything and require a leader and convergence within a bound
        self.faults_on = False
        self.cut.clear()
        self.clog.clear()
        for n in self.nodes:
            if n.core is None:
                self.start(n)
            elif n.paused:
                self._resume(n, n.restarts)
        self.trace("healed")
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
        cores = [n.core for n in self.nodes]
        if any(c is None for c in cores):
            return False
        leaders = [c for c in cores if c is not None and c.ms.role is Role.LEADER]
        if len(leaders) != 1:
            return False
        lead = leaders[0]
        end = lead.store.ledger_end_index
        return all(
            c is not None
            and c.ms.curr_term == lead.ms.curr_term
            and c.ms.leader_id == lead.ms.self_id
            and c.store.ledger_end_index == end
            and c.store.committed_index == end
            for c in cores
        )

    def final_checks(self) -> None:
        stores = [n.store for n in self.nodes]
        assert all(s is not None for s in stores)
        first = stores[0]
        assert first is not None
        for index, body in self.checker.acked.items():
            if first.get(index).body != body:
                self.checker.fail(f"acknowledged entry {index} lost or changed")
        for s in stores:
            assert s is not None
            s.sync()
        images = [_data_image(n.directory) for n in self.nodes]
        for n, img in zip(self.nodes[1:], images[1:], strict=True):
            if img != images[0]:
                self.checker.fail(f"{n.node_id}'s data files differ from {self.nodes[0].node_id}'s")

    def close(self) -> None:
        for n in self.nodes:
            if n.store is not None:
                n.store.close()


def _describe(m: Message) -> str:
    kind = type(m).__name__
    if isinstance(m, PushEntryRequest):
        return f"{kind} {m.type.name} t={m.term} #{m.req_id} first={m.first_index} n={m.count}"
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


def _data_image(d: Path) -> list[tuple[str, bytes]]:
    return [(f.name, f.read_bytes()) for f in sorted((d / "data").iterdir())]


def sim_root() -> Path:
    """A scratch directory on tmpfs when there is one: fsync there costs nothing."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="ledgermq-sim-", dir=base))


def run_seed(seed: int, *, fault_ms: int = 8_000, verbose: bool = False) -> Simulation:
    root = sim_root()
    sim = Simulation(seed, root, fault_ms=fault_ms, verbose=verbose)
    try:
        sim.execute()
    except BaseException as e:
        e.add_note(f"replay: {replay_command(seed)}")
        raise
    finally:
        sim.close()
        shutil.rmtree(root, ignore_errors=True)
    return sim
