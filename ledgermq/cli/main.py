"""The ``ledgermq`` command line (docs/operations.md): its parser and server commands.

- ``ledgermq broker``: one node (the embedded single-node default with no options);
- ``ledgermq cluster up --nodes 3``: a local cluster as child processes, in the
  foreground until Ctrl-C;
- ``ledgermq demo``: the 3-broker failover demonstration;
- the client commands (``topic``, ``produce``, ``consume``, ``status``, ``group``,
  ``leader``): ``ledgermq.cli.client``.

Every option also comes from a ``LEDGERMQ_<NAME>`` environment variable. Errors are one
line on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from api.version import VERSION
from dledger.runtime.peer_auth import load_peer_secret
from ledgermq.processes import ChildNodes

from ..demo import add_demo_options, run_demo
from ..node import add_broker_options, run_broker
from .client import add_client_commands, add_member_commands, run_client_command
from .util import add_option, hoist_client_options

SERVER_COMMANDS = ("broker", "cluster", "demo", "bench")
# ``ledgermq bench`` runs the comparison harness of the source checkout (make bench-peers)
PEERS_BENCH = Path(__file__).resolve().parents[2] / "bench" / "peers_bench.py"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledgermq",
        description="LedgerMQ: a RocketMQ-style message broker on a DLedger-style Raft log",
    )
    parser.add_argument("--version", action="version", version=f"ledgermq {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_broker_options(sub.add_parser("broker", help="run one broker node"))
    cluster = sub.add_parser(
        "cluster", help="a local cluster of child processes; a running group's members"
    )
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = csub.add_parser("up", help="start N nodes on 127.0.0.1; Ctrl-C stops them")
    add_option(up, "--nodes", type=int, default=3)
    add_option(up, "--base-port", type=int, default=8080, help="HTTP ports from here")
    add_option(up, "--raft-base-port", type=int, default=None, help="default: base + 1000")
    add_option(up, "--data-dir", type=Path, default=Path("ledgermq-data"))
    add_option(up, "--flush", choices=("sync", "async"), default="sync")
    add_option(up, "--peer-secret", default=None, help="for every node (docs/operations.md)")
    add_option(up, "--peer-secret-file", type=Path, default=None)
    add_option(
        up,
        "--restart-after",
        type=float,
        default=3.0,
        help="restart a node that died (kill -9 it to see a failover) after this many "
        "seconds; 0: never",
    )
    add_member_commands(csub)
    add_demo_options(
        sub.add_parser(
            "demo",
            help="the 3-broker failover demonstration: kill -9 the master under load, "
            "then the accounting (--brokers: against a running cluster)",
        )
    )
    sub.add_parser(
        "bench",
        help="LedgerMQ next to NATS JetStream, etcd, pysyncobj and the HTTP floor (make"
        " bench-peers; from a source checkout); every argument goes to it: bench --help",
        add_help=False,
        usage="ledgermq bench [--quick] [...]: the options of bench/peers_bench.py"
        " (ledgermq bench --help)",
    )
    add_client_commands(sub)
    return parser


def run_bench(args: list[str]) -> int:
    """``ledgermq bench ARGS``: ``bench/peers_bench.py ARGS`` of this checkout, which
    installs the peers it compares with and prints where its report went."""
    if not PEERS_BENCH.is_file():
        print(
            f"ledgermq bench: {PEERS_BENCH} not found; the comparison runs from a source"
            " checkout (git clone, then make bench-peers)",
            file=sys.stderr,
        )
        return 2
    return subprocess.call([sys.executable, str(PEERS_BENCH), *args])


def cluster_up(args: argparse.Namespace) -> int:
    """Start the nodes, report the master, and run until Ctrl-C (or SIGTERM); then stop all.

    A node that dies (kill -9 the master to watch a failover) is reported, and the others
    keep running; with ``--restart-after`` it is started again after that many seconds,
    and comes back as a SLAVE. A node that dies again within ``STARTUP_GRACE_S`` of its
    restart is failing to start, not being killed: it stays down."""
    from ..local_cluster import LocalBrokerCluster  # noqa: PLC0415  # only this command needs it

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
        watch = _NodeWatch(cluster, args.restart_after)
        while not stop and watch.step():
            time.sleep(0.2)
        return 0 if stop else 1
    finally:
        print("ledgermq cluster: stopping", file=sys.stderr)
        cluster.stop_all()


STARTUP_GRACE_S = 10.0


class _NodeWatch:
    """What ``cluster up`` does about nodes that die: say so, restart them when asked."""

    def __init__(self, cluster: ChildNodes, restart_after_s: float) -> None:
        self.cluster = cluster
        self.restart_after_s = restart_after_s
        self.down_since: dict[str, float] = {}
        self.restarted_at: dict[str, float] = {}  # the first start is not a restart
        self.given_up: set[str] = set()

    def step(self) -> bool:
        """One look at every node; False when no node is left running or coming back."""
        now = time.monotonic()
        for node in self.cluster.ids:
            if node in self.given_up or self.cluster.alive(node):
                continue
            if node not in self.down_since:
                self._died(node, now)
            elif now - self.down_since[node] >= self.restart_after_s:
                print(f"ledgermq cluster: restarting {node}", file=sys.stderr)
                del self.down_since[node]
                self.restarted_at[node] = now
                self.cluster.start(node)
        return len(self.given_up) < len(self.cluster.ids)

    def _died(self, node: str, now: float) -> None:
        self.down_since[node] = now
        restarted = self.restarted_at.get(node)
        if self.restart_after_s <= 0 or (
            restarted is not None and now - restarted < STARTUP_GRACE_S
        ):
            self.given_up.add(node)
            why = (
                "" if self.restart_after_s <= 0 else f" within {STARTUP_GRACE_S:.0f} s of its start"
            )
            print(f"ledgermq cluster: {node} exited{why}; it stays down", file=sys.stderr)
        else:
            print(
                f"ledgermq cluster: {node} exited; the others go on;"
                f" restarting it in {self.restart_after_s:g} s",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the harness's, not parsed here
        return run_bench(argv[1:])
    args = build_parser().parse_args(hoist_client_options(argv))
    if args.command == "broker":
        return run_broker(args)
    if args.command not in SERVER_COMMANDS or getattr(args, "client_handler", None):
        return run_client_command(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "cluster":
            return cluster_up(args)
        if args.command == "demo":
            return run_demo(args)
    except (OSError, ValueError, TimeoutError, RuntimeError, AssertionError) as e:
        print(f"ledgermq {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
