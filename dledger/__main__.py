"""``python -m dledger``: run one DLedger node, or talk to a group (``client ...``)."""

from __future__ import annotations

import sys

from .runtime.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
