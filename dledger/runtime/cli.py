"""The command line of a DLedger node and its tiny client.

    python -m dledger --id n0 --group g0 \\
        --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913" --data-dir DIR
    python -m dledger client --group g0 --peers "..." append "hello" "world"
    python -m dledger client --group g0 --peers "..." get 0 --count 10
    python -m dledger client --group g0 --peers "..." status

With a peer secret (docs/operations.md), give every node and the client the same one:
``--peer-secret-file PATH``, or ``LEDGERMQ_PEER_SECRET`` in the environment (both stay
out of ``ps``, unlike ``--peer-secret VALUE``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

import orjson

from ..core.settings import CoreSettings
from ..store import StoreSettings
from .client import DLedgerClient
from .peer_auth import PEER_SECRET_ENV, PEER_SECRET_FILE_ENV, load_peer_secret
from .server import DLedgerServer, ServerConfig, parse_peers
from .transport import TransportSettings

MiB = 1 << 20


def _add_peer_secret_options(ap: argparse.ArgumentParser) -> None:
    """``--peer-secret`` / ``--peer-secret-file``, defaults from the environment (the
    same variables as ``ledgermq broker``)."""
    ap.add_argument(
        "--peer-secret",
        default=os.environ.get(PEER_SECRET_ENV),
        help="authenticate Raft connections with this shared secret; visible in ps, "
        f"prefer --peer-secret-file or {PEER_SECRET_ENV} [env {PEER_SECRET_ENV}]",
    )
    ap.add_argument(
        "--peer-secret-file",
        type=Path,
        default=os.environ.get(PEER_SECRET_FILE_ENV),
        help=f"read the peer secret from this file [env {PEER_SECRET_FILE_ENV}]",
    )


def peer_secret_from_args(a: argparse.Namespace) -> bytes | None:
    try:
        return load_peer_secret(a.peer_secret, a.peer_secret_file)
    except ValueError as e:
        raise SystemExit(f"python -m dledger: {e}") from None


def _node_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dledger", description="Run one DLedger node.")
    ap.add_argument("--id", required=True, help="this node's id, one of --peers")
    ap.add_argument("--group", default="g0")
    ap.add_argument("--peers", required=True, help='"n0-host:port;n1-host:port;..."')
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument(
        "--profile",
        choices=("fast", "dledger"),
        default="fast",
        help="timing defaults: ours (200 ms heartbeats) or DLedger's (2 s)",
    )
    ap.add_argument(
        "--flush",
        choices=("sync", "async"),
        default=None,
        help="sync: entries and votes are on disk before any reply (default)",
    )
    ap.add_argument("--heartbeat-ms", type=int, default=None)
    ap.add_argument("--data-file-mib", type=int, default=1024)
    ap.add_argument("--preferred-leader", default="", help="ids separated by ';'")
    ap.add_argument("--seed", type=int, default=None, help="seed the election RNG")
    _add_peer_secret_options(ap)
    ap.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the parent process goes away (tests, benchmarks)",
    )
    ap.add_argument("--log-level", default="INFO")
    return ap


def settings_from_args(a: argparse.Namespace) -> ServerConfig:
    core = CoreSettings.dledger() if a.profile == "dledger" else CoreSettings()
    changes: dict[str, object] = {}
    if a.flush:
        changes["flush"] = a.flush
    if a.heartbeat_ms:
        changes["heartbeat_interval_ms"] = a.heartbeat_ms
    if a.preferred_leader:
        changes["preferred_leader_ids"] = tuple(filter(None, a.preferred_leader.split(";")))
    core = dataclasses.replace(core, **changes)  # type: ignore[arg-type]
    peers = parse_peers(a.peers)
    if a.id not in peers:
        raise SystemExit(f"--id {a.id!r} is not in --peers {sorted(peers)}")
    store = StoreSettings(data_file_size=a.data_file_mib * MiB)
    return ServerConfig(
        group=a.group,
        self_id=a.id,
        peers=peers,
        data_dir=a.data_dir,
        core=core,
        store=store,
        transport=TransportSettings(peer_secret=peer_secret_from_args(a)),
        seed=a.seed,
    )


async def run_node(config: ServerConfig, *, exit_with_parent: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    async with DLedgerServer(config):
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
            if exit_with_parent and os.getppid() != parent:
                logging.getLogger(__name__).warning("parent %d is gone; stopping", parent)
                break


def _run(coro: object) -> None:
    try:
        import uvloop  # noqa: PLC0415 — optional at import time (not on Windows)
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
    else:
        uvloop.run(coro)  # type: ignore[arg-type]


def _client(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m dledger client")
    ap.add_argument("--group", default="g0")
    ap.add_argument("--peers", required=True)
    _add_peer_secret_options(ap)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_append = sub.add_parser("append", help="append bodies (UTF-8 text) after quorum commit")
    p_append.add_argument("bodies", nargs="+")
    p_get = sub.add_parser("get", help="read committed entries from a node")
    p_get.add_argument("index", type=int)
    p_get.add_argument("--count", type=int, default=1)
    p_get.add_argument("--node", default=None, help="node id to read from (default: first)")
    sub.add_parser("status", help="every node's status")
    a = ap.parse_args(argv)
    peers = parse_peers(a.peers)
    secret = peer_secret_from_args(a)

    async def go() -> None:
        async with DLedgerClient(peers, a.group, peer_secret=secret) as c:
            if a.cmd == "append":
                r = await c.append([b.encode() for b in a.bodies])
                print(
                    orjson.dumps(
                        {
                            "leader": r.local_id,
                            "first_index": r.first_index,
                            "positions": list(r.positions),
                        }
                    ).decode()
                )
            elif a.cmd == "get":
                for e in await c.get(a.node or next(iter(peers)), a.index, a.count):
                    print(
                        orjson.dumps(
                            {
                                "index": e.index,
                                "term": e.term,
                                "pos": e.pos,
                                "magic": e.magic,
                                "body": e.body.decode(errors="replace"),
                            }
                        ).decode()
                    )
            else:
                for node in peers:
                    try:
                        st = await c.status(node)
                    except (OSError, TimeoutError) as e:
                        st = {"self_id": node, "error": repr(e)}
                    print(orjson.dumps(st).decode())

    _run(go())
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["client"]:
        return _client(argv[1:])
    a = _node_parser().parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format=f"%(asctime)s {a.id} %(levelname)s %(name)s: %(message)s"
    )
    config = settings_from_args(a)
    _run(run_node(config, exit_with_parent=a.exit_with_parent))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
