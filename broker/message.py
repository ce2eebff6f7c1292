"""The RocketMQ CommitLog message record codec (docs/formats.md "Message" and "The append hook").

A message is the body of one DLedger entry (it starts at entry byte 48). Big-endian::

    @0  TOTALSIZE i32          @40 BORNTIMESTAMP i64      @76 PREPAREDTXOFFSET i64
    @4  MAGICCODE i32          @48 BORNHOST 4+4           @84 BODY len i32, bytes
    @8  BODYCRC u32            @56 STORETIMESTAMP i64         TOPIC len u8, utf-8
    @12 QUEUEID i32            @64 STOREHOST 4+4              PROPERTIES len i16, bytes
    @16 FLAG i32               @72 RECONSUMETIMES i32
    @20 QUEUEOFFSET i64
    @28 PHYSICALOFFSET i64
    @36 SYSFLAG i32

Invariants:
- ``TOTALSIZE == 88 + len(body) + 1 + len(topic) + 2 + len(properties)`` exactly; a record
  never carries slack, so the entry body size and TOTALSIZE agree;
- MAGICCODE is RocketMQ's ``MESSAGE_MAGIC_CODE`` V1 (-626843481), whose one-byte topic
  length Java reads as a signed ``byte``: topics are 1..127 UTF-8 bytes;
- BODYCRC is RocketMQ's ``UtilAll.crc32``: CRC-32 (Java ``CRC32`` = ``zlib.crc32``) of
  the body only, top bit cleared (``& 0x7FFFFFFF``, ``body_crc``), so it is the same
  number read signed or unsigned; RocketMQ's decoder, with its CRC check, refuses any
  other value. It does not cover the header, so the in-place rewrites below (queue
  offset, physical offset, store timestamp/host) never invalidate it; the DLedger
  entry's body CRC covers those;
- the PROPERTIES length is read by RocketMQ as a signed ``short``: a block holds at most
  ``MAX_PROPERTIES_SIZE`` = 32,767 bytes, on write and on read;
- hosts are IPv4 (4 address bytes + i32 port). SYSFLAG's IPv6 bits (``BORNHOST_V6_FLAG``,
  ``STOREHOSTADDRESS_V6_FLAG``) would make the host fields 20 bytes, so they are refused;
  a host string that is not a dotted-quad IPv4 address is stored as 0.0.0.0 (no DNS on
  the produce path);
- PROPERTIES are ``name\\x01value\\x02`` pairs (``broker.properties``: their codec and
  the system properties, re-exported here with ``MessageFormatError``).

The fixed header is declared once (``_LAYOUT``: each field's position and struct code);
the structs that read or write it are made from that declaration. Its readers share one
view of a stored record, ``RecordHead`` (``decode_head``: dispatch, recovery, the pulls
and the lookups); ``decode_message`` reads every field; ``broker.columns`` reads a page
of records at once, by the same rules.

Every malformed input raises ``MessageFormatError`` (a ``ValueError``) naming the field;
``IndexError``/``struct.error``/``UnicodeError`` never leak out of this module.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, NamedTuple, TypeAlias

from .properties import (
    NAME_VALUE_SEPARATOR,
    PROP_BATCH_INDEX,
    PROP_BATCH_SIZE,
    PROP_KEYS,
    PROP_PRODUCER_ID,
    PROP_PRODUCER_SEQ,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROPERTY_SEPARATOR,
    SYSTEM_PROPERTIES,
    Buffer,
    MessageFormatError,
    decode_properties,
    encode_properties,
    message_properties,
    split_keys,
    tags_and_keys,
)

__all__ = [
    "BODY_CRC_POS",
    "BODY_LENGTH_POS",
    "BODY_POS",
    "BORN_HOST_POS",
    "BORN_TIMESTAMP_POS",
    "FIXED_HEADER_SIZE",
    "FLAG_POS",
    "INNER_BATCH_FLAG",
    "MAGIC_CODE",
    "MAGIC_CODE_POS",
    "MAX_BODY_SIZE",
    "MAX_PROPERTIES_SIZE",
    "MAX_TOPIC_SIZE",
    "MIN_MESSAGE_SIZE",
    "NAME_VALUE_SEPARATOR",
    "NEED_UNWRAP_FLAG",
    "PHYSICAL_OFFSET_POS",
    "PREPARED_TX_OFFSET_POS",
    "PROPERTY_SEPARATOR",
    "PROP_BATCH_INDEX",
    "PROP_BATCH_SIZE",
    "PROP_KEYS",
    "PROP_PRODUCER_ID",
    "PROP_PRODUCER_SEQ",
    "PROP_TAGS",
    "PROP_UNIQ_KEY",
    "QUEUE_ID_POS",
    "QUEUE_OFFSET_POS",
    "RECONSUME_TIMES_POS",
    "STORE_HOST_POS",
    "STORE_TIMESTAMP_POS",
    "SYSTEM_PROPERTIES",
    "SYS_FLAG_POS",
    "SYS_FLAG_V6_MASK",
    "TOTAL_SIZE_POS",
    "Buffer",
    "Host",
    "MessageFormatError",
    "RecordHead",
    "StoredMessage",
    "body_crc",
    "bytes_to_host",
    "check_ipv4",
    "decode_head",
    "decode_message",
    "decode_properties",
    "encode_message",
    "encode_properties",
    "host_to_bytes",
    "message_properties",
    "message_size",
    "set_physical_offset",
    "set_queue_id_and_offset",
    "set_queue_offset",
    "set_store_host",
    "set_store_timestamp",
    "tags_and_keys",
]

Host: TypeAlias = tuple[str, int]


# --- Layout -------------------------------------------------------------------------------

MAGIC_CODE: Final = -626843481  # RocketMQ MessageDecoder.MESSAGE_MAGIC_CODE (V1), 0xDAA320A7

TOTAL_SIZE_POS: Final = 0
MAGIC_CODE_POS: Final = 4
BODY_CRC_POS: Final = 8
QUEUE_ID_POS: Final = 12
FLAG_POS: Final = 16
QUEUE_OFFSET_POS: Final = 20
PHYSICAL_OFFSET_POS: Final = 28
SYS_FLAG_POS: Final = 36
BORN_TIMESTAMP_POS: Final = 40
BORN_HOST_POS: Final = 48
STORE_TIMESTAMP_POS: Final = 56
STORE_HOST_POS: Final = 64
RECONSUME_TIMES_POS: Final = 72
PREPARED_TX_OFFSET_POS: Final = 76
BODY_LENGTH_POS: Final = 84
BODY_POS: Final = 88
FIXED_HEADER_SIZE: Final = BODY_POS
"""Bytes before the body, the body length included."""

# Topic length byte + topic length >= 1 + properties length (2 bytes).
MIN_MESSAGE_SIZE: Final = FIXED_HEADER_SIZE + 1 + 1 + 2
MAX_TOPIC_SIZE: Final = 127  # Java reads the V1 topic length as a signed byte
MAX_PROPERTIES_SIZE: Final = 0x7FFF
"""RocketMQ reads the PROPERTIES length as a signed ``short``: 32,767 bytes at most."""
_MAX_TOTAL_SIZE: Final = 0x7FFF_FFFF
MAX_BODY_SIZE: Final = _MAX_TOTAL_SIZE - MIN_MESSAGE_SIZE + 1
"""The largest body that still lets TOTALSIZE fit an i32 (topic and properties shrink it)."""

SYS_FLAG_V6_MASK: Final = 0x10 | 0x20  # BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
NEED_UNWRAP_FLAG: Final = 0x1 << 6  # RocketMQ's: its client unwraps the inner records
INNER_BATCH_FLAG: Final = 0x1 << 7  # RocketMQ's: a batch record (``broker.batch``)

# The fixed header, declared once: each field's position and struct code, in order (a
# host is its 4 address bytes and its i32 port, so that encoding needs no per-call
# concatenation of the 8-byte host fields). ``_header`` makes a struct of any of its
# fields, the others skipped as padding, and checks the positions against the codes.
_LAYOUT: Final = (
    (TOTAL_SIZE_POS, "i"),
    (MAGIC_CODE_POS, "i"),
    (BODY_CRC_POS, "I"),
    (QUEUE_ID_POS, "i"),
    (FLAG_POS, "i"),
    (QUEUE_OFFSET_POS, "q"),
    (PHYSICAL_OFFSET_POS, "q"),
    (SYS_FLAG_POS, "i"),
    (BORN_TIMESTAMP_POS, "q"),
    (BORN_HOST_POS, "4si"),
    (STORE_TIMESTAMP_POS, "q"),
    (STORE_HOST_POS, "4si"),
    (RECONSUME_TIMES_POS, "i"),
    (PREPARED_TX_OFFSET_POS, "q"),
    (BODY_LENGTH_POS, "i"),
)


def _header(*fields: int) -> struct.Struct:
    """The fixed header as one struct of the fields at these positions (in layout
    order), every other field skipped as padding."""
    assert list(fields) == sorted(fields), "fields in layout order"
    fmt, at = ">", 0
    for pos, code in _LAYOUT:
        assert pos == at, f"the layout has a gap or an overlap at byte {pos}"
        size = struct.calcsize(">" + code)
        fmt += code if pos in fields else f"{size}x"
        at += size
    assert at == FIXED_HEADER_SIZE and set(fields) <= {pos for pos, _ in _LAYOUT}
    return struct.Struct(fmt)


_HEADER = _header(*(pos for pos, _ in _LAYOUT))  # every field: encode_message
# What a record's readers use (``decode_head``), and the rest (``decode_message``).
_HEAD = _header(
    TOTAL_SIZE_POS,
    MAGIC_CODE_POS,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    PHYSICAL_OFFSET_POS,
    SYS_FLAG_POS,
    BORN_TIMESTAMP_POS,
    STORE_TIMESTAMP_POS,
    BODY_LENGTH_POS,
)
_REST = _header(
    BODY_CRC_POS,
    FLAG_POS,
    BORN_HOST_POS,
    STORE_HOST_POS,
    RECONSUME_TIMES_POS,
    PREPARED_TX_OFFSET_POS,
)
_HOST = struct.Struct(">4si")
_QUEUE_ID = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")


def body_crc(body: Buffer) -> int:
    """BODYCRC of ``body``: RocketMQ's ``UtilAll.crc32``, CRC-32 with the top bit cleared."""
    return zlib.crc32(body) & 0x7FFF_FFFF


def message_size(body_len: int, topic_len: int, properties_len: int) -> int:
    """TOTALSIZE of a record with these field lengths (in bytes)."""
    return FIXED_HEADER_SIZE + body_len + 1 + topic_len + 2 + properties_len


# --- Hosts --------------------------------------------------------------------------------

_ANY_IP: Final = b"\x00\x00\x00\x00"


@lru_cache(maxsize=4096)
def _ip_bytes(ip: str) -> bytes:
    # Cached: a broker sees few distinct hosts, and inet_pton plus the error path is
    # several times dearer than the lookup. inet_pton (not inet_aton) refuses "1.2" forms.
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except (OSError, ValueError, TypeError):
        return _ANY_IP


def _check_port(port: int) -> None:
    if not 0 <= port <= 0xFFFF:
        raise MessageFormatError(f"HOST: port {port!r} is outside 0..65535")


def host_to_bytes(host: Host) -> bytes:
    """The 8-byte host field: IPv4 address, port i32. A non-IPv4 address becomes 0.0.0.0."""
    _check_port(host[1])
    return _HOST.pack(_ip_bytes(host[0]), host[1])


@lru_cache(maxsize=4096)
def _ip_str(raw: bytes) -> str:
    return socket.inet_ntoa(raw)


def bytes_to_host(raw: Buffer, offset: int = 0) -> Host:
    """The inverse of ``host_to_bytes`` for the 8 bytes at ``offset``."""
    try:
        ip, port = _HOST.unpack_from(raw, offset)
    except struct.error:
        raise MessageFormatError("HOST: fewer than 8 bytes") from None
    return _ip_str(ip), int(port)


# --- Encoding -----------------------------------------------------------------------------


_I32_RANGE = (-(2**31), 2**31 - 1)
_I64_RANGE = (-(2**63), 2**63 - 1)
# The header's integers that can fail to pack, in the order ``_header_error`` takes them.
_HEADER_INTS = (
    ("QUEUEID", _I32_RANGE),
    ("FLAG", _I32_RANGE),
    ("QUEUEOFFSET", _I64_RANGE),
    ("PHYSICALOFFSET", _I64_RANGE),
    ("SYSFLAG", _I32_RANGE),
    ("BORNTIMESTAMP", _I64_RANGE),
    ("STORETIMESTAMP", _I64_RANGE),
    ("RECONSUMETIMES", _I32_RANGE),
    ("PREPAREDTXOFFSET", _I64_RANGE),
)


def _header_error(*values: object) -> MessageFormatError:
    """Name the integer field that made ``_HEADER.pack_into`` fail (the slow path only:
    the fixed-width integers, ``_HEADER_INTS`` in order, are all that can fail there)."""
    for (name, (lo, hi)), value in zip(_HEADER_INTS, values, strict=True):
        if not isinstance(value, int) or not lo <= value <= hi:
            return MessageFormatError(f"{name}: {value!r} is outside {lo}..{hi}")
    return MessageFormatError("header: a field does not fit its type")


def _checked_parts(
    topic: str,
    properties: Mapping[str, str] | bytes,
    sys_flag: int,
    born_port: int,
    store_port: int,
) -> tuple[bytes, bytes | bytearray | memoryview]:
    """``encode_message``'s checks before the header: the topic and properties as stored
    (1..127 UTF-8 bytes; at most 32,767 bytes), IPv4 only, ports in 0..65535."""
    try:
        topic_b = topic.encode()
    except UnicodeEncodeError as e:
        raise MessageFormatError(f"TOPIC: {topic!r} is not encodable ({e.reason})") from None
    if not 0 < len(topic_b) <= MAX_TOPIC_SIZE:
        raise MessageFormatError(f"TOPIC: {len(topic_b)} UTF-8 bytes, must be 1..{MAX_TOPIC_SIZE}")
    props_b = (
        properties
        if isinstance(properties, bytes | bytearray | memoryview)
        else encode_properties(properties)
    )
    if len(props_b) > MAX_PROPERTIES_SIZE:
        raise MessageFormatError(
            f"PROPERTIES: {len(props_b)} bytes, at most {MAX_PROPERTIES_SIZE} (RocketMQ reads"
            " the length as a signed short)"
        )
    check_ipv4(sys_flag)
    if not (0 <= born_port <= 0xFFFF and 0 <= store_port <= 0xFFFF):
        _check_port(born_port)
        _check_port(store_port)
    return topic_b, props_b


def encode_message(
    *,
    topic: str,
    body: bytes | bytearray | memoryview,
    properties: Mapping[str, str] | bytes = b"",
    queue_id: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int,
    born_host: Host = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host: Host = ("127.0.0.1", 0),
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
) -> bytearray:
    """One record in one freshly allocated ``bytearray`` (the produce hot path).

    ``properties`` may be pre-encoded bytes (from ``encode_properties``); those are
    trusted apart from their length. Raises ``MessageFormatError`` for a topic outside
    1..127 UTF-8 bytes, properties over 32,767 bytes, a record over the i32 size, IPv6
    SYSFLAG bits, a port outside 0..65535 or an integer field that does not fit.
    """
    born_port, store_port = born_host[1], store_host[1]
    topic_b, props_b = _checked_parts(topic, properties, sys_flag, born_port, store_port)
    topic_len, props_len = len(topic_b), len(props_b)
    body_len = len(body)
    total = FIXED_HEADER_SIZE + body_len + 1 + topic_len + 2 + props_len
    if total > _MAX_TOTAL_SIZE:
        raise MessageFormatError(f"TOTALSIZE: {total} bytes does not fit an i32 (body too big)")

    buf = bytearray(total)
    try:
        _HEADER.pack_into(
            buf,
            0,
            total,
            MAGIC_CODE,
            body_crc(body),
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            _ip_bytes(born_host[0]),
            born_port,
            store_timestamp,
            _ip_bytes(store_host[0]),
            store_port,
            reconsume_times,
            prepared_tx_offset,
            body_len,
        )
    except struct.error:
        raise _header_error(
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            store_timestamp,
            reconsume_times,
            prepared_tx_offset,
        ) from None
    pos = BODY_POS + body_len
    buf[BODY_POS:pos] = body
    buf[pos] = topic_len
    pos += 1
    buf[pos : pos + topic_len] = topic_b
    pos += topic_len
    _U16.pack_into(buf, pos, props_len)
    buf[pos + 2 :] = props_b
    return buf


# --- In-place rewrites (the append hook) ----------------------------------------------------


def _set_i64(buf: bytearray | memoryview, pos: int, value: int, field: str) -> None:
    try:
        _I64.pack_into(buf, pos, value)
    except struct.error:
        raise MessageFormatError(
            f"{field}: cannot write {value!r} at byte {pos} of a {len(buf)}-byte buffer"
        ) from None


def set_queue_id_and_offset(
    buf: bytearray | memoryview, queue_id: int, queue_offset: int, base: int = 0
) -> None:
    """Rewrite QUEUEID and QUEUEOFFSET: the master picks both just before the append."""
    try:
        _QUEUE_ID.pack_into(buf, base + QUEUE_ID_POS, queue_id)
    except struct.error:
        raise MessageFormatError(f"QUEUEID {queue_id} does not fit an i32") from None
    _set_i64(buf, base + QUEUE_OFFSET_POS, queue_offset, "QUEUEOFFSET")


def set_queue_offset(buf: bytearray | memoryview, value: int, base: int = 0) -> None:
    """Rewrite QUEUEOFFSET of the record starting at ``buf[base]``."""
    _set_i64(buf, base + QUEUE_OFFSET_POS, value, "QUEUEOFFSET")


def set_physical_offset(buf: bytearray | memoryview, value: int, base: int = 0) -> None:
    """Rewrite PHYSICALOFFSET (the commitlog offset) of the record at ``buf[base]``."""
    _set_i64(buf, base + PHYSICAL_OFFSET_POS, value, "PHYSICALOFFSET")


def set_store_timestamp(buf: bytearray | memoryview, value: int, base: int = 0) -> None:
    """Rewrite STORETIMESTAMP of the record at ``buf[base]``."""
    _set_i64(buf, base + STORE_TIMESTAMP_POS, value, "STORETIMESTAMP")


def set_store_host(buf: bytearray | memoryview, host: Host, base: int = 0) -> None:
    """Rewrite STOREHOST of the record at ``buf[base]`` (IPv4; other hosts → 0.0.0.0)."""
    _check_port(host[1])
    try:
        _HOST.pack_into(buf, base + STORE_HOST_POS, _ip_bytes(host[0]), host[1])
    except struct.error:
        raise MessageFormatError(
            f"STOREHOST: cannot write at byte {base + STORE_HOST_POS} of a {len(buf)}-byte buffer"
        ) from None


# --- Decoding -----------------------------------------------------------------------------


def _check_lengths(
    buf: Buffer, offset: int, total: int, magic: int, body_len: int
) -> tuple[int, int]:
    """Validate the record's sizes; return (topic_len, props_len). Cheap integer checks;
    the caller has checked that a whole fixed header is available at ``offset``."""
    avail = len(buf) - offset
    if magic != MAGIC_CODE:
        raise MessageFormatError(f"MAGICCODE: {magic} at byte {offset}, expected {MAGIC_CODE}")
    if not MIN_MESSAGE_SIZE <= total <= avail:
        raise MessageFormatError(
            f"TOTALSIZE: {total} at byte {offset}, must be {MIN_MESSAGE_SIZE}..{avail} "
            "(the bytes available)"
        )
    if not 0 <= body_len <= total - MIN_MESSAGE_SIZE:
        raise MessageFormatError(f"BODY: length {body_len} does not fit TOTALSIZE {total}")
    topic_len = buf[offset + BODY_POS + body_len]
    if not 0 < topic_len <= MAX_TOPIC_SIZE:
        raise MessageFormatError(f"TOPIC: length {topic_len}, must be 1..{MAX_TOPIC_SIZE}")
    props_at = BODY_POS + body_len + 1 + topic_len
    if props_at + 2 > total:
        raise MessageFormatError(f"TOPIC: length {topic_len} does not fit TOTALSIZE {total}")
    (props_len,) = _U16.unpack_from(buf, offset + props_at)
    if props_len > MAX_PROPERTIES_SIZE:
        raise MessageFormatError(
            f"PROPERTIES: length {props_len}, at most {MAX_PROPERTIES_SIZE} (RocketMQ reads it"
            " as a signed short)"
        )
    if props_at + 2 + props_len != total:
        raise MessageFormatError(
            f"PROPERTIES: length {props_len} disagrees with TOTALSIZE {total} "
            f"(record would be {props_at + 2 + props_len} bytes)"
        )
    return topic_len, int(props_len)


def _check_header(buf: Buffer, offset: int) -> None:
    avail = len(buf) - offset
    if offset < 0 or avail < FIXED_HEADER_SIZE:
        raise MessageFormatError(
            f"TOTALSIZE: {max(avail, 0)} bytes at offset {offset}, a header needs "
            f"{FIXED_HEADER_SIZE}"
        )


def _topic(buf: Buffer, start: int, end: int) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError:
        raise MessageFormatError("TOPIC: not valid UTF-8") from None


def check_ipv4(sys_flag: int) -> None:
    """Refuse SYSFLAG's IPv6 host bits: their host fields would be 20 bytes, and nothing
    after BORNHOST would lie where this codec reads it."""
    if sys_flag & SYS_FLAG_V6_MASK:
        raise MessageFormatError(f"SYSFLAG: {sys_flag:#x} sets IPv6 host flags (IPv4 only)")


class RecordHead(NamedTuple):
    """The one view of a stored record that its readers share (``decode_head``): the
    fields dispatch and the reads use, and where its BODY and PROPERTIES lie in the
    buffer it was read from (positions in that buffer, not copies: a reader slices and
    decodes only what it uses; a batch record's BODY is its inner records,
    ``broker.batch``). No host, flag, reconsume count or body CRC (``decode_message``)."""

    size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int  # INNER_BATCH_FLAG: a batch record (``broker.batch``)
    born_timestamp: int
    store_timestamp: int
    topic: str
    body_at: int
    body_len: int
    props_at: int
    props_len: int


def decode_head(buf: Buffer, offset: int = 0) -> RecordHead:
    """The head of the record at ``buf[offset]``: one unpack of its readers' fields, and
    nothing copied but the topic; bytes after its TOTALSIZE are ignored.

    Checks the sizes, MAGICCODE and TOPIC, with ``decode_message``'s errors, and nothing
    else: not the body CRC (a reader of committed bytes has the DLedger entry's, which
    covers the whole record), not the PROPERTIES block (a reader meets its errors when
    it decodes it), and not the IPv6 host flags (``check_ipv4``: dispatch indexes such a
    record, as it always has, and the reads refuse to serve it).
    """
    _check_header(buf, offset)
    total, magic, queue_id, queue_offset, physical_offset, sys_flag, born_ts, store_ts, body_len = (
        _HEAD.unpack_from(buf, offset)
    )
    topic_len, props_len = _check_lengths(buf, offset, total, magic, body_len)
    body_at = offset + BODY_POS
    topic_at = body_at + body_len + 1
    props_at = topic_at + topic_len + 2
    # tuple.__new__: a NamedTuple's own constructor is a Python call, 2.6x slower
    return tuple.__new__(
        RecordHead,
        (
            total,
            queue_id,
            queue_offset,
            physical_offset,
            sys_flag,
            born_ts,
            store_ts,
            _topic(buf, topic_at, topic_at + topic_len),
            body_at,
            body_len,
            props_at,
            props_len,
        ),
    )


@dataclass(slots=True, frozen=True)
class StoredMessage:
    """A decoded record. ``properties`` holds every property, system ones included."""

    size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def commitlog_offset(self) -> int:
        """Where the record starts in the DLedger data files (the append hook's pos + 48)."""
        return self.physical_offset

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def keys(self) -> list[str]:
        """KEYS split on spaces (empty pieces dropped); UNIQ_KEY is not included."""
        return split_keys(self.properties.get(PROP_KEYS))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROP_UNIQ_KEY)

    @property
    def user_properties(self) -> dict[str, str]:
        """The properties the producer set itself (no system property)."""
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}


def decode_message(buf: Buffer, offset: int = 0, *, verify_crc: bool = True) -> StoredMessage:
    """Every field of the record at ``buf[offset]``: ``decode_head``'s checks, the IPv4
    hosts (``check_ipv4``), the body CRC (unless ``verify_crc`` is false) and the
    PROPERTIES block; bytes after its TOTALSIZE are ignored."""
    h = decode_head(buf, offset)
    check_ipv4(h.sys_flag)
    stored_crc, flag, born_ip, born_port, store_ip, store_port, reconsume_times, prepared_tx = (
        _REST.unpack_from(buf, offset)
    )
    body = bytes(buf[h.body_at : h.body_at + h.body_len])
    if verify_crc and body_crc(body) != stored_crc:
        raise MessageFormatError(
            f"BODYCRC: stored {stored_crc:#010x}, body has {body_crc(body):#010x}"
        )
    return StoredMessage(
        size=h.size,
        body_crc=stored_crc,
        queue_id=h.queue_id,
        flag=flag,
        queue_offset=h.queue_offset,
        physical_offset=h.physical_offset,
        sys_flag=h.sys_flag,
        born_timestamp=h.born_timestamp,
        born_host=(_ip_str(born_ip), born_port),
        store_timestamp=h.store_timestamp,
        store_host=(_ip_str(store_ip), store_port),
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx,
        body=body,
        topic=h.topic,
        properties=decode_properties(buf[h.props_at : h.props_at + h.props_len]),
    )
