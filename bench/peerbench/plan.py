"""The command line and the order of the runs (pure: tested without any process).

Runs alternate between LedgerMQ and the peers, so that whatever else the machine does
during the run hits both: for each scenario, each peer is preceded by a LedgerMQ run,
the LedgerMQ flush modes taking turns (``alternate``). With the default systems that
is ``ledgermq-sync, nats, ledgermq-async, etcd, ledgermq-sync, pysyncobj,
ledgermq-async, floor``: two runs of each LedgerMQ mode per scenario, one of each peer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

PEERS = ("nats", "etcd", "pysyncobj", "floor")
FLUSH = ("sync", "async")
PHASES = ("produce", "consume", "pop", "recovery", "failover")
NATS_ACKS = ("ack", "ack_sync")


def _csv(choices: Sequence[str]) -> object:
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("want positive integers, comma-separated")
    return values


QUICK = {
    "seconds": 3.0,
    "warmup": 1.0,
    "consume_messages": 20_000,
    "pop_messages": 20_000,
    "kills": 2,
    "data_file_mb": 64,
    "fill_timeout": 120.0,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="peers_bench.py",
        description="LedgerMQ next to NATS JetStream, etcd, pysyncobj and the HTTP floor: "
        "produce, consume catch-up, failover and restart recovery, 3 replicas each on "
        "127.0.0.1; JSON, Markdown and PNG charts in a results directory (bench/README.md).",
    )
    ap.add_argument("--peers", type=_csv(PEERS), default=list(PEERS), help="comma-separated")
    ap.add_argument("--flush", type=_csv(FLUSH), default=list(FLUSH), help="LedgerMQ modes")
    ap.add_argument("--phases", type=_csv(PHASES), default=list(PHASES), help="comma-separated")
    ap.add_argument("--quick", action="store_true", help="smoke run: small counts, short runs")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured s per produce run")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured s before each")
    ap.add_argument("--batches", type=_ints, default=[1, 100], help="messages per request")
    ap.add_argument("--clients", type=_ints, default=[16, 64], help="concurrent clients")
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--pool", type=int, default=32, help="distinct request bodies per run")
    ap.add_argument(
        "--consume-messages", type=int, default=1_000_000, help="catch-up: messages to read"
    )
    ap.add_argument("--consume-batch", type=int, default=1000, help="messages per read")
    ap.add_argument("--fill-batch", type=int, default=100, help="messages per fill request")
    ap.add_argument("--fill-clients", type=int, default=32)
    ap.add_argument("--fill-timeout", type=float, default=900.0, help="bound on a fill or read")
    ap.add_argument("--pop-messages", type=int, default=200_000, help="pop: the backlog")
    ap.add_argument("--pop-clients", type=int, default=16, help="pop: concurrent consumers")
    ap.add_argument("--pop-batch", type=int, default=32, help="pop: messages per receive")
    ap.add_argument("--pop-invisible-ms", type=int, default=30_000, help="pop: and ack_wait")
    ap.add_argument("--pop-wait-ms", type=int, default=1000, help="pop: a receive's long poll")
    ap.add_argument(
        "--nats-ack",
        choices=NATS_ACKS,
        default="ack",
        help="pop: NATS acks each message with Msg.ack() (not waited for) or ack_sync()",
    )
    ap.add_argument("--kills", type=int, default=20, help="failover: kill -9's of the leader")
    ap.add_argument("--fault-after", type=float, default=1.0, help="s of load before a kill")
    ap.add_argument("--client-timeout", type=float, default=0.5, help="failover: per request")
    ap.add_argument("--data-file-mb", type=int, default=1024, help="LedgerMQ segment size")
    ap.add_argument("--request-timeout", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on every other wait")
    ap.add_argument("--out", default=None, help="results directory (default: a new one)")
    ap.add_argument("--data-dir", default=None, help="where the data goes (default: temp)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get/pip anything")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    if a.quick:  # its values, except those given on the command line
        explicit = {x.split("=")[0].lstrip("-").replace("-", "_") for x in argv}
        for k, v in QUICK.items():
            if k not in explicit:
                setattr(a, k, v)
    if not a.flush:
        ap.error("--flush: at least one LedgerMQ mode")
    # Whole requests: the fill sends batches, and 8 readers read 8 queues.
    step = a.fill_batch * 8
    a.consume_messages = max(step, a.consume_messages // step * step)
    return a


def alternate(ledgermq: Sequence[str], peers: Sequence[str]) -> list[str]:
    """The order of one scenario's runs: a LedgerMQ run before each peer's, the modes
    taking turns; every mode runs at least once."""
    if not ledgermq:
        return list(peers)
    out: list[str] = []
    for i, p in enumerate(peers):
        out += [ledgermq[i % len(ledgermq)], p]
    out += [m for m in ledgermq if m not in out]
    return out


def once_each(order: Sequence[str]) -> list[str]:
    """``order`` without repeats (the long runs: each system reads its catch-up once)."""
    seen: list[str] = []
    for k in order:
        if k not in seen:
            seen.append(k)
    return seen
