"""HTTP API (``api.app``), node runner (``api.node``), local clusters (``api.cluster``),
Python client (``api.client``) and the client commands of ``ledgermq``."""
