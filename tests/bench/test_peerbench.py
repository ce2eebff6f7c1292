"""The pure parts of ``make bench-peers`` (bench/peerbench): the command line, the order
of the runs, and the report built from a small results fixture. No server, peer or
load generator runs here; the charts are drawn with matplotlib (a `dev` dependency)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # bench/ is scripts, not a package

from peerbench import plan, report  # noqa: E402


def test_the_defaults_are_the_issues_scenarios() -> None:
    a = plan.parse_args([])
    assert a.peers == ["nats", "etcd", "pysyncobj", "floor"]
    assert a.flush == ["sync", "async"]
    assert a.batches == [1, 100] and a.clients == [16, 64]
    assert a.consume_messages == 1_000_000
    assert a.kills == 20
    assert a.phases == ["produce", "consume", "pop", "recovery", "failover"]
    # issue 28: receive + ack, batches of 32, 16 consumers
    assert (a.pop_clients, a.pop_batch, a.pop_messages, a.nats_ack) == (16, 32, 200_000, "ack")


def test_quick_shrinks_everything_but_what_is_given() -> None:
    a = plan.parse_args(["--quick", "--kills", "5"])
    assert a.seconds == plan.QUICK["seconds"]
    assert a.consume_messages == plan.QUICK["consume_messages"]
    assert a.pop_messages == plan.QUICK["pop_messages"]
    assert a.kills == 5


def test_the_catch_up_count_is_whole_fill_requests_over_eight_readers() -> None:
    assert plan.parse_args(["--consume-messages", "1234"]).consume_messages == 800
    assert plan.parse_args(["--consume-messages", "10"]).consume_messages == 800


@pytest.mark.parametrize(
    "argv",
    [["--peers", "nats,kafka"], ["--flush", "never"], ["--batches", "0"], ["--clients", "x"]],
)
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        plan.parse_args(argv)


def test_the_runs_alternate_ledgermq_and_a_peer() -> None:
    order = plan.alternate(["s", "a"], ["nats", "etcd", "pso", "floor"])
    assert order == ["s", "nats", "a", "etcd", "s", "pso", "a", "floor"]
    assert plan.alternate(["s", "a"], ["nats"]) == ["s", "nats", "a"]
    assert plan.alternate(["s"], []) == ["s"]
    assert plan.alternate([], ["nats"]) == ["nats"]
    assert plan.once_each(order) == ["s", "nats", "a", "etcd", "pso", "floor"]


def _run(phase: str, scenario: str, system: str, msgs: float, **kw: Any) -> dict[str, Any]:
    row = {
        "phase": phase,
        "scenario": scenario,
        "system": system,
        "batch": kw.pop("batch", 100),
        "clients": 16,
        "msgs_per_s": msgs,
        "mb_per_s": msgs * 1024 / 1e6,
        "req_per_s": kw.pop("req", msgs / 100),
        "p50_ms": kw.pop("p50", 10.0),
        "p99_ms": kw.pop("p99", 20.0),
        "p999_ms": 30.0,
        "errors": 0,
        "messages": int(msgs),
        "system_cpu_pct": 90.0,
        "loadgen_cpu_pct": kw.pop("loadgen", 20.0),
        "others_cpu_pct": 5.0,
        "machine_busy_pct": 99.0,
        "loadavg_end": 2.5,
    }
    assert not kw
    return row


@pytest.fixture
def results() -> dict[str, Any]:
    p100, p1, c = "produce b=100 c=16", "produce b=1 c=16", "consume 800 b=1000"
    return {
        "command": "bench/peers_bench.py --quick",
        "started": "2026-01-01T00:00:00",
        "seconds": 123.4,
        "settings": {"consume_messages": 800, "consume_batch": 1000, "body_size": 1024},
        "machine": {"cpus": 2, "loadavg_start": 1.0, "loadavg_end": 2.0},
        "versions": {"nats-server": "2.9.10"},
        "systems": {
            "ledgermq-sync": {"label": "LedgerMQ sync", "durability": "fsync", "status": "ran"},
            "nats": {"label": "NATS", "durability": "async", "status": "ran"},
            "floor": {"label": "floor", "durability": "none", "status": "ran"},
            "etcd": {"label": "etcd", "durability": "-", "status": "not installed: etcd"},
        },
        "runs": [
            _run("produce", p100, "ledgermq-sync", 10_000, loadgen=95.0),
            _run("produce", p100, "nats", 5_000),
            _run("produce", p100, "ledgermq-sync", 30_000),
            _run("produce", p1, "ledgermq-sync", 1_000, batch=1, req=1_000, p99=4.0),
            _run("produce", p1, "floor", 1_000, batch=1, req=1_000),
            _run("consume", c, "ledgermq-sync", 250_000),
            _run("fill", "fill 800", "ledgermq-sync", 5_000),
        ],
        "failover": {
            "ledgermq-sync": {
                "kills": 2,
                "unavailable_ms": {"n": 2, "p50": 80.0, "p99": 90.0, "max": 90.0},
                "acked_messages": 1000,
                "lost": 0,
                "lost_check": "ids read back",
            },
            "pysyncobj": {
                "kills": 1,
                "unavailable_ms": {"n": 1, "p50": 900.0, "p99": 900.0, "max": 900.0},
                "acked_messages": 500,
                "lost": None,
                "stopped": "round 2: TimeoutError: not caught up",
                "server_log": ["pso2: CRITICAL diverged"],
            },
            "floor": {"not_measured": "no replicas"},
        },
        "recovery": {
            "ledgermq-sync": {
                "replica_bytes": 2**30,
                "follower_ready_ms": 1500.0,
                "follower_caught_up_ms": 1600.0,
                "cluster_first_write_ms": 4000.0,
            }
        },
        "errors": [{"system": "etcd", "error": "start: exited"}],
    }


def test_aggregate_takes_the_mean_of_a_systems_runs(results: dict[str, Any]) -> None:
    agg = report.aggregate(results["runs"])
    lmq = agg["produce b=100 c=16"]["ledgermq-sync"]
    assert lmq["runs"] == 2
    assert lmq["msgs_per_s"] == 20_000
    assert list(agg) == ["produce b=100 c=16", "produce b=1 c=16", "consume 800 b=1000", "fill 800"]


def test_ratios_are_ledgermq_over_each_peer_of_the_same_scenario(results: dict[str, Any]) -> None:
    rat = report.ratios(report.aggregate(results["runs"]))
    assert rat["produce b=100 c=16"] == {"ledgermq-sync/nats": 4.0}
    assert rat["produce b=1 c=16"] == {"ledgermq-sync/floor": 1.0}
    assert rat["consume 800 b=1000"] == {}
    records = {"produce records b=100 c=16": {"ledgermq-sync": {"msgs_per_s": 40_000.0}}}
    rat = report.ratios({**report.aggregate(results["runs"]), **records})
    assert rat["produce records b=100 c=16"] == {"ledgermq-sync/nats": 8.0}  # JSON row's NATS


def test_targets_say_met_or_not(results: dict[str, Any]) -> None:
    got = {(t["scenario"], t["target"]): t["met"] for t in report.targets(results)}
    assert got == {
        ("produce b=100 c=16", "msg/s >= 100,000"): False,
        ("produce b=100 c=16", ">= 3x NATS JetStream R3"): True,
        ("produce b=1 c=16", ">= 0.8x the HTTP floor (req/s)"): True,
        ("produce b=1 c=16", "p99 <= 5 ms"): True,
        ("consume 800 b=1000", "msg/s >= 200,000"): True,
    }


def test_the_record_formats_rows_are_held_to_five_times_nats_of_the_json_scenario(
    results: dict[str, Any],
) -> None:
    """Issue 31: ``produce records b=100`` (LedgerMQ alone) against NATS of ``produce
    b=100`` at the same clients, 5x."""
    results["runs"].append(_run("produce", "produce records b=100 c=16", "ledgermq-sync", 26_000))
    got = {(t["scenario"], t["target"]): t for t in report.targets(results)}
    five = got[("produce records b=100 c=16", ">= 5x NATS JetStream R3")]
    assert (five["value"], five["met"]) == (5.2, True)
    assert not got[("produce records b=100 c=16", "msg/s >= 100,000")]["met"]


def test_the_markdown_report_has_every_table(results: dict[str, Any]) -> None:
    md = report.markdown(results)
    for heading in (
        "## Durability",
        "## Produce",
        "## Ratios",
        "## Consume catch-up",
        "## The fill",
        "## Failover",
        "## Restart recovery",
        "## Issue 15's targets",
        "## Is the load generator the bottleneck?",
        "## Errors",
    ):
        assert heading in md
    assert "| produce b=100 c=16 | LedgerMQ sync | 20,000 |" in md
    assert "| produce b=100 c=16 | 4.00 |" in md  # LedgerMQ sync / NATS
    assert "| etcd | - | not installed: etcd |" in md
    assert "| LedgerMQ sync | 2 | 80 | 90 | 90 | 1,000 | 0 | ids read back |" in md
    assert "not measured: no replicas" in md
    assert (
        "| pysyncobj | 1 | 900 | 900 | 900 | 500 | - | stopped at round 2: TimeoutError: not "
        "caught up; log: pso2: CRITICAL diverged |"
    ) in md
    assert "| LedgerMQ sync | 1.00 | 1,500 | 1,600 | 4,000 |" in md
    assert "95 % of one core (produce b=100 c=16, LedgerMQ sync)" in md
    # every table row has as many cells as its header
    for block in md.split("\n\n"):
        rows = [r for r in block.splitlines() if r.startswith("|")]
        assert len({r.count(" | ") for r in rows}) <= 1, block


def test_a_report_of_one_phase_has_no_empty_sections(results: dict[str, Any]) -> None:
    results["runs"] = [r for r in results["runs"] if r["phase"] == "produce"]
    results["failover"] = results["recovery"] = {}
    md = report.markdown(results)
    assert "## Produce" in md
    assert "## Consume" not in md and "## Failover" not in md and "## Restart" not in md


def test_the_pop_section_has_its_figures_ratio_and_target(results: dict[str, Any]) -> None:
    pop = "pop receive+ack c=16 b=32"
    extra = {"receive_p50_ms": 20.0, "receive_p99_ms": 40.0, "ack_p50_ms": 15.0}
    results["runs"] += [
        {**_run("pop", pop, "ledgermq-sync", 12_000), **extra, "master_cpu_us_per_msg": 67.0},
        {**_run("pop", pop, "nats", 6_000), **extra, "system_cpu_us_per_msg": 90.0},
    ]
    results["settings"].update(pop_messages=200_000, pop_clients=16, pop_batch=32)
    md = report.markdown(results)
    assert "## Shared consumption (POP): receive + ack" in md
    assert "backlog of 200,000 messages" in md and "`Msg.ack()`" in md
    assert (
        "| pop receive+ack c=16 b=32 | LedgerMQ sync | 12,000 | 20.0 / 40.0 | 15.0 / - |"
        " 10.0 / 20.0 | 0 | 67.0 | - |"
    ) in md
    assert "| pop receive+ack c=16 b=32 | 2.00 |" in md  # LedgerMQ sync / NATS
    assert "| pop receive+ack c=16 b=32 | msg/s >= 20,000 | 12,000 | not met |" in md
    for block in md.split("\n\n"):
        rows = [r for r in block.splitlines() if r.startswith("|")]
        assert len({r.count(" | ") for r in rows}) <= 1, block


def test_charts(results: dict[str, Any], tmp_path: Path) -> None:
    made = report.charts(results, tmp_path)
    assert [p.name for p in made] == ["throughput.png", "latency.png"]
    assert all(p.stat().st_size > 1000 for p in made)
