"""One chaos run, start to verdict: ``run_chaos(seed, duration_s, workdir)``.

1. The cluster (``ChaosCluster``: namespaces, tmpfs, three broker processes) and the
   topic; the workload starts.
2. The nemesis runs the seed's schedule in a thread (its faults block: processes,
   ``ip``), while the workload runs on the event loop; both write one history.
3. The workload stops, then everything is healed (every node running, every link up,
   every ballast gone), and the cluster must converge within ``CONVERGE_S``: every node
   ready, one master, the same ledger end, committed and dispatched on every node.
4. Every queue is drained from every node (``api.replicas.read_queues``) into the
   history, and every node's group offsets read: the checker decides over all of it.
   The consume queues' digests over HTTP must be equal on every node.
5. The nodes stop (SIGTERM: files synced), and their commitlogs and consume queues are
   compared byte for byte (``api.replicas``).

Every run's first line says its seed and the command that replays it; the history is
written to ``workdir/history.jsonl`` and the nodes' logs to ``workdir/logs``.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.client import AsyncAdmin
from api.demo_load import ensure_topic, percentile, topic_ends
from api.replicas import (
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
from .history import History, dump
from .nemesis import Nemesis, schedule
from .workload import Workload, WorkloadSettings, reads, report_offsets

CONVERGE_S = 90.0
STALL_S = 8.0  # no produce acknowledged this long: the nodes' state is saved
START_S = 120.0


def replay_command(seed: int, duration_s: float) -> str:
    return f"python -m tests.chaos --seed {seed} --duration {duration_s:g}"


@dataclass(slots=True)
class RunResult:
    seed: int
    duration_s: float
    verdict: Verdict = field(default_factory=Verdict)
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # beyond the checker's anomalies
    replicas: list[str] = field(default_factory=list)
    # node → (ledger begin index, ledger end index), once converged
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.verdict.valid and not self.problems


def run_chaos(seed: int, duration_s: float, workdir: Path,
              say: Callable[[str], None] = print) -> RunResult:  # fmt: skip
    say(f"chaos seed {seed}, {duration_s:g} s; replay: {replay_command(seed, duration_s)}")
    t0 = time.monotonic()
    result = RunResult(seed, duration_s)
    history = History()
    cluster = ChaosCluster(workdir / "data", workdir / "logs")
    try:
        with cluster:
            asyncio.run(_run(cluster, history, result, say))
            cluster.stop_all(timeout_s=20)  # synced and closed: the files can be compared
            _compare_files(cluster, result, workdir / "differ")
    finally:
        dump(history, workdir / "history.jsonl")
    result.verdict = check(history.ops)
    result.faults = Counter(op.value["kind"] for op in history if op.f == "fault")
    result.elapsed_s = time.monotonic() - t0
    return result


async def _run(cluster: ChaosCluster, history: History, result: RunResult,
               say: Callable[[str], None]) -> None:  # fmt: skip
    settings = WorkloadSettings()
    await asyncio.to_thread(cluster.wait_ready, None, START_S)
    await ensure_topic(
        list(cluster.urls.values()), settings.topic, settings.queues, settings.client
    )
    workload = Workload(cluster.urls, settings, history, random.Random(result.seed))
    nemesis = Nemesis(cluster, history, say=say)
    stop = threading.Event()
    workload.start()
    watch = asyncio.create_task(_watch_stalls(cluster, history, stop, say))
    try:
        await asyncio.to_thread(nemesis.run, schedule(result.seed, result.duration_s), stop)
    finally:
        stop.set()
        await workload.stop()
        await watch
    if (e := workload.failed()) is not None:
        result.problems.append(f"a workload task failed: {e!r}")
    result.problems += [f"not whole again after {u}" for u in nemesis.unhealed]
    await asyncio.to_thread(nemesis.heal_all)
    master = await asyncio.to_thread(converge, cluster, CONVERGE_S)
    if master is None:
        result.problems.append(f"the cluster did not converge within {CONVERGE_S:g} s")
        return
    say(f"converged; master {master}; draining every node")
    for node in cluster.ids:
        info = cluster.cluster_info(node)
        if info is not None:
            result.spans[node] = (info["ledger_begin_index"], info["ledger_end_index"])
    await _drain(cluster, master, settings, history, result)


async def _watch_stalls(cluster: ChaosCluster, history: History, stop: threading.Event,
                        say: Callable[[str], None]) -> None:  # fmt: skip
    """When no produce was acknowledged for ``STALL_S``, every node's ``/v1/cluster``
    and ``/metrics`` go to ``logs/stall-<t>-<node>.txt`` (once per stall): what the
    nodes thought while it lasted, for the post-mortem."""
    last_snapshot = 0.0
    async with httpx.AsyncClient(timeout=2.0) as http:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            now = history.clock()
            last_ack = next(
                (op.time_s for op in reversed(history.ops) if op.f == "send" and op.type == "ok"),
                now,
            )
            if now - last_ack < STALL_S or now - last_snapshot < STALL_S:
                continue
            last_snapshot = now
            for node, url in cluster.urls.items():
                parts = []
                for path in ("/v1/cluster", "/metrics"):
                    try:
                        parts.append((await http.get(url + path)).text)
                    except httpx.HTTPError as e:
                        parts.append(f"{path}: {e!r}")
                (cluster.log_dir / f"stall-{now:.0f}-{node}.txt").write_text("\n".join(parts))
            say(f"no produce acknowledged for {now - last_ack:.0f} s: nodes' state in logs/stall-*")


def converge(cluster: ChaosCluster, timeout_s: float) -> str | None:
    """Wait (bounded) until every node is ready with one master, and every node's
    ledger end, committed and dispatched index are the same; the master, or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
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
        time.sleep(0.2)
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
        "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(r.faults.items())),
    ]
    lines += [f"{k}: {x}" for k, x in summary(v).items()]
    lines.append("operations by kind: " + ", ".join(f"{k} {n}" for k, n in v.operations.items()))
    lines.append(
        "unavailability per fault kind: fault → next acknowledged produce (p50/p99/max);"
        " longest stall between acknowledgements until the next fault (max)"
    )
    by_kind: dict[str, list[float]] = defaultdict(list)
    stalls: dict[str, list[float]] = defaultdict(list)
    for w in v.windows:
        stalls[w.kind].append(w.stall_s)
        if w.window_s is not None:
            by_kind[w.kind].append(w.window_s)
    for kind, xs in sorted(by_kind.items()):
        lines.append(
            f"  {kind:<17} n={len(xs):<3} p50 {percentile(xs, 0.5):6.2f} s  "
            f"p99 {percentile(xs, 0.99):6.2f} s  max {max(xs):6.2f} s  "
            f"stall max {max(stalls[kind]):6.2f} s"
        )
    lines += r.replicas
    for name, found in v.anomalies().items():
        lines.append(f"{name}: {found[:10]}")
    lines += [f"problem: {p}" for p in r.problems]
    return "\n".join(lines)
