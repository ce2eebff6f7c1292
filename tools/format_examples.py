"""Worked byte-level examples for ``docs/formats.md``, made by the real codecs.

One small log, as a broker writes it: the NOOP a new leader appends first (index 0),
then one message (index 1) whose PHYSICALOFFSET the append hook set, their two index
units, and the consume-queue unit the dispatcher writes for the message. Every field
table is read back through the project's decoders (``decode_entry``,
``decode_message``, ``decode_index_unit``), and ``examples()`` refuses to render when a
table and a decoder disagree, so the document cannot describe bytes the code would not
write or read.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

from api.fetch import encode_page
from api.group_records import encode_received
from broker.message import decode_message, encode_message, message_properties
from broker.msgid import msg_id_prefix
from broker.pages import RawPage
from broker.pop.service import Received
from consumequeue.filter import tags_hash
from consumequeue.queue import UNIT
from dledger.store.entry import (
    BODY_OFFSET,
    MAGIC_NOOP,
    decode_entry,
    decode_index_unit,
    encode_entry,
    encode_index_unit,
)
from ledgermq.client.fetch import decode_page, decode_received

TERM = 1
BORN_MS = 1_764_115_200_000  # 2025-11-26T00:00:00Z
STORE_MS = BORN_MS + 3
UNIQ_KEY = "7F0000010001000000000000000000A1"

# (name, offset, struct format) of the fixed fields, in the order they are written.
ENTRY_FIELDS = [
    ("magic", 0, ">i"),
    ("size", 4, ">i"),
    ("index", 8, ">q"),
    ("term", 16, ">q"),
    ("pos", 24, ">q"),
    ("channel", 32, ">i"),
    ("chain crc", 36, ">I"),
    ("body crc", 40, ">I"),
    ("body size", 44, ">i"),
]
MESSAGE_FIELDS = [
    ("TOTALSIZE", 0, ">i"),
    ("MAGICCODE", 4, ">i"),
    ("BODYCRC", 8, ">I"),
    ("QUEUEID", 12, ">i"),
    ("FLAG", 16, ">i"),
    ("QUEUEOFFSET", 20, ">q"),
    ("PHYSICALOFFSET", 28, ">q"),
    ("SYSFLAG", 36, ">i"),
    ("BORNTIMESTAMP", 40, ">q"),
    ("BORNHOST", 48, ">4si"),
    ("STORETIMESTAMP", 56, ">q"),
    ("STOREHOST", 64, ">4si"),
    ("RECONSUMETIMES", 72, ">i"),
    ("PREPAREDTXOFFSET", 76, ">q"),
]
INDEX_FIELDS = [("magic", 0, ">i"), ("pos", 4, ">q"), ("size", 12, ">i")]
INDEX_FIELDS += [("index", 16, ">q"), ("term", 24, ">q")]
CQ_FIELDS = [("commitlog offset", 0, ">q"), ("size", 8, ">i"), ("tags hash", 12, ">q")]
PAGE_FIELDS = [
    ("magic", 0, ">4s"),
    ("version", 4, ">B"),
    ("status", 5, ">B"),
    ("prefix length", 6, ">H"),
    ("next_offset", 8, ">q"),
    ("min_offset", 16, ">q"),
    ("max_offset", 24, ">q"),
    ("message count", 32, ">I"),
    ("records bytes", 36, ">I"),
]
ENTRY_TABLE_FIELDS = [("queue_offset", 0, ">q"), ("record at", 8, ">I"), ("inner index", 12, ">I")]
GROUP_HEADER_FIELDS = [
    ("magic", 0, ">4s"),
    ("version", 4, ">B"),
    ("reserved", 5, ">3s"),
    ("page count", 8, ">I"),
    ("message count", 12, ">I"),
]
RECEIPT_FIELDS = [
    ("delivery_attempt", 0, ">I"),
    ("invisible_until", 4, ">q"),
    ("handle length", 12, ">H"),
]
FRAME_FIELDS = [("queue_id", 0, ">I"), ("page bytes", 4, ">I")]
POP_HANDLE = "v1:0:0:7"  # queue 0, offset 0, the flight's epoch (broker.pop.service)
POP_UNTIL_MS = STORE_MS + 30_000
GROUP = "g0"


def hexdump(data: bytes, base: int = 0) -> str:
    """``xxd``-like lines: offset, 16 bytes in hex, printable ASCII."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{base + at:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def _value(fmt: str, raw: bytes) -> str:
    values = struct.unpack(fmt, raw)
    if isinstance(values[0], bytes) and not values[0].strip(b"\0"):  # reserved: zeros
        return "0"
    if isinstance(values[0], bytes) and len(values) == 1:  # a magic
        return f"`{values[0].decode()}`"
    if len(values) == 2:  # a host: 4 address bytes and a port
        address, port = values
        return ".".join(str(b) for b in address) + f":{port}"
    return str(values[0])


def field_table(data: bytes, fields: list[tuple[str, int, str]]) -> Iterator[str]:
    yield "| field | at | bytes | value |"
    yield "|---|---:|---|---|"
    for name, at, fmt in fields:
        raw = data[at : at + struct.calcsize(fmt)]
        yield f"| {name} | {at} | `{raw.hex(' ')}` | {_value(fmt, raw)} |"


class Example:
    """The example log: two entries, two index units, one consume-queue unit."""

    def __init__(self) -> None:
        self.noop = encode_entry(0, TERM, 0, b"", magic=MAGIC_NOOP)
        props = message_properties({}, tags="paid", keys=["order-1"], uniq_key=UNIQ_KEY)
        self.message_pos = len(self.noop)  # the message's entry starts where the NOOP ends
        record = encode_message(
            topic="orders",
            body=b'{"id":1}',
            properties=props,
            queue_id=0,
            queue_offset=0,
            physical_offset=self.message_pos + BODY_OFFSET,  # what the append hook writes
            born_timestamp=BORN_MS,
            born_host=("127.0.0.1", 52000),
            store_timestamp=STORE_MS,
            store_host=("127.0.0.1", 9080),
        )
        self.record = bytes(record)
        prev_chain = decode_entry(self.noop).chain_crc
        self.entry = encode_entry(1, TERM, self.message_pos, self.record, prev_chain=prev_chain)
        self.units = [
            encode_index_unit(MAGIC_NOOP, 0, len(self.noop), 0, TERM),
            encode_index_unit(1, self.message_pos, len(self.entry), 1, TERM),
        ]
        self.cq_unit = UNIT.pack(
            self.message_pos + BODY_OFFSET, len(self.record), tags_hash("paid")
        )
        self.page = self._record_page()
        physical = self.message_pos + BODY_OFFSET
        received = Received((0, 0, physical, 0), POP_HANDLE, 1, POP_UNTIL_MS)
        self.pop = encode_received([received], {physical: self.record}, msg_id_prefix(GROUP))
        self._check()

    def _record_page(self) -> bytes:
        """The record page a pull of the message answers (``api.fetch``), made from a
        view of the example log as a node makes it from its store's."""
        log = self.noop + self.entry

        @contextlib.contextmanager
        def view(start: int, size: int) -> Iterator[memoryview]:
            with memoryview(log) as v:
                yield v[start : start + size]

        page = RawPage(self.cq_unit, view, segment_bytes=1 << 30, queue_offsets=[0])
        content, _, _ = encode_page(
            page,
            status="FOUND",
            next_offset=1,
            min_offset=0,
            max_offset=1,
            prefix=msg_id_prefix(GROUP),
        )
        return bytes(content)

    def _check(self) -> None:
        """The tables must say what the decoders read."""
        e = decode_entry(self.entry)
        m = decode_message(e.body)
        assert (e.index, e.pos, e.body) == (1, self.message_pos, self.record)
        assert m.physical_offset == self.message_pos + BODY_OFFSET and m.tags == "paid"
        unit = decode_index_unit(self.units[1])
        assert (unit.pos, unit.size, unit.index) == (self.message_pos, len(self.entry), 1)
        assert UNIT.unpack(self.cq_unit) == (m.physical_offset, m.size, tags_hash(m.tags))
        pulled = decode_page(self.page).result
        (got,) = pulled.messages
        assert (pulled.status, pulled.next_offset, got.body, got.tags) == (
            "FOUND",
            1,
            b'{"id":1}',
            "paid",
        )
        assert got.msg_id == msg_id_prefix(GROUP) + f"{m.physical_offset:016X}"
        assert self.page.endswith(self.record)
        (popped,) = decode_received(self.pop)
        assert (popped.msg_id, popped.body, popped.tags) == (got.msg_id, got.body, got.tags)
        assert popped.receipt_handle == POP_HANDLE
        assert (popped.delivery_attempt, popped.invisible_until) == (1, POP_UNTIL_MS)
        assert self.pop.endswith(self.record)

    def regions(self) -> dict[str, str]:
        """The generated regions of docs/formats.md, by name."""
        tail = self.record[88:]
        return {
            "log-hexdump": _block(hexdump(self.noop + self.entry)),
            "entry-fields": "\n".join(field_table(self.entry, ENTRY_FIELDS)),
            "message-fields": "\n".join(field_table(self.record, MESSAGE_FIELDS)),
            "message-tail": _block(hexdump(tail, base=88)),
            "index-hexdump": _block(hexdump(b"".join(self.units))),
            "index-fields": "\n".join(field_table(self.units[1], INDEX_FIELDS)),
            "cq-hexdump": _block(hexdump(self.cq_unit)),
            "cq-fields": "\n".join(field_table(self.cq_unit, CQ_FIELDS)),
            "page-hexdump": _block(hexdump(self.page[: len(self.page) - len(self.record)])),
            "page-fields": "\n".join(field_table(self.page, PAGE_FIELDS)),
            "page-entry-fields": "\n".join(
                field_table(self.page[40 + len(GROUP) * 2 :], ENTRY_TABLE_FIELDS)
            ),
            "pop-hexdump": _block(hexdump(self.pop[: len(self.pop) - len(self.record)])),
            "group-header-fields": "\n".join(field_table(self.pop, GROUP_HEADER_FIELDS)),
            "receipt-fields": "\n".join(field_table(self.pop[16:], RECEIPT_FIELDS)),
            "frame-fields": "\n".join(
                field_table(self.pop[16 + 14 + len(POP_HANDLE) :], FRAME_FIELDS)
            ),
        }


def _block(text: str) -> str:
    return f"```text\n{text}\n```"
