"""The PySpark data source ``ledgermq`` (docs/spark.md): ``from ledgermq.spark import
LedgerMQDataSource``, then ``spark.dataSource.register(LedgerMQDataSource)``.

The package's pure parts (``options``, ``offsets``, ``pages``, ``produce``) and its
broker traffic (``transfer``) import no Spark; only ``source`` does, and it is loaded
when ``LedgerMQDataSource`` is first asked for, so those parts work (and are tested)
without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import LedgerMQDataSource

__all__ = ["LedgerMQDataSource"]


def __getattr__(name: str) -> Any:
    if name == "LedgerMQDataSource":
        from .source import LedgerMQDataSource  # noqa: PLC0415 - pyspark only when asked

        return LedgerMQDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
