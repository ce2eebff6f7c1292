"""The report of a run: aggregates, ratios, the Markdown table and the PNG charts.

Pure functions of the results JSON (``aggregate``, ``ratios``, ``targets``,
``markdown``), so they are tested on a small fixture without running anything;
``charts`` needs matplotlib (the ``bench`` extra) and is skipped without it.

A system that ran a scenario several times (LedgerMQ runs before every peer) gets the
mean of its runs: msg/s, MB/s and each latency percentile are averaged over the runs.
A ratio ``A/B`` divides A's mean msg/s by B's, both from the same invocation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LEDGERMQ = ("ledgermq-sync", "ledgermq-async")
FIGURES = ("msgs_per_s", "mb_per_s", "req_per_s", "p50_ms", "p99_ms", "p999_ms")
CPU = ("system_cpu_pct", "loadgen_cpu_pct", "others_cpu_pct", "machine_busy_pct", "loadavg_end")
# The POP drains' own (None in the other rows).
POP = (
    "receive_p50_ms",
    "receive_p99_ms",
    "ack_p50_ms",
    "ack_p99_ms",
    "system_cpu_us_per_msg",
    "master_cpu_us_per_msg",
)


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> system -> the mean figures of its runs (and ``runs``, ``errors``),
    scenarios and systems in the order they first ran."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        grouped.setdefault(r["scenario"], {}).setdefault(r["system"], []).append(r)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario, systems in grouped.items():
        out[scenario] = {}
        for system, rows in systems.items():
            agg: dict[str, Any] = {k: _mean(r.get(k) for r in rows) for k in FIGURES + CPU + POP}
            agg["runs"] = len(rows)
            agg["errors"] = sum(r.get("errors", 0) for r in rows)
            agg["phase"] = rows[0]["phase"]
            agg["batch"] = rows[0].get("batch")
            agg["clients"] = rows[0].get("clients")
            agg["messages"] = sum(r.get("messages", 0) for r in rows)
            out[scenario][system] = agg
    return out


def ratios(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """scenario -> ``"<ledgermq mode>/<peer>"`` -> LedgerMQ msg/s / the peer's. A
    record-format row (``produce records ...``, ``consume records ...``) is set against
    the peers of the same JSON scenario: they have no record format."""
    out: dict[str, dict[str, float | None]] = {}
    for scenario, systems in agg.items():
        row: dict[str, float | None] = {}
        peers = (
            agg.get(scenario.replace(" records ", " ", 1), {})
            if " records " in scenario
            else systems
        )
        for mode in (m for m in LEDGERMQ if m in systems):
            for peer, fig in peers.items():
                if peer in LEDGERMQ:
                    continue
                ours, theirs = systems[mode]["msgs_per_s"], fig["msgs_per_s"]
                row[f"{mode}/{peer}"] = (
                    round(ours / theirs, 2) if ours is not None and theirs else None
                )
        out[scenario] = row
    return out


def _fmt(x: Any, spec: str = ",.0f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float | int):
        return format(x, spec)
    return str(x)


def _table(headers: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    out = ["| " + " | ".join(headers) + " |"]
    out.append(
        "| " + " | ".join("---" if i < right_from else "---:" for i in range(len(headers))) + " |"
    )
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 15's targets against this run's figures (LedgerMQ sync, as the issue
    measured): each with the figure, the target and whether it is met."""
    agg = aggregate(results.get("runs", []))
    out: list[dict[str, Any]] = []
    lmq = "ledgermq-sync"
    for scenario, systems in agg.items():
        ours = systems.get(lmq)
        if ours is None or ours["phase"] != "produce":
            continue
        # the record format's rows (issue 31) against the peers of the same JSON scenario
        records = scenario.startswith("produce records ")
        peers = (
            agg.get(scenario.replace("produce records ", "produce "), {}) if records else systems
        )
        nats = peers.get("nats")
        floor = peers.get("floor")
        if ours["batch"] == 100:
            out.append(_target(scenario, "msg/s >= 100,000", ours["msgs_per_s"], 100_000))
            if nats and nats["msgs_per_s"]:
                ratio = ours["msgs_per_s"] / nats["msgs_per_s"]
                times = 5.0 if records else 3.0
                out.append(
                    _target(scenario, f">= {times:g}x NATS JetStream R3", ratio, times, ".2f")
                )
        elif ours["batch"] == 1:
            if floor and floor["req_per_s"]:
                ratio = ours["req_per_s"] / floor["req_per_s"]
                out.append(_target(scenario, ">= 0.8x the HTTP floor (req/s)", ratio, 0.8, ".2f"))
            if ours["p99_ms"] is not None:
                out.append(_target(scenario, "p99 <= 5 ms", ours["p99_ms"], 5.0, ".1f", low=True))
    for scenario, systems in agg.items():
        ours = systems.get(lmq)
        if ours is not None and ours["phase"] == "consume":
            out.append(_target(scenario, "msg/s >= 200,000", ours["msgs_per_s"], 200_000))
    return out


def _target(
    scenario: str,
    what: str,
    value: float | None,
    goal: float,
    spec: str = ",.0f",
    low: bool = False,
) -> dict[str, Any]:
    met = None if value is None else (value <= goal if low else value >= goal)
    return {"scenario": scenario, "target": what, "value": value, "met": met, "spec": spec}


def _label(results: dict[str, Any], key: str) -> str:
    return results.get("systems", {}).get(key, {}).get("label", key)


def _throughput_table(results: dict[str, Any], phase: str) -> list[str]:
    agg = aggregate([r for r in results.get("runs", []) if r["phase"] == phase])
    rows = []
    for scenario, systems in agg.items():
        for key, f in systems.items():
            load = f"{_fmt(f['loadavg_end'], '.1f')}"
            rows.append(
                [
                    scenario,
                    _label(results, key),
                    _fmt(f["msgs_per_s"]),
                    _fmt(f["mb_per_s"], ".1f"),
                    _fmt(f["p50_ms"], ".1f"),
                    _fmt(f["p99_ms"], ".1f"),
                    _fmt(f["p999_ms"], ".1f"),
                    _fmt(f["errors"], "d"),
                    str(f["runs"]),
                    _fmt(f["system_cpu_pct"]),
                    _fmt(f["loadgen_cpu_pct"]),
                    _fmt(f["machine_busy_pct"]),
                    load,
                ]
            )
    return _table(
        [
            "scenario",
            "system",
            "msg/s",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "errors",
            "runs",
            "system CPU %",
            "loadgen CPU %",
            "machine busy %",
            "load avg",
        ],
        rows,
        right_from=2,
    )


def _pop_table(results: dict[str, Any]) -> list[str]:
    agg = aggregate([r for r in results.get("runs", []) if r["phase"] == "pop"])
    rows = []
    for scenario, systems in agg.items():
        for key, f in systems.items():
            rows.append(
                [
                    scenario,
                    _label(results, key),
                    _fmt(f["msgs_per_s"]),
                    f"{_fmt(f['receive_p50_ms'], '.1f')} / {_fmt(f['receive_p99_ms'], '.1f')}",
                    f"{_fmt(f['ack_p50_ms'], '.1f')} / {_fmt(f['ack_p99_ms'], '.1f')}",
                    f"{_fmt(f['p50_ms'], '.1f')} / {_fmt(f['p99_ms'], '.1f')}",
                    _fmt(f["errors"], "d"),
                    _fmt(f["master_cpu_us_per_msg"], ".1f"),
                    _fmt(f["system_cpu_us_per_msg"], ".1f"),
                    _fmt(f["loadgen_cpu_pct"]),
                    _fmt(f["machine_busy_pct"]),
                    _fmt(f["loadavg_end"], ".1f"),
                ]
            )
    return _table(
        [
            "scenario",
            "system",
            "msg/s",
            "receive p50 / p99 ms",
            "ack p50 / p99 ms",
            "round p50 / p99 ms",
            "errors",
            "master CPU µs/msg",
            "system CPU µs/msg",
            "loadgen CPU %",
            "machine busy %",
            "load avg",
        ],
        rows,
        right_from=2,
    )


def pop_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 28's target: LedgerMQ's POP receive + ack (sync, as the other targets)."""
    agg = aggregate([r for r in results.get("runs", []) if r["phase"] == "pop"])
    return [
        _target(scenario, "msg/s >= 20,000", systems["ledgermq-sync"]["msgs_per_s"], 20_000)
        for scenario, systems in agg.items()
        if "ledgermq-sync" in systems
    ]


def _short(text: str, n: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 3] + "..."


def _ratio_table(results: dict[str, Any]) -> list[str]:
    runs = [r for r in results.get("runs", []) if r["phase"] in ("produce", "consume", "pop")]
    rat = ratios(aggregate(runs))
    cols: list[str] = []
    for row in rat.values():
        cols += [c for c in row if c not in cols]
    if not cols:
        return []
    heads = []
    for c in cols:
        ours, peer = c.split("/")
        heads.append(f"{_label(results, ours)} / {_label(results, peer)}")
    rows = [[s] + [_fmt(row.get(c), ".2f") for c in cols] for s, row in rat.items()]
    return _table(["scenario", *heads], rows)


def _failover_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for key, f in results.get("failover", {}).items():
        if "not_measured" in f or "error" in f:
            why = _short(f.get("not_measured") or f.get("error") or "")
            rows.append(
                [_label(results, key), "-", "-", "-", "-", "-", "-", f"not measured: {why}", "-"]
            )
            continue
        u = f.get("unavailable_ms") or {}
        rows.append(
            [
                _label(results, key),
                _fmt(f["kills"], "d"),
                _fmt(u.get("p50"), ".0f"),
                _fmt(u.get("p99"), ".0f"),
                _fmt(u.get("max"), ".0f"),
                _fmt(f.get("acked_messages")),
                _fmt(f.get("lost"), "d"),
                _how(f),
                _load(f),
            ]
        )
    return _table(
        [
            "system",
            "kills",
            "unavailable p50 ms",
            "p99 ms",
            "max ms",
            "acked msgs",
            "lost",
            "how",
            "machine busy %, load avg",
        ],
        rows,
    )


def _how(f: dict[str, Any]) -> str:
    """How ``lost`` was counted, why the rounds stopped early, what the logs said."""
    parts = [f.get("lost_check", "")]
    if f.get("stopped"):
        parts.append(f"stopped at {_short(f['stopped'], 120)}")
    parts += [f"log: {_short(x, 160)}" for x in f.get("server_log", [])]
    return "; ".join(p for p in parts if p)


def _load(f: dict[str, Any]) -> str:
    return f"{_fmt(f.get('machine_busy_pct'))} %, {_fmt(f.get('loadavg_end'), '.1f')}"


def _recovery_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for key, f in results.get("recovery", {}).items():
        if "not_measured" in f or "error" in f:
            why = _short(f.get("not_measured") or f.get("error") or "")
            rows.append([_label(results, key), "-", "-", "-", f"not measured: {why}", "-"])
            continue
        rows.append(
            [
                _label(results, key),
                _fmt(f["replica_bytes"] / 2**30, ".2f"),
                _fmt(f.get("follower_ready_ms")),
                _fmt(f.get("follower_caught_up_ms")),
                _fmt(f.get("cluster_first_write_ms")),
                _load(f),
            ]
        )
    return _table(
        [
            "system",
            "log per replica GiB",
            "follower kill -9: ready ms",
            "caught up ms",
            "whole cluster restart: first write ms",
            "machine busy %, load avg",
        ],
        rows,
    )


def _targets_table(results: dict[str, Any], issue: int = 15) -> list[str]:
    rows = []
    for t in targets(results) if issue == 15 else pop_targets(results):
        met = {True: "met", False: "not met", None: "-"}[t["met"]]
        rows.append([t["scenario"], t["target"], _fmt(t["value"], t["spec"]), met])
    head = f"target (issue {issue})"
    return _table(["scenario", head, "LedgerMQ sync", "met"], rows, right_from=2)


def loadgen_check(results: dict[str, Any]) -> dict[str, Any]:
    """The load generator's largest CPU share in any run, and in which."""
    best: dict[str, Any] = {"loadgen_cpu_pct": None}
    for r in results.get("runs", []):
        v = r.get("loadgen_cpu_pct")
        if v is not None and (best["loadgen_cpu_pct"] is None or v > best["loadgen_cpu_pct"]):
            best = {"loadgen_cpu_pct": v, "scenario": r["scenario"], "system": r["system"]}
    return best


def _section(title: str, intro: str, table: list[str]) -> list[str]:
    """A section, or nothing if its table has no rows (the phase did not run)."""
    if len(table) <= 2:
        return []
    return [f"## {title}", "", *([intro, ""] if intro else []), *table, ""]


PRODUCE_INTRO = (
    "b: messages per request, c: concurrent clients, each sending its next request when "
    "the last one is answered (after the system acknowledged it: quorum commit). "
    "LedgerMQ ran before every peer, the flush modes taking turns, so its figures are "
    "the mean of its runs (runs). CPU: % of one core over the measured window; system: "
    "the system's own processes; loadgen: the load generator process; machine busy: all "
    "cores, anyone's work."
)
POP_INTRO = (
    "Shared consumption of a backlog of {n} messages just written (the `pop fill` rows): "
    "{c} consumers, each one connection, each receiving up to {b} messages and then "
    "acknowledging every one of them, again, until all are acknowledged. LedgerMQ: a POP "
    "group, `POST .../receive` (invisible_ms {inv}) then `POST .../ack` of the handles (an "
    "ack is answered once it is committed on a quorum). NATS: one durable pull consumer "
    "with explicit acks (ack_wait {inv} ms) shared by the consumers, `fetch({b})` then "
    "{nats_ack} per message. msg/s: messages acknowledged / seconds from the first receive "
    "to the last ack; round: a receive and its acks; CPU µs/msg: CPU time over the run per "
    "message acknowledged (master: the LedgerMQ node answering; system: all replicas)."
)
NATS_ACK_TEXT = {
    "ack": "`Msg.ack()` (published on the connection, not waited for: the ack p50/p99 is "
    "the client's sending time)",
    "ack_sync": "`Msg.ack_sync()` (each answered by the server; the batch's acks at once)",
}
CONSUME_INTRO = (
    "Reading the {n} messages the fill wrote, from the start, pages of {b}, 8 readers: "
    "LedgerMQ one per queue from the master; NATS a pull consumer per subject, no acks; "
    "etcd serializable ranges per key prefix on the leader. The floor row: `GET /blob` "
    "answering a LedgerMQ pull answer's size (msg/s counts the messages such an answer "
    "carried)."
)


def markdown(results: dict[str, Any]) -> str:
    s = results.get("settings", {})
    m = results.get("machine", {})
    lines = [
        "# LedgerMQ and its peers",
        "",
        f"`{results.get('command', 'bench/peers_bench.py')}` on {results.get('started', '?')}: "
        f"{m.get('cpus', '?')} CPUs shared by every process (servers and load generator), "
        f"load average {m.get('loadavg_start', '?')} at the start and "
        f"{m.get('loadavg_end', '?')} at the end, "
        f"{_fmt(results.get('seconds'), ',.0f')} s in all. "
        f"{s.get('body_size', 1024)} B messages, three replicas of every system on 127.0.0.1.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()),
        "",
        "## Durability: what an acknowledgement means",
        "",
    ]
    lines += _table(
        ["system", "durability", "in this run"],
        [
            [v.get("label", k), v.get("durability", ""), _short(v.get("status", ""))]
            for k, v in results.get("systems", {}).items()
        ],
        right_from=99,
    )
    lines.append("")
    n, b = s.get("consume_messages", "?"), s.get("consume_batch", "?")
    lines += _section("Produce", PRODUCE_INTRO, _throughput_table(results, "produce"))
    lines += _section("Ratios: LedgerMQ msg/s / the peer's, same run", "", _ratio_table(results))
    lines += _section(
        "Consume catch-up",
        CONSUME_INTRO.format(n=_fmt(n, ",") if isinstance(n, int) else n, b=b),
        _throughput_table(results, "consume"),
    )
    lines += _section(
        "The fill",
        "The writes that made the catch-up log (not a scenario of the issue; "
        f"{s.get('fill_batch', '?')} messages per request).",
        _throughput_table(results, "fill"),
    )
    lines += _section(
        "Failover: kill -9 of the leader under load",
        "4 producers sending batches of 10 messages; unavailable: from the kill to the "
        "first write the new leader acknowledged; lost: acknowledged, then not read back.",
        _failover_table(results),
    )
    lines += _section(
        "Shared consumption (POP): receive + ack",
        POP_INTRO.format(
            n=_fmt(s.get("pop_messages"), ","),
            c=s.get("pop_clients", "?"),
            b=s.get("pop_batch", "?"),
            inv=s.get("pop_invisible_ms", "?"),
            nats_ack=NATS_ACK_TEXT.get(s.get("nats_ack", "ack"), "?"),
        ),
        _pop_table(results),
    )
    lines += _section("Restart recovery", "", _recovery_table(results))
    lines += _section("Issue 15's targets", "", _targets_table(results))
    lines += _section("Issue 28's target", "", _targets_table(results, 28))
    lg = loadgen_check(results)
    if lg["loadgen_cpu_pct"] is not None:
        lines += [
            "## Is the load generator the bottleneck?",
            "",
            f"Its largest CPU share in any run was {lg['loadgen_cpu_pct']:.0f} % of one core "
            f"({lg['scenario']}, {_label(results, lg['system'])}): a single-process load "
            "generator at ~100 % would have been the limit of that run. Each row's loadgen "
            "CPU % shows it per run.",
            "",
        ]
    errors = results.get("errors", [])
    if errors:
        lines += ["## Errors", ""] + [f"- {e['system']}: {_short(e['error'], 300)}" for e in errors]
        lines.append("")
    return "\n".join(lines)


def charts(results: dict[str, Any], out: Path) -> list[Path]:
    """throughput.png (produce and consume msg/s) and latency.png (produce p50/p99);
    nothing without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return []
    runs = results.get("runs", [])
    made = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    for ax, phase in zip(axes, ("produce", "consume"), strict=True):
        _bars(ax, results, aggregate([r for r in runs if r["phase"] == phase]), "msgs_per_s")
        ax.set_title(f"{phase}: messages/s")
        ax.set_yscale("log")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    made.append(out / "throughput.png")
    fig.savefig(made[-1], dpi=80)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    agg = aggregate([r for r in runs if r["phase"] == "produce"])
    for ax, key in zip(axes, ("p50_ms", "p99_ms"), strict=True):
        _bars(ax, results, agg, key)
        ax.set_title(f"produce: {key.replace('_ms', '')} latency, ms")
        ax.set_yscale("log")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    made.append(out / "latency.png")
    fig.savefig(made[-1], dpi=80)
    plt.close(fig)
    return made


def _color(results: dict[str, Any], system: str) -> str:
    """The same colour for a system in every chart (matplotlib's C0, C1, ...)."""
    keys = [*results.get("systems", {}), *LEDGERMQ, "nats", "etcd", "pysyncobj", "floor"]
    return f"C{keys.index(system) % 10}" if system in keys else "C9"


def _bars(
    ax: Any, results: dict[str, Any], agg: dict[str, dict[str, dict[str, Any]]], key: str
) -> None:
    scenarios = list(agg)
    systems: list[str] = []
    for per in agg.values():
        systems += [k for k in per if k not in systems]
    width = 0.8 / max(1, len(systems))
    for j, system in enumerate(systems):
        xs = [i + j * width for i in range(len(scenarios))]
        ys = [agg[s].get(system, {}).get(key) or 0 for s in scenarios]
        ax.bar(xs, ys, width, label=_label(results, system), color=_color(results, system))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scenarios))])
    ax.set_xticklabels(
        [s.replace("produce ", "").replace("consume ", "") for s in scenarios], fontsize=8
    )
