"""The ``ledgermq`` command line (API.md §1). Later issues add broker, cluster, topic,
produce, consume and status commands; today it runs the store demonstration."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dledger.store.demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledgermq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demonstration and exit")
    demo.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    demo.add_argument("--entries", type=int, default=200_000)
    demo.add_argument("--body-bytes", type=int, default=1024)
    demo.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        try:
            run_demo(args.data_dir, args.entries, args.body_bytes, args.batch)
        except (OSError, ValueError) as e:
            print(f"ledgermq demo: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
