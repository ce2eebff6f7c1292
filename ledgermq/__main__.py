"""``python -m ledgermq``: one LedgerMQ node (the same as ``ledgermq broker``)."""

from ledgermq.node import main

raise SystemExit(main())
