"""Fuzz targets of ``broker``: message records (entry bodies a leader or the disk hands
over), message ids (from a URL), metadata snapshots (a file or a leader's
INSTALL_SNAPSHOT), metadata operations (committed entries) and the dispatch
checkpoint."""

from __future__ import annotations

import contextlib

import orjson

from broker import errors
from broker.batch import batch_inners
from broker.dispatch.appliers import state_appliers
from broker.dispatch.recovery import read_checkpoint
from broker.dispatch.snapshots import parse_queue_table, parse_snapshot, snapshot_bytes
from broker.message import (
    MessageFormatError,
    decode_head,
    decode_message,
    decode_properties,
    encode_message,
    encode_properties,
    tags_and_keys,
)
from broker.metadata import (
    MetadataState,
    TopicMeta,
    op_commit_offsets,
    op_create_topic,
    op_delete_topic,
)
from broker.msgid import parse_msg_id
from broker.records import encode_inner_batch, parse_inner_batch
from broker.settings import Limits
from ledgermq.client import Message
from ledgermq.client.records import record_request

from .reader import Reader, Writer
from .registry import scratch_dir, target


def _message_seeds() -> list[bytes]:
    props = encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "u1", "x": "y"})
    record = encode_message(
        topic="orders", body=b"hello", properties=props, queue_id=3, queue_offset=9,
        physical_offset=48, born_timestamp=1, store_timestamp=2,
    )  # fmt: skip
    return [
        Writer().uint(0, 1).flag(True).raw(bytes(record)).done(),
        Writer().uint(2, 1).flag(False).raw(b"\0\0" + bytes(record)).done(),
        Writer().uint(0, 1).flag(True).raw(b"g0" + b"00" * 8).done(),
    ]


@target("message_codec", max_len=2048, seeds=_message_seeds)
def message_codec(data: bytes) -> None:
    """A CommitLog message record (``decode_message``, ``decode_head``), a property block
    and a message id: a value or ``MessageFormatError``. The two record decoders refuse
    the same records and agree on what they both read."""
    r = Reader(data)
    offset = r.int_in(0, 7)
    verify = r.flag()
    buf = r.rest()
    try:
        m = decode_message(buf, offset, verify_crc=verify)
    except MessageFormatError:
        m = None
    try:
        info = decode_head(buf, offset)
    except MessageFormatError:
        info = None
    if m is not None:
        assert info is not None
        assert (info.topic, info.queue_id, info.queue_offset, info.physical_offset) == (
            m.topic,
            m.queue_id,
            m.queue_offset,
            m.physical_offset,
        )
    for decode in (decode_properties, tags_and_keys):
        with contextlib.suppress(MessageFormatError):
            decode(buf)
    with contextlib.suppress(MessageFormatError):
        parse_msg_id(buf.decode("latin-1"))


def _snapshot_seeds() -> list[bytes]:
    st = MetadataState(16)
    st.apply_op(1, orjson.dumps(op_create_topic("orders", 4)))
    st.apply_op(2, orjson.dumps(op_commit_offsets("g", "orders", {0: 5, 3: 1})))
    st.record_session("p-1", 4, 0, 2, (0, 5, 1000))
    parts = state_appliers(st)
    table = {"queues": {"orders/0": 6, "orders/3": 2}}
    return [snapshot_bytes(st, parts, table), snapshot_bytes(st, parts)]


def _round_trip(st: MetadataState, extra: dict[str, object] | None = None) -> MetadataState:
    """``st`` written to a snapshot and read back into a new state."""
    again = MetadataState(16)
    parts = state_appliers(again)
    parse_snapshot(snapshot_bytes(st, state_appliers(st), extra), parts).adopt(again)
    return again


@target("metadata_snapshot", max_len=4096, seeds=_snapshot_seeds)
def metadata_snapshot(data: bytes) -> None:
    """A metadata snapshot (a file, or a leader's INSTALL_SNAPSHOT) and its queue table:
    a state or ``ValueError`` (the documented contract, nothing else); a state snapshots
    to bytes that load back to the same tables."""
    st = MetadataState(16)
    try:
        snapshot = parse_snapshot(data, state_appliers(st))
    except ValueError:
        return
    snapshot.adopt(st)
    extra = snapshot.extra
    again = _round_trip(st, extra)
    assert (again.applied_index, again.topics, again.offsets) == (
        st.applied_index,
        st.topics,
        st.offsets,
    )
    if "queues" in extra:
        with contextlib.suppress(ValueError):
            parse_queue_table(extra["queues"])


def _op_seeds() -> list[bytes]:
    return [
        orjson.dumps(op_create_topic("t", 3)),
        orjson.dumps(op_commit_offsets("g", "t", {0: 1, 2: 7})),
        orjson.dumps(op_delete_topic("t")),
    ]


@target("metadata_op", max_len=1024, seeds=_op_seeds)
def metadata_op(data: bytes) -> None:
    """A committed ``%SYS%META`` entry body: applied or skipped, never an exception (a
    node must not crash on a committed entry), and the state it leaves survives a
    snapshot (the dispatcher takes one later)."""
    st = MetadataState(16)
    st.apply_op(1, orjson.dumps(op_create_topic("t", 3)))
    st.apply_op(2, data)
    assert st.applied_index == 2
    for topics in st.offsets.values():
        for offsets in topics.values():
            assert all(q >= 0 and o >= 0 for q, o in offsets.items()), offsets
    again = _round_trip(st)
    assert (again.topics, again.offsets) == (st.topics, st.offsets)


def _dispatch_checkpoint_seeds() -> list[bytes]:
    return [
        orjson.dumps({"dispatched_index": 41, "queues": {"t/0": 3, "t/1": 0}, "keys": [48, 7]}),
        orjson.dumps({"dispatched_index": -1, "queues": {}, "keys": [-1, 0]}),
    ]


@target("dispatch_checkpoint", max_len=1024, seeds=_dispatch_checkpoint_seeds)
def dispatch_checkpoint(data: bytes) -> None:
    """The dispatch checkpoint file (``consumequeue/checkpoint-<group>``): what it
    records, or None (not to be trusted: a rebuild), never an exception."""
    with scratch_dir() as d:
        path = d / "checkpoint-g0"
        path.write_bytes(data)
        got = read_checkpoint(path)
    if got is not None:
        index, queues, (file, count) = got
        assert all(isinstance(v, int) for v in (index, file, count, *queues.values()))


LIMITS = Limits()


def _record_seeds() -> list[bytes]:
    content, _query = record_request(
        [Message("a", tags="T", keys=["k1", "k2"], properties={"p": "1"}), b"\x00\xff", "c"]
    ) or (b"", {})
    return [content, content[:30], content.replace(b"TAGS", b"UNIQ")]


@target("record_produce", max_len=2048, seeds=_record_seeds)
def record_produce(data: bytes) -> None:
    """A record-format produce body (``parse_inner_batch``): the checked messages or a
    refusal the client is told (``InvalidArgumentError``, ``PayloadTooLargeError``), never
    anything else; what it takes encodes as a batch record whose inner records decode to
    the same messages, as a single record does each of them."""
    try:
        batch = parse_inner_batch(data, LIMITS)
    except (errors.InvalidArgumentError, errors.PayloadTooLargeError):
        return
    topic = TopicMeta("t", 2, 0)
    common = {
        "session": ("p-1", 0, len(batch)), "first_in_batch": 0, "now": 1,
        "store_host": ("127.0.0.1", 1), "uniq_key": lambda: "U", "limits": LIMITS,
        "select_queues": lambda qs: [1] * len(qs),
    }  # fmt: skip
    records = encode_inner_batch(topic, batch, batch_records=True, **common)  # type: ignore[arg-type]
    messages = list(batch)
    got = []
    for r in records:
        m = decode_message(r.record, verify_crc=True)
        if r.count > 1 or m.sys_flag & 0x80:
            base, inners = batch_inners(r.record)
            assert base == 0 and len(inners) == r.count
            got += [bytes(r.record[i.body_at : i.body_at + i.body_len]) for i in inners]
        else:
            got.append(m.body)
    assert got == [bytes(m.body) for m in messages]
    singles = encode_inner_batch(topic, batch, batch_records=False, **common)  # type: ignore[arg-type]
    assert [decode_message(r.record).body for r in singles] == got
