"""The CommitLog message codec (docs/formats.md; topic names: docs/http.md)."""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from typing import Any

import crcmod.predefined
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import (
    BODY_CRC_POS,
    BODY_LENGTH_POS,
    BODY_POS,
    BORN_HOST_POS,
    BORN_TIMESTAMP_POS,
    FLAG_POS,
    MAGIC_CODE,
    MAGIC_CODE_POS,
    MAX_PROPERTIES_SIZE,
    MIN_MESSAGE_SIZE,
    PHYSICAL_OFFSET_POS,
    PREPARED_TX_OFFSET_POS,
    PROP_BATCH_INDEX,
    PROP_KEYS,
    PROP_PRODUCER_ID,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    RECONSUME_TIMES_POS,
    STORE_HOST_POS,
    STORE_TIMESTAMP_POS,
    SYS_FLAG_POS,
    SYSTEM_PROPERTIES,
    TOTAL_SIZE_POS,
    MessageFormatError,
    RecordHead,
    StoredMessage,
    body_crc,
    bytes_to_host,
    check_ipv4,
    decode_head,
    decode_message,
    decode_properties,
    encode_message,
    encode_properties,
    host_to_bytes,
    message_size,
    set_physical_offset,
    set_queue_offset,
    set_store_host,
    set_store_timestamp,
    tags_and_keys,
)

FAST = settings(max_examples=200)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TOPICS = st.from_regex(r"[A-Za-z0-9_%|-]{1,127}", fullmatch=True)  # docs/http.md topic names
PROP_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", codec="utf-8"), max_size=20)
PROPS = st.dictionaries(PROP_TEXT.filter(bool), PROP_TEXT, max_size=6)
IPV4 = st.ip_addresses(v=4).map(str)
HOSTS = st.tuples(IPV4, st.integers(0, 65535))


def _sample(**over: Any) -> bytearray:
    fields: dict[str, Any] = {
        "topic": "TopicTest",
        "body": b"hello",
        "properties": {PROP_TAGS: "TagA", PROP_KEYS: "k1 k2", PROP_UNIQ_KEY: "U1", "a": "b"},
        "queue_id": 3,
        "queue_offset": 11,
        "physical_offset": 4096 + 48,
        "flag": 7,
        "sys_flag": 0,
        "born_timestamp": 1_700_000_000_000,
        "born_host": ("10.0.0.1", 5555),
        "store_timestamp": 1_700_000_000_123,
        "store_host": ("10.0.0.2", 10911),
        "reconsume_times": 2,
        "prepared_tx_offset": 99,
    }
    fields.update(over)
    return encode_message(**fields)


# --- Layout --------------------------------------------------------------------------------


def test_golden_bytes_spell_out_the_rocketmq_v1_layout() -> None:
    # Built independently of the codec: every field at its documented offset.
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02a\x01b\x02"
    expected = (
        struct.pack(">i", 88 + 5 + 1 + 9 + 2 + len(props))
        + bytes.fromhex("DAA320A7")
        + struct.pack(">I", zlib.crc32(b"hello") & 0x7FFFFFFF)
        + struct.pack(">iiqqiq", 3, 7, 11, 4096 + 48, 0, 1_700_000_000_000)
        + bytes([10, 0, 0, 1])
        + struct.pack(">iq", 5555, 1_700_000_000_123)
        + bytes([10, 0, 0, 2])
        + struct.pack(">iiqi", 10911, 2, 99, 5)
        + b"hello"
        + b"\x09TopicTest"
        + struct.pack(">H", len(props))
        + props
    )
    assert bytes(_sample()) == expected
    assert struct.unpack(">i", bytes.fromhex("DAA320A7"))[0] == MAGIC_CODE == -626843481


def test_offset_constants_match_the_layout() -> None:
    assert (
        TOTAL_SIZE_POS,
        MAGIC_CODE_POS,
        BODY_CRC_POS,
        QUEUE_ID_POS,
        FLAG_POS,
        QUEUE_OFFSET_POS,
        PHYSICAL_OFFSET_POS,
        SYS_FLAG_POS,
        BORN_TIMESTAMP_POS,
        BORN_HOST_POS,
        STORE_TIMESTAMP_POS,
        STORE_HOST_POS,
        RECONSUME_TIMES_POS,
        PREPARED_TX_OFFSET_POS,
        BODY_LENGTH_POS,
        BODY_POS,
    ) == (0, 4, 8, 12, 16, 20, 28, 36, 40, 48, 56, 64, 72, 76, 84, 88)
    raw = _sample()
    assert struct.unpack_from(">i", raw, TOTAL_SIZE_POS)[0] == len(raw)
    assert struct.unpack_from(">i", raw, MAGIC_CODE_POS)[0] == MAGIC_CODE
    assert struct.unpack_from(">I", raw, BODY_CRC_POS)[0] == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert struct.unpack_from(">i", raw, QUEUE_ID_POS)[0] == 3
    assert struct.unpack_from(">i", raw, FLAG_POS)[0] == 7
    assert struct.unpack_from(">i", raw, SYS_FLAG_POS)[0] == 0
    assert struct.unpack_from(">q", raw, BORN_TIMESTAMP_POS)[0] == 1_700_000_000_000
    assert bytes_to_host(raw, BORN_HOST_POS) == ("10.0.0.1", 5555)
    assert struct.unpack_from(">i", raw, RECONSUME_TIMES_POS)[0] == 2
    assert struct.unpack_from(">q", raw, PREPARED_TX_OFFSET_POS)[0] == 99
    assert struct.unpack_from(">i", raw, BODY_LENGTH_POS)[0] == 5
    assert raw[BODY_POS : BODY_POS + 5] == b"hello"
    assert message_size(5, 9, len(raw) - 88 - 5 - 1 - 9 - 2) == len(raw)


def test_body_crc_agrees_with_crcmod_crc32() -> None:
    body = os.urandom(1024)
    (stored,) = struct.unpack_from(">I", _sample(body=body), BODY_CRC_POS)
    assert (
        stored
        == crcmod.predefined.mkCrcFun("crc-32")(body) & 0x7FFFFFFF
        == decode_message(_sample(body=body)).body_crc
    )


def _body_with_crc_top_bit_set() -> bytes:
    return next(b for i in range(100) if zlib.crc32(b := b"body %d" % i) & 0x80000000)


def test_body_crc_is_rocketmqs_masked_crc32() -> None:
    # RocketMQ's UtilAll.crc32 clears the top bit, and its decoder's CRC check compares
    # with that: a body whose CRC-32 has the top bit set shows the difference.
    body = _body_with_crc_top_bit_set()
    full = zlib.crc32(body)
    raw = _sample(body=body)
    (stored,) = struct.unpack_from(">I", raw, BODY_CRC_POS)
    assert stored == full & 0x7FFFFFFF == body_crc(body) != full
    assert struct.unpack_from(">i", raw, BODY_CRC_POS)[0] == stored  # the same read signed
    assert decode_message(raw).body_crc == stored
    struct.pack_into(">I", raw, BODY_CRC_POS, full)  # what this codec wrote before
    with pytest.raises(MessageFormatError, match="BODYCRC"):
        decode_message(raw)


# --- Round trips ---------------------------------------------------------------------------


@FAST
@given(
    topic=TOPICS,
    body=st.binary(max_size=300),
    props=PROPS,
    queue_id=I32,
    queue_offset=I64,
    physical_offset=I64,
    flag=I32,
    sys_flag=I32.map(lambda f: f & ~0x30),
    born_timestamp=I64,
    born_host=HOSTS,
    store_timestamp=I64,
    store_host=HOSTS,
    reconsume_times=I32,
    prepared_tx_offset=I64,
    pre_encoded=st.booleans(),
)
def test_encode_decode_round_trip(
    topic: str,
    body: bytes,
    props: dict[str, str],
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    flag: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_timestamp: int,
    store_host: tuple[str, int],
    reconsume_times: int,
    prepared_tx_offset: int,
    pre_encoded: bool,
) -> None:
    raw = encode_message(
        topic=topic,
        body=body,
        properties=encode_properties(props) if pre_encoded else props,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx_offset,
    )
    assert decode_message(raw) == StoredMessage(
        size=len(raw),
        body_crc=zlib.crc32(body) & 0x7FFFFFFF,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx_offset,
        body=body,
        topic=topic,
        properties=props,
    )
    # Inside a larger buffer (a DLedger entry), as a memoryview, at an offset.
    big = bytes(48) + bytes(raw) + b"trailing"
    assert decode_message(memoryview(big), 48) == decode_message(raw)
    head = decode_head(big, 48)
    props_raw = encode_properties(props)
    assert head == RecordHead(
        len(raw),
        queue_id,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
        store_timestamp,
        topic,
        48 + 88,
        len(body),
        48 + len(raw) - len(props_raw),
        len(props_raw),
    )
    assert big[head.props_at : head.props_at + head.props_len] == props_raw
    assert _pull_view(memoryview(raw)) == (
        len(raw),
        queue_id,
        queue_offset,
        physical_offset,
        born_timestamp,
        store_timestamp,
        topic,
        sys_flag,
        body,
        props,
    )


@FAST
@given(props=PROPS)
def test_properties_round_trip(props: dict[str, str]) -> None:
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(raw)) == props
    if raw:  # RocketMQ tolerates a missing final separator
        assert decode_properties(raw[:-1]) == props


def test_unicode_topic_and_empty_everything() -> None:
    m = decode_message(_sample(topic="主题", body=b"", properties={}))
    assert (m.topic, m.body, m.properties, m.size) == ("主题", b"", {}, MIN_MESSAGE_SIZE + 5)
    assert len(_sample(topic="t", body=b"", properties={})) == MIN_MESSAGE_SIZE


def test_derived_accessors() -> None:
    m = decode_message(
        _sample(
            properties={
                PROP_TAGS: "TagA",
                PROP_KEYS: " k1  k2 ",
                PROP_UNIQ_KEY: "U1",
                PROP_PRODUCER_ID: "p",
                PROP_BATCH_INDEX: "0",
                "user": "x",
            }
        )
    )
    assert m.commitlog_offset == m.physical_offset == 4096 + 48
    assert (m.tags, m.keys, m.uniq_key) == ("TagA", ["k1", "k2"], "U1")
    assert m.user_properties == {"user": "x"}
    bare = decode_message(_sample(properties={"user": "x"}))
    assert (bare.tags, bare.keys, bare.uniq_key) == (None, [], None)
    assert {PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY, PROP_PRODUCER_ID} <= SYSTEM_PROPERTIES


def test_tags_and_keys() -> None:
    raw = encode_properties({PROP_TAGS: "T", PROP_KEYS: "a b  c", PROP_UNIQ_KEY: "U"})
    assert tags_and_keys(raw) == ("T", ["a", "b", "c", "U"])
    assert tags_and_keys(encode_properties({PROP_KEYS: "U", PROP_UNIQ_KEY: "U"})) == (None, ["U"])
    assert tags_and_keys(b"") == (None, [])
    assert tags_and_keys(memoryview(encode_properties({PROP_TAGS: "T"}))) == ("T", [])


# --- In-place rewrites ---------------------------------------------------------------------


@FAST
@given(qoff=I64, phys=I64, ts=I64, host=HOSTS)
def test_set_helpers_rewrite_inside_an_entry(
    qoff: int, phys: int, ts: int, host: tuple[str, int]
) -> None:
    raw = _sample(body=b"x" * 33)
    entry = bytearray(b"\xee" * 48) + raw + bytearray(b"\xee" * 16)
    view = memoryview(entry)
    set_queue_offset(view, qoff, base=48)
    set_physical_offset(view, phys, base=48)
    set_store_timestamp(view, ts, base=48)
    set_store_host(view, host, base=48)
    assert entry[:48] == b"\xee" * 48 and entry[-16:] == b"\xee" * 16
    m = decode_message(entry, 48)  # body CRC still valid: it covers the body only
    assert (m.queue_offset, m.physical_offset, m.store_timestamp, m.store_host) == (
        qoff,
        phys,
        ts,
        host,
    )
    before = decode_message(raw)
    assert (m.queue_id, m.born_host, m.body, m.properties) == (
        before.queue_id,
        before.born_host,
        before.body,
        before.properties,
    )


def test_set_helpers_refuse_out_of_range_and_out_of_bounds() -> None:
    raw = _sample()
    with pytest.raises(MessageFormatError, match="QUEUEOFFSET"):
        set_queue_offset(raw, 2**63)
    with pytest.raises(MessageFormatError, match="PHYSICALOFFSET"):
        set_physical_offset(memoryview(raw)[:30], 1)
    with pytest.raises(MessageFormatError, match="port"):
        set_store_host(raw, ("1.2.3.4", 70000))


# --- Refusals ------------------------------------------------------------------------------


def test_body_crc_is_verified() -> None:
    raw = _sample(body=b"payload")
    raw[BODY_POS + 3] ^= 0x01
    with pytest.raises(MessageFormatError, match="BODYCRC"):
        decode_message(raw)
    assert decode_message(raw, verify_crc=False).body == b"paymoad"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"topic": ""}, "TOPIC"),
        ({"topic": "t" * 128}, "TOPIC"),
        ({"topic": "é" * 64}, "TOPIC"),  # 128 UTF-8 bytes
        ({"topic": "\ud800"}, "TOPIC"),
        ({"properties": {"k": "v" * MAX_PROPERTIES_SIZE}}, "PROPERTIES"),
        ({"properties": b"k\x01" + b"v" * (32_768 - 3) + b"\x02"}, "at most 32767"),
        ({"properties": {"bad\x01name": "v"}}, "separator"),
        ({"properties": {"name": "bad\x02value"}}, "separator"),
        ({"properties": {"": "v"}}, "empty"),
        ({"queue_id": 2**31}, "QUEUEID"),
        ({"queue_offset": -(2**63) - 1}, "QUEUEOFFSET"),
        ({"prepared_tx_offset": 2**64}, "PREPAREDTXOFFSET"),
        ({"reconsume_times": -(2**31) - 1}, "RECONSUMETIMES"),
        ({"sys_flag": 0x10}, "SYSFLAG"),
        ({"born_host": ("1.2.3.4", -1)}, "port"),
        ({"store_host": ("1.2.3.4", 65536)}, "port"),
    ],
)
def test_encode_refuses(over: dict[str, Any], field: str) -> None:
    with pytest.raises(MessageFormatError, match=field):
        _sample(**over)


def test_properties_hold_at_most_32767_bytes_as_rocketmq_reads_a_signed_short() -> None:
    most = b"k\x01" + b"v" * (32_767 - 3) + b"\x02"
    raw = _sample(properties=most)
    assert MAX_PROPERTIES_SIZE == 32_767 and decode_message(raw).properties == {"k": "v" * 32_764}
    # A stored length past it (written before this limit) is refused on read as well.
    props_len_at = len(raw) - len(most) - 2
    longer = raw[:-1] + b"v\x02"
    struct.pack_into(">i", longer, TOTAL_SIZE_POS, len(longer))
    struct.pack_into(">H", longer, props_len_at, 32_768)
    with pytest.raises(MessageFormatError, match="at most 32767"):
        decode_head(longer)


@pytest.mark.parametrize(
    "props",
    [{"a\x01": "v"}, {"a": "\x01"}, {"a\x02": "v"}, {"a": "v\x02"}, {"a": "v", "b": "x\x01y"}],
)
def test_property_separators_are_refused(props: dict[str, str]) -> None:
    with pytest.raises(MessageFormatError, match="separator"):
        encode_properties(props)


@pytest.mark.parametrize(
    "raw",
    [b"noseparator", b"a\x01b\x01c\x02", b"\x01v\x02", b"a\x01b\x02a\x01c\x02", b"\xff\x01v"],
)
def test_malformed_properties_are_refused(raw: bytes) -> None:
    with pytest.raises(MessageFormatError, match="PROPERTIES"):
        decode_properties(raw)


def _put(raw: bytearray, fmt: str, pos: int, value: int) -> bytearray:
    out = bytearray(raw)
    struct.pack_into(fmt, out, pos, value)
    return out


def test_decode_names_the_inconsistent_field() -> None:
    raw = _sample(body=b"body", topic="T")
    props_len_at = BODY_POS + 4 + 1 + 1
    cases = [
        (_put(raw, ">i", MAGIC_CODE_POS, -626843477), "MAGICCODE"),  # RocketMQ V2
        (_put(raw, ">i", TOTAL_SIZE_POS, len(raw) + 1), "TOTALSIZE"),
        (_put(raw, ">i", TOTAL_SIZE_POS, len(raw) - 1), "PROPERTIES"),
        (_put(raw, ">i", TOTAL_SIZE_POS, 0), "TOTALSIZE"),
        (_put(raw, ">i", BODY_LENGTH_POS, -1), "BODY"),
        (_put(raw, ">i", BODY_LENGTH_POS, 2**31 - 1), "BODY"),
        (_put(raw, ">i", BODY_LENGTH_POS, 5), "TOPIC"),  # reads a body byte as the length
        (_put(raw, ">B", BODY_POS + 4, 0), "TOPIC"),
        (_put(raw, ">B", BODY_POS + 4, 200), "TOPIC"),
        (_put(raw, ">B", BODY_POS + 4, 100), "TOPIC"),
        (_put(raw, ">B", BODY_POS + 5, 0xFF), "TOPIC"),  # not UTF-8
        (_put(raw, ">H", props_len_at, 0), "PROPERTIES"),
        (_put(raw, ">i", SYS_FLAG_POS, 0x20), "SYSFLAG"),
        (raw[:87], "TOTALSIZE"),
        (raw[:-1], "TOTALSIZE"),
    ]
    for bad, field in cases:
        with pytest.raises(MessageFormatError, match=field):
            decode_message(bad)
        if field not in {"SYSFLAG"}:  # the head leaves the hosts to its readers
            with pytest.raises(MessageFormatError, match=field):
                decode_head(bad)
    for offset in (-1, len(raw), len(raw) + 5):
        with pytest.raises(MessageFormatError):
            decode_message(raw, offset)


@settings(max_examples=200)
@given(data=st.binary(max_size=200), offset=st.integers(-4, 210))
def test_garbage_only_ever_raises_message_format_error(data: bytes, offset: int) -> None:
    for buf in (data, memoryview(data)):
        for parse in (decode_message, decode_head):
            with contextlib.suppress(MessageFormatError):
                parse(buf, offset)


@settings(max_examples=200)
@given(cut=st.integers(0, 200), flips=st.lists(st.integers(0, 199), max_size=4))
def test_truncated_or_damaged_records_only_ever_raise_message_format_error(
    cut: int, flips: list[int]
) -> None:
    raw = _sample(body=b"b" * 40)
    for i in flips:
        if i < len(raw):
            raw[i] ^= 0xA5
    for buf in (bytes(raw[:cut]), memoryview(raw)[:cut]):
        for parse in (decode_message, decode_head):
            with contextlib.suppress(MessageFormatError):
                parse(buf)


@settings(max_examples=300)
@given(cut=st.integers(0, 200), flips=st.lists(st.integers(0, 199), max_size=4))
def test_the_pull_decoder_refuses_what_decode_message_refuses(cut: int, flips: list[int]) -> None:
    """``decode_head`` and ``check_ipv4`` (what a pull checks), with the PROPERTIES it
    points at decoded, take exactly the records that ``decode_message`` without its body CRC
    takes, and reads the same fields of them."""
    raw = _sample(body=b"b" * 40, properties={"TAGS": "t", "KEYS": "a b", "x": "y"})
    for i in flips:
        if i < len(raw):
            raw[i] ^= 0xA5
    buf = memoryview(raw)[:cut]
    try:
        full = decode_message(buf, verify_crc=False)
    except MessageFormatError:
        with pytest.raises(MessageFormatError):
            _pull_view(buf)
        return
    assert _pull_view(buf) == (
        full.size,
        full.queue_id,
        full.queue_offset,
        full.physical_offset,
        full.born_timestamp,
        full.store_timestamp,
        full.topic,
        full.sys_flag,
        full.body,
        full.properties,
    )


def _pull_view(buf: memoryview) -> tuple[object, ...]:
    """What a pull reads of a record: ``decode_head``'s fields, then the BODY and
    the decoded PROPERTIES it points at."""
    h: RecordHead = decode_head(buf)
    check_ipv4(h.sys_flag)
    body = bytes(buf[h.body_at : h.body_at + h.body_len])
    props = decode_properties(buf[h.props_at : h.props_at + h.props_len])
    return (
        h.size,
        h.queue_id,
        h.queue_offset,
        h.physical_offset,
        h.born_timestamp,
        h.store_timestamp,
        h.topic,
        h.sys_flag,
        body,
        props,
    )


@settings(max_examples=200)
@given(raw=st.binary(max_size=60))
def test_garbage_properties_only_ever_raise_message_format_error(raw: bytes) -> None:
    try:
        decode_properties(raw)
        tags_and_keys(raw)
    except MessageFormatError:
        pass


# --- Hosts, ids, uniq keys -----------------------------------------------------------------


def test_hosts() -> None:
    assert host_to_bytes(("192.168.1.2", 10911)) == bytes([192, 168, 1, 2]) + struct.pack(
        ">i", 10911
    )
    assert bytes_to_host(host_to_bytes(("192.168.1.2", 10911))) == ("192.168.1.2", 10911)
    # Not IPv4 (IPv6, names, inet_aton's short forms) is stored as 0.0.0.0.
    for odd in ("::1", "localhost", "1.2", ""):
        assert bytes_to_host(host_to_bytes((odd, 1))) == ("0.0.0.0", 1)
    with pytest.raises(MessageFormatError, match="8 bytes"):
        bytes_to_host(b"\x01\x02")
