"""LedgerMQ next to NATS JetStream, etcd, pysyncobj and the HTTP floor, in one command.

    make bench-peers                                  # the full run (see bench/README.md)
    make bench-peers ARGS=--quick                     # smoke run, a few minutes
    .venv/bin/python bench/peers_bench.py --help

The code is the ``bench/peerbench`` package; this file only puts ``bench/`` and the
repository root on ``sys.path`` (the other benchmarks are scripts, not a package) and
runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peerbench.main import main  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
