"""The ``ledgermq`` command line (API.md §1).

- ``ledgermq broker``: one node (the embedded single-node default with no options);
- ``ledgermq cluster up --nodes 3``: a local cluster as child processes, in the
  foreground until Ctrl-C;
- ``ledgermq demo``: the 3-broker failover demonstration; ``store-demo``: the log store's;
- the client commands (``topic``, ``produce``, ``consume``, ``status``, ``group``,
  ``leader``): ``api.cli_client``.

Every option also comes from a ``LEDGERMQ_<NAME>`` environment variable. Errors are one
line on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from dledger.runtime.peer_auth import load_peer_secret
from dledger.store.demo import run_demo as run_store_demo

from .cli_client import add_client_commands, run_client_command
from .cliutil import add_option
from .demo import add_demo_options, run_demo
from .node import add_broker_options, run_broker

SERVER_COMMANDS = ("broker", "cluster", "demo", "store-demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledgermq",
        description="LedgerMQ: a RocketMQ-style message broker on a DLedger-style Raft log",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_broker_options(sub.add_parser("broker", help="run one broker node"))
    cluster = sub.add_parser("cluster", help="a local cluster of child processes")
    csub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = csub.add_parser("up", help="start N nodes on 127.0.0.1; Ctrl-C stops them")
    add_option(up, "--nodes", type=int, default=3)
    add_option(up, "--base-port", type=int, default=8080, help="HTTP ports from here")
    add_option(up, "--raft-base-port", type=int, default=None, help="default: base + 1000")
    add_option(up, "--data-dir", type=Path, default=Path("ledgermq-data"))
    add_option(up, "--flush", choices=("sync", "async"), default="sync")
    add_option(up, "--peer-secret", default=None, help="for every node (API.md §6)")
    add_option(up, "--peer-secret-file", type=Path, default=None)
    add_demo_options(
        sub.add_parser(
            "demo",
            help="the 3-broker failover demonstration: kill -9 the master under load, "
            "then the accounting (--brokers: against a running cluster)",
        )
    )
    sdemo = sub.add_parser("store-demo", help="run the log store demonstration and exit")
    sdemo.add_argument("--data-dir", type=Path, default=None)
    sdemo.add_argument("--entries", type=int, default=200_000)
    sdemo.add_argument("--body-bytes", type=int, default=1024)
    sdemo.add_argument("--batch", type=int, default=100)
    add_client_commands(sub)
    return parser


def cluster_up(args: argparse.Namespace) -> int:
    """Start the nodes, report the master, wait for Ctrl-C (or a node dying), stop all."""
    from .cluster import LocalBrokerCluster  # noqa: PLC0415  # only this command needs it

    n = args.nodes
    raft_base = args.raft_base_port or args.base_port + 1000
    cluster = LocalBrokerCluster(
        n,
        args.data_dir,
        http_ports=[args.base_port + i for i in range(n)],
        raft_ports=[raft_base + i for i in range(n)],
        extra_args=["--flush", args.flush],
        inherit_output=True,
        peer_secret=load_peer_secret(args.peer_secret, args.peer_secret_file),
    )
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster.start_all()
    try:
        master = cluster.wait_ready(timeout_s=60)
        print(f"ledgermq cluster: {n} nodes up, master {master}", file=sys.stderr)
        print(f"  --brokers {cluster.brokers}", file=sys.stderr)
        print("  Ctrl-C stops the cluster", file=sys.stderr)
        while not stop:
            dead = [node for node in cluster.ids if not cluster.alive(node)]
            if dead:
                print(f"ledgermq cluster: {', '.join(dead)} exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        print("ledgermq cluster: stopping", file=sys.stderr)
        cluster.stop_all()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "broker":
        return run_broker(args)
    if args.command not in SERVER_COMMANDS:
        return run_client_command(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "cluster":
            return cluster_up(args)
        if args.command == "demo":
            return run_demo(args)
        if args.command == "store-demo":
            run_store_demo(args.data_dir, args.entries, args.body_bytes, args.batch)
    except (OSError, ValueError, TimeoutError, RuntimeError, AssertionError) as e:
        print(f"ledgermq {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
