"""``ledgermq.spark.options``: parsing, checking and redaction of the data source's options
(pure: no Spark). Keys are given in mixed case here; Spark hands them lower-cased."""

from __future__ import annotations

import pytest

from ledgermq.spark.offsets import EARLIEST, LATEST, OffsetSpec
from ledgermq.spark.options import (
    REDACTED,
    Connection,
    OptionError,
    parse_read_options,
    parse_write_options,
    redact,
)

BASE = {"brokers": "127.0.0.1:8080, http://127.0.0.1:8081/", "topic": "orders"}


def test_defaults_of_a_batch_read() -> None:
    o = parse_read_options(BASE, streaming=False)
    assert o.connection.brokers == ("http://127.0.0.1:8080", "http://127.0.0.1:8081")
    assert o.topic == "orders" and o.queue_ids is None
    assert o.starting == OffsetSpec(EARLIEST) and o.ending == OffsetSpec(LATEST)
    assert (o.min_partitions, o.fail_on_data_loss, o.pull_batch_size) == (None, True, 10_000)
    assert o.pull_format == "arrow" and o.max_offsets_per_trigger is None
    settings = o.connection.client_settings()
    assert (settings.timeout_s, settings.deadline_s, settings.max_attempts) == (30.0, 60.0, 32)


def test_every_option_in_any_case() -> None:
    o = parse_read_options(
        {
            **BASE,
            "startingOffsets": '{"0": 10, "3": -2}',
            "ENDINGOFFSETS": '{"orders": {"0": 20, "3": -1}}',
            "queueIds": "[3, 0]",
            "minPartitions": "6",
            "failOnDataLoss": "FALSE",
            "pullBatchSize": "250",
            "pullFormat": "JSON",
            "authToken": "tok",
            "requestTimeoutMs": "500",
            "retryDeadlineMs": "9000",
            "maxAttempts": "3",
            "readTimeoutMs": "1000",
        },
        streaming=False,
    )
    assert o.starting == OffsetSpec(EARLIEST, offsets={0: 10, 3: EARLIEST})
    assert o.ending == OffsetSpec(LATEST, offsets={0: 20, 3: LATEST})
    assert o.queue_ids == (0, 3) and o.min_partitions == 6 and not o.fail_on_data_loss
    assert (o.pull_batch_size, o.pull_format, o.read_timeout_ms) == (250, "json", 1000)
    assert o.connection == Connection(
        o.connection.brokers, "tok", request_timeout_ms=500, retry_deadline_ms=9000, max_attempts=3
    )


def test_timestamps_win_over_offsets() -> None:
    o = parse_read_options(
        {
            **BASE,
            "startingOffsets": "earliest",
            "startingTimestamp": "1700000000000",
            "endingOffsetsByTimestamp": '{"1": 1700000000500}',
        },
        streaming=False,
    )
    assert o.starting.all_timestamp == 1_700_000_000_000
    assert o.ending == OffsetSpec(LATEST, timestamps={1: 1_700_000_000_500})


def test_streams_start_at_latest_and_take_their_own_options() -> None:
    o = parse_read_options(
        {**BASE, "maxOffsetsPerTrigger": "100", "groupId": "etl"}, streaming=True
    )
    assert o.starting == OffsetSpec(LATEST) and o.max_offsets_per_trigger == 100
    assert o.group_id == "etl"
    assert parse_read_options({**BASE, "startingOffsets": "latest"}, streaming=True).starting == (
        OffsetSpec(LATEST)
    )
    spec = parse_read_options({**BASE, "startingOffsets": "earliest"}, streaming=True).starting
    assert spec == OffsetSpec(EARLIEST)
    spec = parse_read_options({**BASE, "startingOffsets": '{"0": -1, "1": -2}'}, streaming=True)
    assert spec.starting == OffsetSpec(LATEST, offsets={0: LATEST, 1: EARLIEST})


@pytest.mark.parametrize(
    ("extra", "streaming", "match"),
    [
        ({"startingOffset": "earliest"}, False, r"unknown read option\(s\) \['startingoffset'\]"),
        ({"startingOffsets": "latest"}, False, "makes no sense"),
        ({"endingOffsets": "earliest"}, False, "makes no sense"),
        ({"startingOffsets": '{"0": -1}'}, False, "-2 for earliest"),
        ({"endingOffsets": '{"0": -2}'}, False, "-1 for latest"),
        ({"startingOffsets": '{"0": -7}'}, False, "queue 0: -7"),
        ({"startingOffsets": '{"0": -3}'}, True, "-2 for earliest or -1 for latest"),
        ({"startingOffsets": "{nope"}, False, "not JSON"),
        ({"startingOffsets": '{"x": 1}'}, False, "not a queue id"),
        ({"startingOffsets": '{"0": true}'}, False, "not a queue id"),
        ({"startingOffsets": "[]"}, False, "want an object"),
        ({"startingOffsetsByTimestamp": '{"0": -5}'}, False, "milliseconds"),
        ({"startingTimestamp": "soon"}, False, "not an integer"),
        ({"queueIds": "a,b"}, False, "queueIds"),
        ({"minPartitions": "0"}, False, "below 1"),
        ({"failOnDataLoss": "maybe"}, False, "true or false"),
        ({"pullFormat": "xml"}, False, "arrow or json"),
        ({"maxOffsetsPerTrigger": "5"}, False, "for streams"),
        ({"groupId": "g"}, False, "for streams"),
        ({"groupId": "bad group"}, True, "not a group name"),
        ({"endingOffsets": "latest"}, True, "batch reads"),
        ({"brokers": "ftp://x"}, False, "option brokers"),
        ({"topic": "bad topic"}, False, "not a topic name"),
    ],
)
def test_bad_options_are_refused_by_name(
    extra: dict[str, str], streaming: bool, match: str
) -> None:
    with pytest.raises(OptionError, match=match):
        parse_read_options({**BASE, **extra}, streaming=streaming)


def test_brokers_and_topic_are_required_and_path_names_the_topic() -> None:
    with pytest.raises(OptionError, match="brokers is required"):
        parse_read_options({"topic": "t"}, streaming=False)
    with pytest.raises(OptionError, match="topic is required"):
        parse_read_options({"brokers": "h:1"}, streaming=False)
    assert parse_read_options({"brokers": "h:1", "path": "t"}, streaming=False).topic == "t"


def test_write_options() -> None:
    w = parse_write_options({**BASE, "maxMessagesPerRequest": "10", "maxRequestBytes": "4096"})
    assert (w.topic, w.max_messages_per_request, w.max_request_bytes) == ("orders", 10, 4096)
    with pytest.raises(OptionError, match="unknown write option"):
        parse_write_options({**BASE, "startingOffsets": "earliest"})
    with pytest.raises(OptionError, match="below 1024"):
        parse_write_options({**BASE, "maxRequestBytes": "10"})


def test_the_token_is_never_shown() -> None:
    secret = "s3cr3t-t0ken"
    o = parse_read_options({**BASE, "authToken": secret}, streaming=False)
    assert o.connection.auth_token == secret
    assert secret not in repr(o) and secret not in str(o.connection)
    assert redact({"authToken": secret, "topic": "t"}) == {"authToken": REDACTED, "topic": "t"}
    with pytest.raises(OptionError) as e:
        parse_read_options({**BASE, "authToken": secret, "bogus": "1"}, streaming=False)
    assert secret not in str(e.value)
