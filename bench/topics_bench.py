"""Produce throughput and the cost of a topic as the number of topics grows (issue 31).

For each count in ``--topics`` (1, 100, 1,000), a fresh group of three broker processes
(``bench/broker_node.py``, as ``bench/broker_bench.py`` runs them: a ``Broker`` on its
own uvloop loop, Raft on 127.0.0.1, ``flush="sync"``) gets that many topics of
``--queues`` (8) queues; then ``--producers`` (8) tasks on the master produce batches
of ``--batch`` (100) messages of ``--body-size`` (1 KiB) for ``--duration`` s, each
batch to a topic drawn at random (the same seed in every row). A progress bar shows the
messages as they go. Before that, one message goes into every queue (``touch``, timed
apart; ``--no-touch`` skips it): a queue's files are made on its first message, a cost
paid once per queue that a short run would otherwise mostly measure.

Each row: messages/s, its ratio to the one-topic row, p50/p99/max batch latency, the
event-loop stalls of the nodes during the run (ticks 100 ms or more late, the
``loop_stall`` log line), and what the nodes hold after it: open consume queues, file
descriptors, memory mappings and resident memory of the master, and the disk the
consume queues take on each node (allocated blocks, ``du``) next to their units'
20 bytes a message. The cost of a topic is the difference to the one-topic row divided
by the topics added (the master's, and the consume-queue disk of all three nodes).

    .venv/bin/python bench/topics_bench.py                    # ~3 min, ~6 GiB of scratch disk
    .venv/bin/python bench/topics_bench.py --quick            # smoke run, ~1 min
    .venv/bin/python bench/topics_bench.py --topics 1,1000,1,1000,1,1000 --duration 15

Each row's "vs 1" is against the one-topic row before it; repeated pairs get the median
of their ratios (the machine's speed drifts from one row to the next).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_bench import Group, NodeProc, _kill_all  # a script beside this one

MiB = 1 << 20
UNIT_BYTES = 20  # a consume-queue unit


def disk_bytes(path: Path) -> tuple[int, int, int]:
    """(allocated bytes as ``du`` counts them, directories too, apparent bytes of the
    files, files) under ``path``."""
    used = apparent = files = 0
    for d, _, names in os.walk(path):
        with contextlib.suppress(FileNotFoundError):
            used += os.stat(d).st_blocks * 512
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(d, name))
                used += st.st_blocks * 512
                apparent += st.st_size
                files += 1
    return used, apparent, files


def proc_figures(pid: int) -> dict[str, int]:
    """Resident memory, open descriptors and memory mappings of a process."""
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    maps = len(Path(f"/proc/{pid}/maps").read_text().splitlines())
    return {"rss_bytes": rss_kib * 1024, "fds": fds, "maps": maps}


def wait_reply(node: NodeProc, rid: int, timeout_s: float, bar: tqdm[Any] | None) -> dict[str, Any]:
    """The reply to ``rid``, updating ``bar`` from the node's progress events meanwhile."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        with node.cond:
            reply = node.replies.pop(rid, None)
            events = node.events[seen:]
            seen = len(node.events)
        if bar is not None:
            for e in events:
                if e.get("event") == "progress":
                    bar.n = e["messages"]
                    bar.refresh()
        if reply is not None:
            if not reply.get("ok"):
                raise RuntimeError(f"{node.id}: {reply.get('error')}")
            return reply
        if not node.alive():
            raise RuntimeError(f"{node.id} died (see its log)")
        with node.cond:
            node.cond.wait(0.5)
    raise TimeoutError(f"{node.id}: no reply within {timeout_s} s")


def run_row(root: Path, count: int, a: argparse.Namespace, progress: bool) -> dict[str, Any]:
    g = Group(root, a)
    try:
        g.start_all()
        m = g.master()
        names = [f"t{k:05d}" for k in range(count)]
        t0 = time.monotonic()
        m.call("create_topics", timeout_s=a.timeout, topics=names, queues=a.queues)
        created_s = time.monotonic() - t0
        kw = {"topics": names, "batch": a.batch, "producers": a.producers}
        kw["body_size"] = a.body_size
        touch_s = None
        if a.touch:
            # One message into every queue: a batch's messages go to one queue, the next
            # batch of a topic to its next queue, so each topic in turn, once per queue.
            t0 = time.monotonic()
            r = m.call(
                "produce",
                timeout_s=a.timeout + count * a.queues / 100,
                **(kw | {"batch": 1, "cycle": True, "messages": count * a.queues}),
            )
            touch_s = time.monotonic() - t0
        g.converged(a.timeout)
        idle = proc_figures(m.pid)  # every queue made and holding a message or so
        idle_disk = {i: disk_bytes(root / i / "consumequeue")[0] for i in g.nodes}
        m.call("produce", timeout_s=a.timeout, messages=4 * a.batch * a.producers, **kw)  # warm
        before = {i: n.call("status")["loop_stalls"] for i, n in g.nodes.items()}
        rid = m.send("produce", duration=a.duration, progress=True, seed=count, **kw)
        with tqdm(desc=f"{count} topics", unit="msg", unit_scale=True, disable=not progress) as bar:
            r = wait_reply(m, rid, a.duration + a.timeout, bar)
        g.converged(a.timeout)
        st = g.statuses()
        stalls = {i: s["loop_stalls"] - before[i] for i, s in st.items()}
        late = {i: s["max_tick_late_ms"] for i, s in st.items()}
        cq = {i: disk_bytes(root / i / "consumequeue") for i in g.nodes}
        return {
            "topics": count,
            "queues": count * a.queues,
            "create_s": round(created_s, 2),
            "touch_s": None if touch_s is None else round(touch_s, 2),
            "messages": r["messages"],
            "msgs_per_s": r["msgs_per_s"],
            "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"],
            "max_ms": r["max_ms"],
            "errors": r["errors"],
            "loop_stalls": stalls,
            "max_tick_late_ms": late,
            "open_queues": st[m.id]["open_queues"],
            "mapped_queues": st[m.id]["mapped_queues"],
            "suspensions": st[m.id]["suspensions"],
            "master": m.id,
            "master_proc": proc_figures(m.pid),
            "master_proc_before": idle,
            "cq_disk_bytes_before": idle_disk,
            "cq_disk_bytes": {i: v[0] for i, v in cq.items()},
            "cq_apparent_bytes": {i: v[1] for i, v in cq.items()},
            "cq_files": {i: v[2] for i, v in cq.items()},
        }
    finally:
        g.close()
        _kill_all()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--topics", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100, 1000]
    )
    ap.add_argument("--duration", type=float, default=30.0, help="produce time per row, s")
    ap.add_argument("--producers", type=int, default=8, help="concurrent producer tasks")
    ap.add_argument("--batch", type=int, default=100, help="messages per produce call")
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8, help="queues of every topic")
    ap.add_argument(
        "--max-open-queues",
        type=int,
        default=None,
        help="the nodes' bound on mapped consume queues (default: the setting's, 4,096)",
    )
    ap.add_argument(
        "--checkpoint-interval-ms",
        type=int,
        default=None,
        help="the nodes' dispatch checkpoint interval (default: the setting's)",
    )
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--data-file-mib", type=int, default=256, help="commitlog segment size")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound on every wait")
    ap.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    ap.add_argument("--log-level", default="INFO", help="of the nodes (logs in the data dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 and 100 topics, 5 s")
    ap.add_argument(
        "--no-touch",
        dest="touch",
        action="store_false",
        help="measure from the first message of each queue on (default: one message into"
        " every queue first, timed apart: a queue's files are made on its first message)",
    )
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.topics, a.duration, a.data_file_mib = [1, 100], 5.0, 64
    progress = not a.no_progress
    base = a.data_dir if a.data_dir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="topics-bench-", dir=base))
    print(f"data and node logs: {root}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    ok = False
    try:
        for k, count in enumerate(a.topics):
            row_dir = root / f"{k}-topics-{count}"
            row_dir.mkdir()
            rows.append(run_row(row_dir, count, a, progress))
            print("row:", json.dumps(rows[-1]), file=sys.stderr)
            if a.data_dir is None:
                for i in ("n0", "n1", "n2"):
                    shutil.rmtree(row_dir / i, ignore_errors=True)  # keep the logs only
        ok = True
    finally:
        _kill_all()
        if not ok:
            print(f"kept {root} (node logs: *-topics-*/n*.log)", file=sys.stderr)
    report(rows, a)
    if ok and a.data_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def report(rows: list[dict[str, Any]], a: argparse.Namespace) -> None:
    print(
        f"\nbroker facade, 3 processes, flush={a.flush}, {a.body_size} B bodies, batches of"
        f" {a.batch} to a random topic, {a.producers} producers, {a.queues} queues a topic,"
        f" {a.duration:.0f} s a row"
    )
    print(
        f"  {'topics':>6} {'touch s':>7} {'msg/s':>8} {'vs 1':>5} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'max ms':>7}"
        f" {'stalls':>9} {'mapped':>6} {'fds':>6} {'maps':>6} {'RSS MiB':>8}"
        f" {'cq disk MiB':>12} {'cq units MiB':>12}"
    )
    first = rows[0] if rows and rows[0]["topics"] == 1 else None
    one: dict[str, Any] | None = None  # the last one-topic row: each row's "vs 1"
    ratios: dict[int, list[float]] = {}
    for r in rows:
        one = r if r["topics"] == 1 else one
        ratio = "-"
        if one is not None:
            ratios.setdefault(r["topics"], []).append(r["msgs_per_s"] / one["msgs_per_s"])
            ratio = f"{ratios[r['topics']][-1]:.2f}"
        stalls = "/".join(str(r["loop_stalls"][i]) for i in sorted(r["loop_stalls"]))
        p = r["master_proc"]
        disk = sum(r["cq_disk_bytes"].values()) / MiB
        units = 3 * r["messages"] * UNIT_BYTES / MiB
        touch = "-" if r["touch_s"] is None else f"{r['touch_s']:.1f}"
        print(
            f"  {r['topics']:>6} {touch:>7} {r['msgs_per_s']:>8,} {ratio:>5} {r['p50_ms']:>7}"
            f" {r['p99_ms']:>7}"
            f" {r['max_ms']:>7} {stalls:>9} {r['mapped_queues']:>6} {p['fds']:>6} {p['maps']:>6}"
            f" {p['rss_bytes'] / MiB:>8.0f} {disk:>12.1f} {units:>12.1f}"
        )
    print(
        "  (touch: one message into every queue, before the run; stalls: loop ticks >= 100 ms"
        " late per node during the run;\n   mapped (consume queues with their files open), fds,"
        " maps, RSS: the master's after the run;"
        "\n   cq disk: consume-queue blocks on the 3 nodes; cq units: the 20 B a message they"
        " must hold)"
    )
    for count, rs in sorted(ratios.items()):
        if count != 1 and len(rs) > 1:
            print(
                f"  {count} topics vs the one-topic row before each: median"
                f" {statistics.median(rs):.2f} of {len(rs)} ({', '.join(f'{x:.2f}' for x in rs)})"
            )
    if first is not None:
        when = (
            "every queue made, holding its message"
            if first["touch_s"] is not None
            else "topics created, no queue used yet"
        )
        print(f"  what a topic costs, before the run ({when}):")
        for r in rows[1:]:
            if r["topics"] == 1:
                continue
            added = r["topics"] - 1
            p, p1 = r["master_proc_before"], first["master_proc_before"]
            disk = sum(r["cq_disk_bytes_before"].values())
            disk -= sum(first["cq_disk_bytes_before"].values())
            rss_kib = (p["rss_bytes"] - p1["rss_bytes"]) / added / 1024
            print(
                f"    {r['topics']} vs 1 topic: {rss_kib:.1f} KiB resident,"
                f" {(p['fds'] - p1['fds']) / added:.2f} fds,"
                f" {(p['maps'] - p1['maps']) / added:.2f} mappings on the master;"
                f" {disk / 3 / added / 1024:.1f} KiB of consume-queue disk a node"
            )
    out = {"settings": {k: str(v) for k, v in vars(a).items()}, "rows": rows}
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1))
    print("JSON:", json.dumps(out))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
