"""``python -m broker``: one LedgerMQ node (the same as ``ledgermq broker``)."""

from api.node import main

raise SystemExit(main())
