"""``api.arrow.encode_page`` without a broker: records built with the real codec
(``broker.message.encode_message``) laid out as a commitlog would hold them (entry
headers and other queues' records in between), encoded as Arrow, and compared field by
field with what the JSON pull's decoder (``decode_message``) says of the same bytes."""

from __future__ import annotations

import datetime as dt
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.arrow import SCHEMA, PageFormatError, encode_page, ipc_stream
from broker.batch import encode_batch_record
from broker.message import (
    BODY_POS,
    PROP_BATCH_INDEX,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    SYS_FLAG_POS,
    TOTAL_SIZE_POS,
    MessageFormatError,
    decode_message,
    encode_message,
    message_properties,
    set_physical_offset,
    set_queue_id_and_offset,
)
from broker.msgid import make_msg_id
from broker.pages import RawPage
from broker.properties import encode_properties, inner_properties
from consumequeue.queue import UNIT

ENTRY_HEADER = 48
GROUP = "g0"

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
    max_size=12,
)
key = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02 "),
    min_size=1,
    max_size=8,
)
message = st.fixed_dictionaries(
    {
        "body": st.binary(max_size=300),
        "tags": st.none() | key,
        "keys": st.lists(key, max_size=3, unique=True),
        "props": st.dictionaries(
            key.filter(lambda k: k not in {PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY}), text, max_size=4
        ),
        "session": st.booleans(),
        "born": st.integers(min_value=0, max_value=2**41),
    }
)


def build_log(
    messages: list[dict[str, object]],
    topic: str = "orders",
    noise: random.Random | None = None,
    others: int | None = None,
) -> tuple[bytes, bytes, list[bytes]]:
    """(log bytes from position 0, the units of ``topic``'s records, those records).
    Between two of them, ``others`` (default: 0 to 2) records of another queue."""
    rng = noise or random.Random(0)
    log = bytearray()
    units, records = [], []
    for i, m in enumerate(messages):
        for _ in range(rng.randrange(3) if others is None else others):
            size = rng.randrange(50) if others is None else 500
            other = encode_message(topic="other", body=b"x" * size, born_timestamp=1)
            log += bytes(ENTRY_HEADER) + other
        props = message_properties(
            m["props"],  # type: ignore[arg-type]
            tags=m["tags"],  # type: ignore[arg-type]
            keys=m["keys"],  # type: ignore[arg-type]
            uniq_key=f"U{i}",
            session=("p-1", 3, i, len(messages)) if m["session"] else None,
        )
        record = encode_message(
            topic=topic,
            body=m["body"],  # type: ignore[arg-type]
            properties=props,
            queue_id=5,
            queue_offset=100 + i,
            born_timestamp=m["born"],  # type: ignore[arg-type]
            store_timestamp=m["born"] + 7,  # type: ignore[operator]
        )
        log += bytes(ENTRY_HEADER)
        set_physical_offset(record, len(log))
        units.append(UNIT.pack(len(log), len(record), 0))
        records.append(bytes(record))
        log += record
    return bytes(log), b"".join(units), records


def expected_rows(records: list[bytes]) -> list[dict[str, object]]:
    utc = dt.UTC
    rows = []
    for raw in records:
        m = decode_message(raw)
        rows.append(
            {
                "key": m.keys[0] if m.keys else None,
                "keys": m.keys,
                "value": m.body,
                "topic": m.topic,
                "queue_id": m.queue_id,
                "queue_offset": m.queue_offset,
                "msg_id": make_msg_id(GROUP, m.commitlog_offset),
                "tags": m.tags,
                "properties": sorted(m.user_properties.items()),
                "born_timestamp": dt.datetime.fromtimestamp(0, utc)
                + dt.timedelta(milliseconds=m.born_timestamp),
                "store_timestamp": dt.datetime.fromtimestamp(0, utc)
                + dt.timedelta(milliseconds=m.store_timestamp),
            }
        )
    return rows


def arrow_rows(page: RawPage) -> list[dict[str, object]]:
    batches, _ = encode_page(page, topic="orders", group=GROUP)
    table = pa.ipc.open_stream(ipc_stream(batches)).read_all()
    assert table.schema.equals(SCHEMA)
    rows = table.to_pylist()
    for r in rows:
        r["properties"] = sorted(r["properties"])
    return rows


def page_of(log: bytes, units: bytes, segment_bytes: int = 1 << 30, span: int = 1 << 24) -> RawPage:
    @contextmanager
    def view(pos: int, size: int) -> Iterator[memoryview]:
        with memoryview(log)[pos : pos + size] as v:
            yield v  # released on exit: a buffer the encoder kept would fail the test

    return RawPage(units, view, segment_bytes, span)


@given(st.lists(message, min_size=1, max_size=25), st.integers(0, 2**32))
def test_every_field_equals_the_json_decoder(messages: list[dict[str, object]], seed: int) -> None:
    log, units, records = build_log(messages, noise=random.Random(seed))
    assert arrow_rows(page_of(log, units)) == expected_rows(records)


def test_chunks_split_by_segment_and_span_give_the_same_rows() -> None:
    rng = random.Random(7)
    messages = [
        {
            "body": rng.randbytes(rng.randrange(200)),
            "tags": rng.choice([None, "A", "B"]),
            "keys": [f"k{i}", "x"][: rng.randrange(3)],
            "props": {"n": str(i)},
            "session": i % 2 == 0,
            "born": 1_700_000_000_000 + i,
        }
        for i in range(200)
    ]
    log, units, records = build_log(messages, noise=rng)
    whole = page_of(log, units)
    split = page_of(log, units, segment_bytes=4096, span=1500)
    assert len(whole.encode(lambda c: c.count)) == 1 and len(split.encode(lambda c: 1)) > 10
    assert arrow_rows(split) == arrow_rows(whole) == expected_rows(records)
    sparse_log, sparse_units, sparse_records = build_log(messages, others=3)
    assert arrow_rows(page_of(sparse_log, sparse_units)) == expected_rows(sparse_records)
    batches, body_bytes = encode_page(split, topic="orders", group=GROUP)
    assert body_bytes == sum(len(m["body"]) for m in messages)  # type: ignore[arg-type]
    assert sum(b.num_rows for b in batches) == 200


def test_keys_with_empty_pieces_and_no_properties() -> None:
    """KEYS "a  b" (two spaces) gives ["a", "b"], as RocketMQ's split does."""
    record = encode_message(
        topic="orders",
        body=b"",
        properties={PROP_KEYS: "a  b", PROP_BATCH_INDEX: "0"},
        born_timestamp=0,
    )
    bare = encode_message(topic="orders", body=b"v", born_timestamp=0)
    log = bytearray()
    units = []
    for rec in (record, bare):
        log += bytes(ENTRY_HEADER)
        set_physical_offset(rec, len(log))
        units.append(UNIT.pack(len(log), len(rec), 0))
        log += rec
    rows = arrow_rows(page_of(bytes(log), b"".join(units)))
    assert [(r["key"], r["keys"], r["properties"], r["tags"]) for r in rows] == [
        ("a", ["a", "b"], [], None),
        (None, [], [], None),
    ]
    assert [r["value"] for r in rows] == [b"", b"v"]


def records_log(*records: bytearray) -> tuple[bytes, bytes]:
    log, units = bytearray(), []
    for rec in records:
        log += bytes(ENTRY_HEADER)
        set_physical_offset(rec, len(log))
        units.append(UNIT.pack(len(log), len(rec), 0))
        log += rec
    return bytes(log), b"".join(units)


def test_property_blocks_not_in_the_writers_form_are_read_as_the_json_pull_reads_them() -> None:
    """A block whose last pair lacks its ``\\x02`` (RocketMQ allows it) is not for the
    numpy scan; Arrow's kernels read it, as ``decode_properties`` does."""
    odd = encode_message(
        topic="orders", body=b"x", properties=b"TAGS\x01T\x02u\x01v", born_timestamp=5
    )
    plain = encode_message(topic="orders", body=b"y", properties={"a": "b"}, born_timestamp=6)
    log, units = records_log(odd, plain)
    rows = arrow_rows(page_of(log, units))
    assert [(r["tags"], r["properties"]) for r in rows] == [
        ("T", [("u", "v")]),
        (None, [("a", "b")]),
    ]
    for bad in (b"\x01v\x02", b"a\x01b\x01c\x02", b"a\x02"):
        log, units = records_log(
            encode_message(topic="orders", body=b"x", properties=bad, born_timestamp=5)
        )
        with pytest.raises(PageFormatError, match="PROPERTIES"):
            encode_page(page_of(log, units), topic="orders", group=GROUP)


def test_an_empty_page_is_a_stream_with_the_schema_alone() -> None:
    batches, body_bytes = encode_page(RawPage(b""), topic="orders", group=GROUP)
    assert (batches, body_bytes) == ([], 0)
    table = pa.ipc.open_stream(ipc_stream(batches)).read_all()
    assert table.num_rows == 0 and table.schema.equals(SCHEMA)


@pytest.mark.parametrize(
    ("what", "at", "value"),
    [
        ("TOTALSIZE", 0, struct.pack(">i", 10_000)),
        ("MAGICCODE", 4, struct.pack(">i", 7)),
        ("PHYSICALOFFSET", 28, struct.pack(">q", 3)),
        ("BODY", 84, struct.pack(">i", 2**30)),
    ],
)
def test_a_record_that_disagrees_with_its_unit_is_refused(what: str, at: int, value: bytes) -> None:
    log, units, _ = build_log(
        [{"body": b"abc", "tags": None, "keys": [], "props": {}, "session": False, "born": 1}]
    )
    start = UNIT.unpack_from(units)[0]
    bad = bytearray(log)
    bad[start + at : start + at + len(value)] = value
    with pytest.raises(PageFormatError, match=what):
        encode_page(page_of(bytes(bad), units), topic="orders", group=GROUP)


def test_the_messages_of_a_batch_record_are_found_by_their_units_queue_offsets() -> None:
    """broker.batch: five messages in one record, five units naming it; a page starting
    inside the record, and one skipping messages (a tag filter), read the right ones."""
    bodies = [b"m%d" % i for i in range(5)]
    inner = [encode_properties(inner_properties({"i": str(i)}, tags="AB"[i % 2], keys=[f"k{i}"]))
             for i in range(5)]  # fmt: skip
    messages = list(zip(bodies, inner, strict=True))
    host = ("127.0.0.1", 1)
    record = encode_batch_record("orders", messages, session=None, timestamp=9, store_host=host)
    set_queue_id_and_offset(record, 5, 100)
    log = bytearray(ENTRY_HEADER) + record
    set_physical_offset(log, ENTRY_HEADER, ENTRY_HEADER)
    unit = UNIT.pack(ENTRY_HEADER, len(record), 0)
    for offsets in ([100, 101, 102, 103, 104], [102, 103, 104], [101, 103]):
        page = replace(page_of(bytes(log), unit * len(offsets)), queue_offsets=offsets)
        rows = arrow_rows(page)
        assert [r["value"] for r in rows] == [bodies[o - 100] for o in offsets]
        assert [r["queue_offset"] for r in rows] == offsets
        assert [r["msg_id"] for r in rows] == [make_msg_id(GROUP, 48 + o - 100) for o in offsets]
        assert [(r["tags"], r["keys"], r["properties"]) for r in rows] == [
            ("AB"[o % 2], [f"k{o - 100}"], [("i", str(o - 100))]) for o in offsets
        ]
    with pytest.raises(PageFormatError, match="queue offsets"):
        arrow_rows(page_of(bytes(log), unit))  # a page without them cannot tell
    with pytest.raises(PageFormatError, match="not in its record"):
        arrow_rows(replace(page_of(bytes(log), unit), queue_offsets=[105]))


def _respliced_topic(topic: bytes) -> bytearray:
    """A record of topic "orders" whose TOPIC field is ``topic`` (any length, any bytes),
    TOTALSIZE set to match: what ``encode_message`` would refuse to write."""
    raw = encode_message(topic="orders", body=b"x", properties={"a": "b"}, born_timestamp=1)
    at = BODY_POS + 1  # the TOPIC length byte, after the 1-byte body
    out = raw[:at] + bytes([len(topic) & 0xFF]) + topic + raw[at + 1 + len("orders") :]
    struct.pack_into(">i", out, TOTAL_SIZE_POS, len(out))
    return out


def _ipv6_flagged() -> bytearray:
    raw = encode_message(topic="orders", body=b"x", born_timestamp=1)
    struct.pack_into(">i", raw, SYS_FLAG_POS, 0x20)  # STOREHOSTADDRESS_V6_FLAG
    return raw


@pytest.mark.parametrize(
    ("what", "record"),
    [
        ("SYSFLAG", _ipv6_flagged()),
        ("TOPIC", _respliced_topic(b"")),
        ("TOPIC", _respliced_topic(b"t" * 128)),
        ("TOPIC", _respliced_topic(b"\xffrders")),
        *[
            ("PROPERTIES", encode_message(topic="orders", body=b"", properties=p, born_timestamp=1))
            for p in (b"a\x01b\x02\x02", b"TAGS\x01a\x02TAGS\x01b\x02")
        ],
    ],
)
def test_a_record_the_json_pull_refuses_the_arrow_pull_refuses(
    what: str, record: bytearray
) -> None:
    """The two pulls read a record by the same rules: what the JSON pull's decoder
    (``decode_message`` without its body CRC: the entry CRC covers the record) refuses,
    the Arrow encoder refuses too, never a row the JSON pull would not answer."""
    with pytest.raises(MessageFormatError, match=what):
        decode_message(record, verify_crc=False)
    log, units = records_log(record)
    with pytest.raises(PageFormatError, match=what):
        encode_page(page_of(log, units), topic="orders", group=GROUP)


def test_a_record_of_another_topic_is_refused() -> None:
    """A page's rows show its topic: a unit naming another topic's record (a damaged
    consume queue) is refused, not shown under the wrong topic."""
    for other in ("orderz", "o", "orders2"):
        log, units = records_log(encode_message(topic=other, body=b"x", born_timestamp=1))
        with pytest.raises(PageFormatError, match="TOPIC"):
            encode_page(page_of(log, units), topic="orders", group=GROUP)
