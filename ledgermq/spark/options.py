"""Options of the ledgermq data source, parsed and checked once (pure, no Spark).

Spark hands a Python data source its options with lower-cased keys (``startingOffsets``
arrives as ``startingoffsets``), so every key is matched lower-cased here, whoever calls.
Names follow Spark's Kafka source where the meaning is the same (docs/spark.md). An unknown
key is an error, not a silent no-op: a misspelt ``startingOffset`` would otherwise read
from the default. ``authToken`` never appears in a repr, a log line or an error message
(``redact``); Spark's own plan output redacts it too, by its ``token`` substring.

Every limit is an option with a default: ``pullBatchSize`` (messages per pull: 10,000 for
the Arrow pull, 1,000 for JSON, the brokers' defaults of ``max_arrow_pull_messages`` and
``max_pull_messages``), ``requestTimeoutMs`` (one HTTP request),
``retryDeadlineMs`` and ``maxAttempts`` (one operation, across brokers and retries),
``readTimeoutMs`` (how long a task waits for a lagging node to hold its range), and for
writes ``maxMessagesPerRequest`` / ``maxRequestBytes`` (the produce API's limits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import orjson

from ledgermq.client import ClientSettings, parse_brokers

from .offsets import EARLIEST, LATEST, OffsetSpec

REDACTED = "*********(redacted)"
SECRET_KEYS = frozenset({"authtoken"})
TOPIC = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
GROUP = re.compile(r"[A-Za-z0-9_%|-]{1,127}")
MiB = 1 << 20

# Keys Spark itself puts among a source's or sink's options (``load(path)``, and a
# streaming sink's checkpoint): taken without complaint (``path`` may name the topic).
SPARK_KEYS = frozenset({"path", "checkpointlocation"})
CONNECTION_KEYS = SPARK_KEYS | {
    "brokers",
    "topic",
    "authtoken",
    "requesttimeoutms",
    "retrydeadlinems",
    "maxattempts",
}
READ_KEYS = CONNECTION_KEYS | {
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "queueids",
    "minpartitions",
    "failondataloss",
    "pullbatchsize",
    "pullformat",
    "readtimeoutms",
    "maxoffsetspertrigger",
    "groupid",
}
WRITE_KEYS = CONNECTION_KEYS | {"maxmessagesperrequest", "maxrequestbytes"}


class OptionError(ValueError):
    """A missing, unknown or malformed option (the message names it)."""


def redact(options: Mapping[str, str]) -> dict[str, str]:
    """The options as they may be shown: secrets replaced."""
    return {k: REDACTED if k.lower() in SECRET_KEYS else v for k, v in options.items()}


# ---- shared -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach the brokers: any node of the list answers reads, writes find the
    master; failover and retries are the Python client's, bounded by these settings."""

    brokers: tuple[str, ...]
    auth_token: str | None = field(default=None, repr=False)
    request_timeout_ms: int = 30_000
    retry_deadline_ms: int = 60_000
    max_attempts: int = 32

    def client_settings(self) -> ClientSettings:
        return ClientSettings(
            timeout_s=self.request_timeout_ms / 1000,
            connect_timeout_s=min(5.0, self.request_timeout_ms / 1000),
            deadline_s=self.retry_deadline_ms / 1000,
            max_attempts=self.max_attempts,
            auth_token=self.auth_token,
            # pullFormat=json is the JSON pull (docs/spark.md); arrow asks for Arrow itself
            record_pull=False,
        )


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _check_known(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(opts) - known)
    if unknown:
        raise OptionError(
            f"unknown {what} option(s) {unknown}; known (any case): {sorted(known - SPARK_KEYS)}"
        )


def _int(opts: Mapping[str, str], key: str, default: int, *, minimum: int = 0) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {key}: {raw!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option {key}: {value} is below {minimum}")
    return value


def _optional_int(opts: Mapping[str, str], key: str, *, minimum: int) -> int | None:
    return _int(opts, key, 0, minimum=minimum) if key in opts else None


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {key}: {raw!r} is not true or false")
    return value == "true"


def _connection(opts: Mapping[str, str]) -> tuple[Connection, str]:
    if "brokers" not in opts:
        raise OptionError('option brokers is required, e.g. "http://h0:8080,http://h1:8081"')
    try:
        brokers = tuple(parse_brokers(opts["brokers"]))
    except ValueError as e:
        raise OptionError(f"option brokers: {e}") from None
    topic = opts.get("topic") or opts.get("path")
    if not topic:
        raise OptionError("option topic is required")
    if not TOPIC.fullmatch(topic):
        raise OptionError(f"option topic: {topic!r} is not a topic name [A-Za-z0-9_%|-]{{1,127}}")
    token = opts.get("authtoken") or None
    conn = Connection(
        brokers,
        token,
        request_timeout_ms=_int(opts, "requesttimeoutms", 30_000, minimum=1),
        retry_deadline_ms=_int(opts, "retrydeadlinems", 60_000, minimum=1),
        max_attempts=_int(opts, "maxattempts", 32, minimum=1),
    )
    return conn, topic


# ---- offsets ----------------------------------------------------------------------------------


def _queue_json(key: str, raw: str, topic: str) -> dict[int, int]:
    """``{"0": 23, "3": -2}``; Kafka's nested ``{"<topic>": {...}}`` is accepted too."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise OptionError(f'option {key}: {raw!r} is not JSON like {{"0": 10, "3": -2}}') from None
    if isinstance(doc, dict) and len(doc) == 1 and isinstance(doc.get(topic), dict):
        doc = doc[topic]
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f'option {key}: want an object of queue id → value, like {{"0": 10}}')
    out = {}
    for k, v in doc.items():
        if not k.isdigit() or len(k) > 5 or isinstance(v, bool) or not isinstance(v, int):
            raise OptionError(f"option {key}: {k!r}: {v!r} is not a queue id → integer")
        out[int(k)] = v
    return out


def _offset_spec(
    opts: Mapping[str, str], which: Literal["starting", "ending"], topic: str, *, streaming: bool
) -> OffsetSpec:
    default = EARLIEST if which == "starting" else LATEST
    if streaming and which == "starting":
        default = LATEST  # a new stream starts at the end, as Kafka's does
    # A batch read from latest, or to earliest, would be empty: Kafka's source refuses
    # both, and so does this one; a stream may start anywhere.
    forbidden = EARLIEST if which == "ending" else None if streaming else LATEST
    key = f"{which}offsets"
    ts_key, by_ts_key = f"{which}timestamp", f"{which}offsetsbytimestamp"
    if streaming and which == "ending" and ({key, ts_key, by_ts_key} & set(opts)):
        raise OptionError("ending offsets are for batch reads, not for streams")
    if ts_key in opts:
        return OffsetSpec(default, all_timestamp=_int(opts, ts_key, 0))
    if by_ts_key in opts:
        stamps = _queue_json(by_ts_key, opts[by_ts_key], topic)
        if any(t < 0 for t in stamps.values()):
            raise OptionError(f"option {by_ts_key}: timestamps are milliseconds >= 0")
        return OffsetSpec(default, timestamps=stamps)
    raw = opts.get(key, "").strip()
    if not raw:
        return OffsetSpec(default)
    name = {"earliest": EARLIEST, "latest": LATEST}.get(raw.lower())
    if name is not None:
        if name == forbidden:
            raise OptionError(f"option {key}: {raw} makes no sense here (the read would be empty)")
        return OffsetSpec(name)
    offsets = _queue_json(key, raw, topic)
    allowed = {EARLIEST: "-2 for earliest", LATEST: "-1 for latest"}
    allowed.pop(forbidden, None)  # type: ignore[arg-type]
    for q, off in offsets.items():
        if off < 0 and off not in allowed:
            raise OptionError(
                f"option {key}: queue {q}: {off} (want an offset >= 0, "
                f"{' or '.join(allowed.values())})"
            )
    return OffsetSpec(default, offsets=offsets)


def _queue_ids(opts: Mapping[str, str]) -> tuple[int, ...] | None:
    raw = opts.get("queueids")
    if raw is None:
        return None
    text = raw.strip().removeprefix("[").removesuffix("]")
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and len(p) <= 5 for p in parts):
        raise OptionError(f"option queueIds: {raw!r} is not a list of queue ids like 0,3,5")
    return tuple(sorted({int(p) for p in parts}))


# ---- reads and writes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadOptions:
    connection: Connection
    topic: str
    queue_ids: tuple[int, ...] | None = None
    starting: OffsetSpec = field(default_factory=OffsetSpec)
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec(LATEST))
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    pull_batch_size: int = 10_000
    pull_format: Literal["arrow", "json"] = "arrow"
    read_timeout_ms: int = 60_000
    max_offsets_per_trigger: int | None = None
    group_id: str | None = None


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """The read options of ``spark.read`` (or, ``streaming``, ``spark.readStream``)."""
    opts = _lower(options)
    _check_known(opts, READ_KEYS, "read")
    conn, topic = _connection(opts)
    pull_format = opts.get("pullformat", "arrow").strip().lower()
    if pull_format not in ("arrow", "json"):
        raise OptionError(f"option pullFormat: {pull_format!r} is not arrow or json")
    group = opts.get("groupid") or None
    if group is not None and not GROUP.fullmatch(group):
        raise OptionError(f"option groupId: {group!r} is not a group name")
    if not streaming:
        for key in ("maxoffsetspertrigger", "groupid"):
            if key in opts:
                raise OptionError(f"option {key} is for streams (readStream), not batch reads")
    return ReadOptions(
        connection=conn,
        topic=topic,
        queue_ids=_queue_ids(opts),
        starting=_offset_spec(opts, "starting", topic, streaming=streaming),
        ending=_offset_spec(opts, "ending", topic, streaming=streaming),
        min_partitions=_optional_int(opts, "minpartitions", minimum=1),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        pull_batch_size=_int(
            opts, "pullbatchsize", 10_000 if pull_format == "arrow" else 1000, minimum=1
        ),
        pull_format="json" if pull_format == "json" else "arrow",
        read_timeout_ms=_int(opts, "readtimeoutms", 60_000, minimum=1),
        max_offsets_per_trigger=_optional_int(opts, "maxoffsetspertrigger", minimum=1),
        group_id=group,
    )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    connection: Connection
    topic: str
    max_messages_per_request: int = 1000
    max_request_bytes: int = 16 * MiB


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    _check_known(opts, WRITE_KEYS, "write")
    conn, topic = _connection(opts)
    return WriteOptions(
        conn,
        topic,
        max_messages_per_request=_int(opts, "maxmessagesperrequest", 1000, minimum=1),
        max_request_bytes=_int(opts, "maxrequestbytes", 16 * MiB, minimum=1024),
    )
