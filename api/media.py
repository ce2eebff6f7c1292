"""Media types of the HTTP API and the pull route's content negotiation (docs/http.md).

JSON is every route's default. The pull route also answers an Arrow IPC stream
(``ARROW_STREAM``) when the request's ``Accept`` names it; its pull status and offsets
travel in the ``PULL_*`` response headers, since the stream holds only the messages.
This module needs nothing optional: a node without pyarrow still parses the header and
answers 406.
"""

from __future__ import annotations

from typing import Any

from broker.errors import BrokerError

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"

# Response headers of an Arrow pull: what the JSON body's fields say besides "messages".
PULL_STATUS = "LedgerMQ-Pull-Status"
PULL_NEXT_OFFSET = "LedgerMQ-Next-Offset"
PULL_MIN_OFFSET = "LedgerMQ-Min-Offset"
PULL_MAX_OFFSET = "LedgerMQ-Max-Offset"
PULL_COUNT = "LedgerMQ-Message-Count"


def _quality(params: list[str]) -> float:
    for p in params:
        name, _, value = p.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


def wants_arrow(accept: str | None) -> bool:
    """True when ``Accept`` names the Arrow stream type with a quality above 0 and at
    least that of any JSON it also names; ``*/*``, a missing header or JSON alone keep
    the JSON default."""
    if not accept or "arrow" not in accept:
        return False
    arrow_q = json_q = 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        media = media.strip().lower()
        if media == ARROW_STREAM:
            arrow_q = max(arrow_q, _quality(params))
        elif media == JSON:
            json_q = max(json_q, _quality(params))
    return arrow_q > 0 and arrow_q >= json_q


# ---- the pull route's OpenAPI description of the Arrow answer ---------------------------------


class NotAcceptableError(BrokerError):
    """The request asked for a representation this node cannot produce."""

    code = "NOT_ACCEPTABLE"
    http_status = 406


ARROW_PULL_DOC = f"""With `Accept: {ARROW_STREAM}` the answer is an Arrow IPC stream
instead of JSON: the messages as record batches of the Spark schema (docs/spark.md: key, keys,
value as binary, topic, queue_id, queue_offset, msg_id, tags, properties as a map of the
producer's own properties, born_timestamp and store_timestamp as timestamp[us, UTC]), and
the status and offsets in the headers `{PULL_STATUS}`, `{PULL_NEXT_OFFSET}`,
`{PULL_MIN_OFFSET}`, `{PULL_MAX_OFFSET}` and `{PULL_COUNT}`. Bodies are
never base64-encoded there, so `encoding` does not apply, and a page may hold up to the
node's `max_arrow_pull_messages` (10,000 by default; JSON: `max_pull_messages`, 1,000).
JSON stays the default; a node without the `arrow` extra answers such a request 406
NOT_ACCEPTABLE."""

ARROW_PULL_RESPONSE: dict[str, Any] = {
    "description": "the pull, as JSON or (when asked) as an Arrow IPC stream",
    "content": {
        ARROW_STREAM: {
            "schema": {"type": "string", "format": "binary"},
        }
    },
    "headers": {
        name: {"description": what, "schema": {"type": kind}}
        for name, what, kind in (
            (PULL_STATUS, "FOUND, NO_NEW_MSG, NO_MATCHED_MSG or OFFSET_ILLEGAL", "string"),
            (PULL_NEXT_OFFSET, "the offset to pull from next (Arrow only)", "integer"),
            (PULL_MIN_OFFSET, "the queue's first offset (Arrow only)", "integer"),
            (PULL_MAX_OFFSET, "the queue's next offset to write (Arrow only)", "integer"),
            (PULL_COUNT, "messages in the stream (Arrow only)", "integer"),
        )
    },
}
