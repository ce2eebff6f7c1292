"""The network fronts of a node: the HTTP API (``api.app``, its routes, models, rendering,
auth, metrics and connection limits). The process that serves them is ``ledgermq.node``."""
