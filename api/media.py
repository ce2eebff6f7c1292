"""Media types of the HTTP API and the pull route's content negotiation (docs/http.md).

JSON is every route's default. The pull route also answers an Arrow IPC stream
(``ARROW_STREAM``) or a record page (``RECORDS``, ``api.fetch``) when the request's
``Accept`` names one (``pull_format``); their pull status and offsets travel in the
``PULL_*`` response headers too (an Arrow stream holds only the messages). This module
needs nothing optional: a node without pyarrow still parses the header and answers an
Arrow request 406.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.errors import BrokerError

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
RECORDS = "application/vnd.ledgermq.records"
RECORDS_ONLY = (RECORDS,)  # the binary answer of a group pull and a POP receive

# Response headers of a binary pull: what the JSON body's fields say besides "messages".
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


def pull_format(accept: str | None, offered: tuple[str, ...] = (RECORDS, ARROW_STREAM)) -> str:
    """The pull answer's media type: one of the binary types ``offered`` (``RECORDS``,
    ``ARROW_STREAM``) when ``Accept`` names it with a quality above 0 and at least that
    of JSON and of the other binary type it also names (a tie: the record page, then
    Arrow), else ``JSON``. ``*/*``, a missing header, JSON alone, types the route does
    not make and qualities that do not parse (0) keep the JSON default. The group pull
    and the POP receive offer ``RECORDS`` alone (an Arrow type they ignore)."""
    if not accept or "vnd." not in accept.lower():
        return JSON
    best, best_q = JSON, 0.0
    quality = {JSON: 0.0, ARROW_STREAM: 0.0, RECORDS: 0.0}
    for item in accept.split(","):
        media, *params = item.split(";")
        media = media.strip().lower()
        if media in quality:
            quality[media] = max(quality[media], _quality(params))
    for media in (RECORDS, ARROW_STREAM):
        q = quality[media]
        if media not in offered:
            continue
        if q > 0 and q >= quality[JSON] and q > best_q:
            best, best_q = media, q
    return best


def wants_arrow(accept: str | None) -> bool:
    """True when ``Accept`` makes the pull an Arrow stream (``pull_format``)."""
    return pull_format(accept) == ARROW_STREAM


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
NOT_ACCEPTABLE.

With `Accept: {RECORDS}` the answer is a record page (docs/formats.md "Record pages"):
a 40-byte header block (magic `LMQR`, version, status, next_offset, min_offset,
max_offset, counts), the msg id prefix, a table of 16 bytes per message (queue_offset,
its record's position, its index in a batch record) and the stored commitlog records
back to back, as RocketMQ writes them; the same headers as the Arrow answer. The page
takes what the JSON pull takes (`max_pull_messages`, `max_response_bytes`), with the
same statuses, tag filter and long poll; `encoding` does not apply. Every node answers
it."""

ARROW_PULL_RESPONSE: dict[str, Any] = {
    "description": "the pull, as JSON or (when asked) as an Arrow IPC stream or a record page",
    "content": {
        ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}},
        RECORDS: {"schema": {"type": "string", "format": "binary"}},
    },
    "headers": {
        name: {"description": what, "schema": {"type": kind}}
        for name, what, kind in (
            (PULL_STATUS, "FOUND, NO_NEW_MSG, NO_MATCHED_MSG or OFFSET_ILLEGAL", "string"),
            (PULL_NEXT_OFFSET, "the offset to pull from next (binary answers)", "integer"),
            (PULL_MIN_OFFSET, "the queue's first offset (binary answers)", "integer"),
            (PULL_MAX_OFFSET, "the queue's next offset to write (binary answers)", "integer"),
            (PULL_COUNT, "messages in the answer (binary answers)", "integer"),
        )
    },
}


GROUP_PULL_DOC = f"""With `Accept: {RECORDS}` the answer is binary: a record page per queue
looked at, each as the one-queue pull makes it, with its queue's status and next offset
(the JSON body's `next_offsets`), framed by a 16-byte header (magic `LMQG`, version,
page and message counts) and 8 bytes per page (queue_id, the page's length); docs/formats.md
"Record pages of many queues". The messages, budget, long poll, commit and errors are the
JSON group pull's; `encoding` does not apply. The header `{PULL_COUNT}` says how many
messages it holds."""

RECEIVE_DOC = f"""With `Accept: {RECORDS}` the answer is binary (docs/formats.md "Record
pages of many queues"): a 16-byte header (magic `LMQP`, version, page and message
counts), a receipt per message (delivery_attempt, invisible_until, the receipt handle),
then the messages as record pages, one per run of a queue's messages. What is handed out,
the long poll and the errors are the JSON receive's; `encoding` does not apply."""

RECORDS_RESPONSE: dict[str, Any] = {
    "description": "JSON, or (when asked) record pages",
    "content": {RECORDS: {"schema": {"type": "string", "format": "binary"}}},
    "headers": {
        PULL_COUNT: {"description": "messages (binary answers)", "schema": {"type": "integer"}}
    },
}


class PullAnswer(Protocol):
    """A binary pull's answer (a record page, an Arrow stream): what its headers say."""

    @property
    def status(self) -> str: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def min_offset(self) -> int: ...
    @property
    def max_offset(self) -> int: ...
    @property
    def count(self) -> int: ...


def pull_headers(r: PullAnswer) -> dict[str, str]:
    """The ``PULL_*`` response headers of a binary pull: its status and offsets, for a
    reader with curl (the JSON pull has them in its body)."""
    return {
        PULL_STATUS: r.status,
        PULL_NEXT_OFFSET: str(r.next_offset),
        PULL_MIN_OFFSET: str(r.min_offset),
        PULL_MAX_OFFSET: str(r.max_offset),
        PULL_COUNT: str(r.count),
    }
