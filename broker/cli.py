"""The ``ledgermq`` command line (API.md §1). The HTTP issue adds broker, cluster, topic,
produce, consume and status commands; today it runs the failover demonstration
(``demo``) and the store demonstration (``store-demo``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dledger.store.demo import run_demo as run_store_demo

from .demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledgermq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the 3-broker failover demonstration and exit")
    demo.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    demo.add_argument("--messages", type=int, default=20_000, help="per produce phase")
    demo.add_argument("--body-bytes", type=int, default=1024)
    demo.add_argument("--batch", type=int, default=100)
    sdemo = sub.add_parser("store-demo", help="run the log store demonstration and exit")
    sdemo.add_argument("--data-dir", type=Path, default=None)
    sdemo.add_argument("--entries", type=int, default=200_000)
    sdemo.add_argument("--body-bytes", type=int, default=1024)
    sdemo.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "demo":
            run_demo(args.data_dir, args.messages, args.batch, args.body_bytes)
        elif args.command == "store-demo":
            run_store_demo(args.data_dir, args.entries, args.body_bytes, args.batch)
    except (OSError, ValueError, TimeoutError, AssertionError) as e:
        print(f"ledgermq {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
