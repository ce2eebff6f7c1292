"""One chaos run, start to verdict: ``run_chaos(seed, duration_s, workdir)``.

1. The cluster (``ChaosCluster``: namespaces, tmpfs, three broker processes), the
   topic and the POP group (``pop_plan(seed)``); the workload starts.
2. The nemesis runs the seed's schedule in a thread (its faults block: processes,
   ``ip``), while the workload runs on the event loop; both write one history. A stall
   (``tests/chaos/stall.py``: no produce acknowledged for ``STALL_S`` while the cluster
   should take writes) makes the run INVALID and ends the schedule.
3. The workload stops, then everything is healed (every node running, every link up,
   every ballast gone), the delay messages still due are awaited (``wait_for_delays``:
   every one certain to be delivered is in the topic, every one sent is due, within
   ``DELAYS_S``), the POP group is drained (``drain_pop``: received and acked
   until every node says its lag is 0, within ``POP_DRAIN_S``), the transactions are
   resolved (``resolve_transactions``: the checker thread answers checks until no node
   has one pending, within ``TX_RESOLVE_S``), and the cluster must
   converge within ``CONVERGE_S``: every node ready, one master, the same ledger end,
   committed and dispatched on every node.
4. Every queue is drained from every node (``ledgermq.replicas.read_queues``) into the
   history, the transactions' topic too, every node's group offsets, POP lag and
   pending transactions read, and the POP group's dead
   letters from the master: the checker decides over all of it. The consume queues'
   digests over HTTP must be equal on every node.
5. The nodes stop (SIGTERM: files synced), and their commitlogs and consume queues are
   compared byte for byte (``ledgermq.replicas``).

A run ends within ``run_bound_s(duration_s)`` whatever the cluster does: each phase
runs under the ``Supervisor`` (``tests/chaos/control.py``) with the bound below, and is
left when it passes (the run is then INVALID, and names the phase); the schedule stops
starting steps at its own deadline, and a step still under way ``STEP_GRACE_S`` later
is abandoned. SIGINT, SIGTERM and SIGHUP stop the run the same way, at once. Whatever
ends the run (its end, a signal, a phase over its bound, an exception), the nodes are
killed or stopped and the mounts and namespaces removed before ``run_chaos`` returns.

Every run's first line says its seed, its bound and the command that replays it; the
history is written to ``workdir/history.jsonl`` and the nodes' logs to
``workdir/logs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ledgermq.client import AsyncAdmin
from ledgermq.demo.load import ensure_topic, percentile, topic_ends
from ledgermq.replicas import (
    TreeComparison,
    commitlog_roots,
    compare_commitlog_ranges,
    compare_commitlogs,
    compare_consume_queues,
    consume_queue_roots,
    read_queues,
)

from .checker import Verdict, check, summary
from .cluster import ChaosCluster
from .control import HaltedError, Supervisor, in_thread
from .history import History, dump
from .nemesis import Nemesis, Step, schedule
from .pop_workload import (
    configure_group,
    drain_pop,
    pop_plan,
    read_dead_letters,
    report_pop_lag,
)
from .stall import STALL_S, StallWatcher, describe, http_fetch, stalls
from .tx_workload import drain_transactions, resolve_transactions
from .workload import Workload, WorkloadSettings, reads, report_offsets, wait_for_delays

# Each phase's bound, in seconds (a phase over its bound is left and the run INVALID).
OPEN_S = 45.0  # namespaces, mounts, three processes started (never left half-way)
START_S = 120.0  # every node ready with one master
TOPIC_S = 30.0  # the topic created (the client's deadline, 20 s, and its cleanup)
POP_GROUP_S = 30.0  # the POP group configured, likewise
RECOVERY_SHARE = 0.5  # the steps' recovery waits may add this share of the duration,
RECOVERY_S = 60.0  # and this: the schedule's deadline, where it stops starting steps
STEP_GRACE_S = 30.0  # a step still under way this long after that is abandoned
WORKLOAD_STOP_S = WorkloadSettings().stop_s  # the clients' last operations
LOAD_END_S = 10.0  # the watcher, the load's tasks, the loop's close
HEAL_S = 30.0  # every fault undone, every node running
DELAYS_S = 30.0  # the delay messages still due delivered (they are due within 3 s)
POP_DRAIN_S = 60.0  # the POP group received and acked until its lag is 0 everywhere
# Every transaction resolved: the broker's last check comes 5 s after a begin
# (tests/chaos/tx_workload.py), an answer may take the client's deadline (20 s).
TX_RESOLVE_S = 30.0
CONVERGE_S = 90.0
LOOK_S = 15.0  # convergence's last look and the ledger spans (2 s per node each)
DRAIN_S = 60.0  # every queue from every node, the digests, the group offsets
STOP_S = 35.0  # SIGTERM to every node, SIGKILL 20 s later
COMPARE_S = 30.0  # the files, byte for byte (at most 3 x 256 MiB of tmpfs)
CLEANUP_S = 45.0  # kill, unmount, namespaces (each command bounded: tests/netns.py)
MARGIN_S = 1.0  # per phase: the supervisor's look, a bounded loop's last turn


def schedule_s(duration_s: float) -> float:
    """From the load's start to the schedule's deadline."""
    return duration_s * (1 + RECOVERY_SHARE) + RECOVERY_S


def load_s(duration_s: float) -> float:
    return schedule_s(duration_s) + STEP_GRACE_S + WORKLOAD_STOP_S + LOAD_END_S


def phase_bounds_s(duration_s: float) -> dict[str, float]:
    """Each phase of a run, in order, and its bound."""
    return {
        "start of the cluster": OPEN_S,
        "wait for a master": START_S + TOPIC_S + POP_GROUP_S,
        "load": load_s(duration_s),
        "heal": HEAL_S,
        "delay messages due": DELAYS_S + LOAD_END_S,
        "POP drain": POP_DRAIN_S + LOAD_END_S,
        "transactions resolved": TX_RESOLVE_S + WORKLOAD_STOP_S + LOAD_END_S,
        "convergence": CONVERGE_S + LOOK_S,
        "drain": DRAIN_S + TOPIC_S,
        "stop of the nodes": STOP_S,
        "comparison": COMPARE_S,
    }


def run_bound_s(duration_s: float) -> float:
    """The longest a run of ``duration_s`` takes, start to cleanup, whatever the
    cluster does: every phase's bound, the settling of one halted phase (the start's is
    the longest), the cleanup."""
    phases = phase_bounds_s(duration_s)
    return sum(phases.values()) + MARGIN_S * len(phases) + OPEN_S + CLEANUP_S


def replay_command(seed: int, duration_s: float) -> str:
    return f"python -m tests.chaos --seed {seed} --duration {duration_s:g}"


@dataclass(slots=True)
class RunResult:
    seed: int
    duration_s: float
    verdict: Verdict = field(default_factory=Verdict)
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # beyond the checker's anomalies
    stalls: list[str] = field(default_factory=list)  # each longer than STALL_S, described
    replicas: list[str] = field(default_factory=list)
    # node → (ledger begin index, ledger end index), once converged
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    schedule: str = "not started"  # how far the nemesis got
    drained: bool = False  # every node drained into the history: the checker can decide
    stopped: str | None = None  # why the run stopped early (a signal, a phase's bound)
    signal: int | None = None  # the signal that stopped it
    elapsed_s: float = 0.0

    @property
    def valid(self) -> bool:
        return (
            self.drained
            and self.stopped is None
            and self.verdict.valid
            and not self.problems
            and not self.stalls
        )


def run_chaos(seed: int, duration_s: float, workdir: Path, say: Callable[[str], None] = print,
              *, catch_signals: bool = True) -> RunResult:  # fmt: skip
    """One run (see the module). With ``catch_signals`` (main thread only), SIGINT,
    SIGTERM and SIGHUP stop it early (``RunResult.signal``), cleaned up."""
    say(
        f"chaos seed {seed}, {duration_s:g} s (ends within {run_bound_s(duration_s):.0f} s "
        f"whatever the cluster does); replay: {replay_command(seed, duration_s)}"
    )
    t0 = time.monotonic()
    result = RunResult(seed, duration_s)
    sup = Supervisor(say)
    run = _Run(ChaosCluster(workdir / "data", workdir / "logs"), History(), result, sup, say)
    with sup.catching_signals() if catch_signals else contextlib.nullcontext():
        try:
            run.phases(workdir)
        except HaltedError:
            pass  # the reason is the supervisor's
        except Exception as e:
            result.problems.append(f"the run failed during the {sup.phase}: {e!r}")
            say(traceback.format_exc())
        except BaseException as e:  # pytest's timeout; KeyboardInterrupt if not caught
            sup.halt(f"{type(e).__name__} during the {sup.phase}")
            raise
        finally:
            run.clean_up()
            dump(list(run.history.ops), workdir / "history.jsonl")
            sup.poll()  # a signal during the cleanup counts too
    ops = list(run.history.ops)
    result.schedule = run.schedule_line()
    result.stopped, result.signal = sup.reason, sup.signal
    result.verdict = check(ops)
    result.faults = Counter(op.value["kind"] for op in ops if op.f == "fault")
    result.stalls = run.stalls(ops)
    result.elapsed_s = time.monotonic() - t0
    return result


class _Run:
    """One run's phases (``phases``), each under the supervisor; ``clean_up`` after."""

    def __init__(self, cluster: ChaosCluster, history: History, result: RunResult,
                 sup: Supervisor, say: Callable[[str], None]) -> None:  # fmt: skip
        self.cluster = cluster
        self.history = history
        self.result = result
        self.sup = sup
        self.say = say
        self.settings = WorkloadSettings(pop=pop_plan(result.seed))
        self.nemesis = Nemesis(cluster, history, say=say)
        self.load_start_s: float | None = None  # history times
        self.load_end_s: float | None = None
        self.wall_start = 0.0
        self.watcher: StallWatcher | None = None

    def phases(self, workdir: Path) -> None:
        c, r, sup = self.cluster, self.result, self.sup
        bound = phase_bounds_s(r.duration_s)
        # Never left half-way (what it creates must be known to be removed).
        sup.run("start of the cluster", c.open, bound["start of the cluster"], settle_s=OPEN_S)
        first = sup.run("wait for a master", self._ready, bound["wait for a master"])
        self.say(f"cluster up in namespaces {c.lab.name}-*; master {first}")
        sup.run("load", lambda: asyncio.run(self._load()), bound["load"])
        sup.run("heal", self.nemesis.heal_all, bound["heal"])
        delays = lambda: asyncio.run(self._wait_for_delays())  # noqa: E731
        sup.run("delay messages due", delays, bound["delay messages due"])
        sup.run("POP drain", lambda: asyncio.run(self._drain_pop()), bound["POP drain"])
        resolve = lambda: asyncio.run(self._resolve_transactions())  # noqa: E731
        sup.run("transactions resolved", resolve, bound["transactions resolved"])
        master = sup.run("convergence", self._converge, bound["convergence"])
        if master is None:
            r.problems.append(f"the cluster did not converge within {CONVERGE_S:g} s")
        else:
            self.say(f"converged; master {master}; draining every node")
            sup.run("drain", lambda: asyncio.run(self._drain(master)), bound["drain"])
        sup.run("stop of the nodes", lambda: c.stop_all(timeout_s=20), bound["stop of the nodes"])
        compare = lambda: _compare_files(c, r, workdir / "differ")  # noqa: E731
        sup.run("comparison", compare, bound["comparison"])

    def clean_up(self) -> None:
        """Everything the run created goes, whatever the phases left running."""
        self.sup.phase = "cleanup"
        if self.sup.halted.is_set():
            self.cluster.kill_all()  # nothing to sync: the files will not be compared
        self.cluster.close()

    def _ready(self) -> str:
        s = self.settings
        master = self.cluster.wait_ready(None, START_S)
        brokers = list(self.cluster.urls.values())
        asyncio.run(ensure_topic(brokers, s.topic, s.queues, s.client))
        asyncio.run(ensure_topic(brokers, s.tx.topic, s.tx.queues, s.client))
        asyncio.run(configure_group(brokers, s.pop, s.topic, self.history, s.client))
        self.say(f"POP group {s.pop}")
        return master

    # ---- the load --------------------------------------------------------------------------

    async def _load(self) -> None:
        """The workload, the watcher and the nemesis until the schedule ends; halting the
        run cancels it here and now."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        with self.sup.on_halt(cancel):
            try:
                await self._load_under_way()
            except asyncio.CancelledError:
                if not self.sup.halted.is_set():
                    raise

    async def _load_under_way(self) -> None:
        c, h, r = self.cluster, self.history, self.result
        steps = schedule(r.seed, r.duration_s)
        workload = Workload(c.urls, self.settings, h, random.Random(r.seed),
                            random.Random(f"{r.seed}/tx"),
                            random.Random(f"{r.seed}/stale"))  # fmt: skip
        stop = threading.Event()  # the schedule's end: its deadline, a stall, a halt
        self.load_start_s, self.wall_start = h.clock(), time.time()
        deadline_s = time.monotonic() + schedule_s(r.duration_s)
        self.say(f"load: {len(steps)} steps; the schedule ends by {schedule_s(r.duration_s):.0f} s")
        async with httpx.AsyncClient(timeout=2.0) as http:
            watcher = StallWatcher(
                h, c.urls, c.log_dir, start_s=self.load_start_s, fetch=http_fetch(http),
                node_state=lambda n: _node_state(c, n), on_stall=lambda _s: stop.set(),
                say=self.say,
            )  # fmt: skip
            self.watcher = watcher
            workload.start()
            watch = asyncio.create_task(watcher.run(stop.is_set))
            try:
                r.problems += await run_schedule(self.nemesis, steps, stop, deadline_s)
            finally:
                stop.set()
                self.load_end_s = h.clock()
                if self.sup.halted.is_set():
                    await workload.cancel()
                else:
                    await workload.stop()
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        if (e := workload.failed()) is not None:
            r.problems.append(f"a workload task failed: {e!r}")
        r.problems += [f"not whole again after {u}" for u in self.nemesis.unhealed]

    def schedule_line(self) -> str:
        """How far the nemesis got, and why it ended there."""
        n = self.nemesis
        if self.watcher is None:
            return "not started"
        if self.watcher.flagged is not None:
            ended = "stopped by the stall"
        elif n.ended is None:
            ended = "abandoned under way"
        elif n.ended == "stopped" and self.sup.halted.is_set():
            ended = "stopped: the run halted"
        else:
            ended = n.ended
        return f"{n.done} of {n.scheduled} steps done ({ended})"

    def stalls(self, ops: Sequence[Any]) -> list[str]:
        """Each stall of the load, described with the nodes' roles from its dumps."""
        if self.load_start_s is None:
            return []
        end_s = self.load_end_s or self.sup.halted_s or (ops[-1].time_s if ops else 0.0)
        found = stalls(ops, self.load_start_s, end_s, STALL_S)
        snapshots = self.watcher.snapshots if self.watcher is not None else []
        return [describe(s, snapshots, self.load_start_s, self.wall_start) for s in found]

    # ---- the end ---------------------------------------------------------------------------

    async def _wait_for_delays(self) -> None:
        t0 = time.monotonic()
        ops = list(self.history.ops)
        try:
            async with asyncio.timeout(DELAYS_S):
                awaited, seen = await wait_for_delays(self.cluster.urls, self.settings, ops,
                                                      DELAYS_S)  # fmt: skip
        except TimeoutError:
            awaited, seen = -1, -1
        self.say(
            f"delay messages: {seen} of the {awaited} certain to be delivered seen, in "
            f"{time.monotonic() - t0:.1f} s"
        )

    async def _drain_pop(self) -> None:
        s, t0 = self.settings, time.monotonic()
        try:
            async with asyncio.timeout(POP_DRAIN_S):
                drained = await drain_pop(self.cluster.urls, s.pop, s.topic, s.queues,
                                          self.history, POP_DRAIN_S)  # fmt: skip
        except TimeoutError:
            drained = False
        if drained:
            self.say(f"POP group drained in {time.monotonic() - t0:.1f} s")
        else:
            self.result.problems.append(f"the POP group's lag was not 0 within {POP_DRAIN_S:g} s")

    async def _resolve_transactions(self) -> None:
        s, t0 = self.settings, time.monotonic()
        try:
            async with asyncio.timeout(TX_RESOLVE_S + WORKLOAD_STOP_S):
                pending = await resolve_transactions(self.cluster.urls, s.tx, s.client, s.probe,
                                                     self.history, TX_RESOLVE_S)  # fmt: skip
        except TimeoutError:
            pending = None
        if pending is None:  # (the checker says which, from the drain)
            self.say(f"transactions: some still pending after {TX_RESOLVE_S:g} s")
        else:
            self.say(
                f"transactions: the {pending} pending resolved in {time.monotonic() - t0:.1f} s"
            )

    def _converge(self) -> str | None:
        c = self.cluster
        master = converge(c, CONVERGE_S, self.sup.halted)
        for node in c.ids if master is not None else ():
            info = c.cluster_info(node)
            if info is not None:
                self.result.spans[node] = (info["ledger_begin_index"], info["ledger_end_index"])
        return master

    async def _drain(self, master: str) -> None:
        try:
            async with asyncio.timeout(DRAIN_S):
                await _drain(self.cluster, master, self.settings, self.history, self.result)
        except TimeoutError:
            self.result.problems.append(f"the drain did not end within {DRAIN_S:g} s")
            return
        self.result.drained = True


def _node_state(c: ChaosCluster, node: str) -> str | None:
    if node in c.paused:
        return "paused"
    return None if c.alive(node) else "not running"


async def run_schedule(nemesis: Nemesis, steps: list[Step], stop: threading.Event,
                       deadline_s: float, grace_s: float = STEP_GRACE_S) -> list[str]:  # fmt: skip
    """``nemesis`` runs ``steps`` in a thread of its own until the monotonic
    ``deadline_s`` (or ``stop``); a step still under way ``grace_s`` after the deadline
    is abandoned (the thread ends by itself: each of its calls is bounded) and named in
    the problems returned."""
    run = in_thread(lambda: nemesis.run(steps, stop, deadline_s), "chaos-nemesis")
    try:
        await asyncio.wait_for(run, max(0.0, deadline_s + grace_s - time.monotonic()))
    except TimeoutError:
        stuck = nemesis.current or "its heal"
        return [f"the nemesis was stuck in {stuck} {grace_s:g} s past its deadline: abandoned"]
    finally:
        stop.set()
    return []


def converge(cluster: ChaosCluster, timeout_s: float,
             halted: threading.Event | None = None) -> str | None:  # fmt: skip
    """Wait (bounded; ``halted`` ends it early) until every node is ready with one
    master, and every node's ledger end, committed and dispatched index are the same;
    the master, or None."""
    halted = halted or threading.Event()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not halted.is_set():
        infos = {n: cluster.cluster_info(n) for n in cluster.ids}
        if all(i is not None for i in infos.values()):
            masters = [n for n, i in infos.items() if i and i["broker_role"] == "MASTER"]
            marks = {
                (i["ledger_end_index"], i["committed_index"], i["dispatched_index"])
                for i in infos.values()
                if i is not None
            }
            if len(masters) == 1 and len(marks) == 1 and len(set(next(iter(marks)))) == 1:
                return masters[0]
        halted.wait(0.2)
    return None


async def _drain(cluster: ChaosCluster, master: str, s: WorkloadSettings, history: History,
                 result: RunResult) -> None:  # fmt: skip
    """Every queue from every node into the history; digests compared; offsets read."""
    ends = await topic_ends(cluster.urls[master], s.topic, s.client)
    ranges = {q: (0, end) for q, end in ends.items()}
    images = {}
    for node, url in cluster.urls.items():
        got: list[Any] = []
        images[node] = await read_queues(url, s.topic, ranges, s.client, got.append)
        history.ok("drain", "drain", reads(got), node)
    ref = images[master]
    for node, image in images.items():
        if image != ref:
            result.problems.append(f"{node}'s consume queues differ from {master}'s over HTTP")
    for node, url in cluster.urls.items():
        async with AsyncAdmin([url], settings=s.probe) as admin:
            await report_offsets(history, s, node, admin)
            await report_pop_lag(admin, s.pop, s.topic, history, node)
    await read_dead_letters(cluster.urls[master], s.pop, history, s.client, master)
    tx_images = await drain_transactions(cluster.urls, master, s.tx, s.client, s.probe, history)
    for node, image in tx_images.items():
        if image != tx_images[master]:
            result.problems.append(
                f"{node}'s transactions' topic differs from {master}'s over HTTP"
            )


def _compare_files(cluster: ChaosCluster, result: RunResult, evidence: Path) -> None:
    """The commitlogs over the entries every node holds, and the consume queues, must be
    byte-identical; whole commitlog files may differ before a node's log head (retention
    and snapshot installs move it), which is reported, not held against the run."""
    dirs = {n: cluster.data_dir / n for n in cluster.ids}
    g = cluster.group
    ends = {end for _, end in result.spans.values()}
    if len(result.spans) == len(dirs) and len(ends) == 1:
        begin = max(b for b, _ in result.spans.values())
        cmp = compare_commitlog_ranges(dirs, g, begin, ends.pop())
        _replicas_line(result, cmp, f"{cmp.files:,} entries")
    else:
        result.problems.append(f"no common ledger end to compare the commitlogs: {result.spans}")
    whole = compare_commitlogs(dirs, g)
    result.replicas.append(
        f"commitlog files: {whole.files} files, {whole.total_bytes:,} bytes, "
        + ("identical" if whole.identical else "differ before some node's log head")
        + f"; ledger [begin, end] per node: {result.spans}"
    )
    if not whole.identical:  # for the post-mortem, should the range compare fail too
        _keep_evidence(whole.differences, whole.nodes[0], commitlog_roots(dirs, g), evidence)
    cq = compare_consume_queues(dirs, g)
    _replicas_line(result, cq, f"{cq.files} files, {cq.total_bytes:,} bytes")
    if not cq.identical:
        result.problems += _keep_evidence(
            cq.differences, cq.nodes[0], consume_queue_roots(dirs, g), evidence
        )


def _replicas_line(result: RunResult, cmp: TreeComparison, size: str) -> None:
    line = f"{cmp.what}: {size}"
    line += " identical on every node" if cmp.identical else f" DIFFER: {cmp.differences}"
    result.replicas.append(line)
    if not cmp.identical:
        result.problems.append(line)


def _keep_evidence(differences: Sequence[str], ref: str, roots: Mapping[str, Path],
                   evidence: Path) -> list[str]:  # fmt: skip
    """Each differing file of each node and of ``ref`` copied under ``evidence`` (the
    mounts go away with the cluster), and where the bytes first differ."""
    out = []
    for d in differences:
        node, _, rest = d.partition(": ")
        name = rest.split(" ")[0]
        pair = [roots[node] / name, roots[ref] / name]
        for n, src in zip((node, ref), pair, strict=True):
            if src.is_file():
                dst = evidence / n / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        at = first_difference(*pair) if all(p.is_file() for p in pair) else None
        out.append(f"{node} {name}: first differing byte at {at} (copies in {evidence})")
    if out:
        evidence.mkdir(parents=True, exist_ok=True)
        (evidence / "where.txt").write_text("\n".join(out) + "\n")
    return out


def first_difference(a: Path, b: Path) -> int | None:
    """The first byte offset where two files differ (a length counts), None if equal."""
    x, y = a.read_bytes(), b.read_bytes()
    for i in range(0, max(len(x), len(y)), 4096):  # chunked: quick where equal
        cx, cy = x[i : i + 4096], y[i : i + 4096]
        if cx != cy:
            pairs = zip(cx, cy, strict=False)
            return i + next((k for k, (p, q) in enumerate(pairs) if p != q), min(len(cx), len(cy)))
    return None


# ---- the report -----------------------------------------------------------------------------


def report(r: RunResult) -> str:
    v = r.verdict
    lines = [
        f"chaos run: seed {r.seed}, schedule {r.duration_s:g} s, wall {r.elapsed_s:.0f} s — "
        + ("VALID" if r.valid else "INVALID"),
        f"replay: {replay_command(r.seed, r.duration_s)}",
    ]
    if r.stopped is not None:
        lines.append(f"stopped early: {r.stopped}")
    lines += [f"stall: {s}" for s in r.stalls]
    lines.append(f"schedule: {r.schedule}")
    lines.append("faults: " + ", ".join(f"{k} {n}" for k, n in sorted(r.faults.items())))
    figures = summary(v)
    if not r.drained:  # what was never read back is not lost: it was never looked for
        lines.append("checker: no verdict on lost or read values: the run ended before the drain")
        figures = {k: x for k, x in figures.items() if k not in Verdict.ANOMALIES}
    lines += [f"{k}: {x}" for k, x in figures.items()]
    lines.append("operations by kind: " + ", ".join(f"{k} {n}" for k, n in v.operations.items()))
    lines.append(
        "unavailability per fault kind: fault → next acknowledged produce (p50/p99/max);"
        " longest stall between acknowledgements until the next fault (max)"
    )
    by_kind: dict[str, list[float]] = defaultdict(list)
    longest: dict[str, list[float]] = defaultdict(list)
    for w in v.windows:
        longest[w.kind].append(w.stall_s)
        if w.window_s is not None:
            by_kind[w.kind].append(w.window_s)
    for kind, xs in sorted(by_kind.items()):
        lines.append(
            f"  {kind:<17} n={len(xs):<3} p50 {percentile(xs, 0.5):6.2f} s  "
            f"p99 {percentile(xs, 0.99):6.2f} s  max {max(xs):6.2f} s  "
            f"stall max {max(longest[kind]):6.2f} s"
        )
    lines += r.replicas
    for name, found in v.anomalies().items() if r.drained else ():
        lines.append(f"{name}: {found[:10]}")
    lines += [f"problem: {p}" for p in r.problems]
    return "\n".join(lines)
