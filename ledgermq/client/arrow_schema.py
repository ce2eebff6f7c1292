"""The Arrow schema of a pull page (docs/spark.md), shared by the broker's encoder
(``api.arrow``) and the Spark source (``ledgermq.spark``) without importing either side.

It is the schema Spark's ``to_arrow_schema`` derives from the source's declared schema
(UTC session time zone), field for field: Spark refuses Arrow batches from a Python data
source whose schema differs in any type.
"""

from __future__ import annotations

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("keys", pa.list_(pa.field("element", pa.string()))),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("queue_offset", pa.int64()),
        pa.field("msg_id", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("born_timestamp", TIMESTAMP),
        pa.field("store_timestamp", TIMESTAMP),
    ]
)
