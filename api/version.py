"""LedgerMQ's version, as installed: shown by ``ledgermq --version``, ``/v1/cluster``
and the ``ledgermq_build_info`` metric (docs/operations.md "Upgrades")."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("ledgermq")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"

PYTHON = platform.python_version()
