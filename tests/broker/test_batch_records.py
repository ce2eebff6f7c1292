"""Batch records (``broker.batch``): a request's messages for one queue stored as one
log entry, and every message still its own for every read."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from broker import errors
from broker.batch import (
    BATCH_SYS_FLAG,
    INNER_MIN_SIZE,
    batch_inners,
    encode_batch_record,
    encode_inner_records,
    inner_records,
    set_queue_base,
)
from broker.broker import Broker
from broker.message import (
    BODY_CRC_POS,
    INNER_BATCH_FLAG,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    MessageFormatError,
    decode_message,
)
from broker.produce import NewMessage
from broker.properties import encode_properties
from tests.broker.harness import BrokerCluster, until


async def _single(tmp_path: Path, **overrides: object) -> tuple[BrokerCluster, Broker]:
    c = BrokerCluster(tmp_path, n=1, batch_records=True, **overrides)
    await c.start_all()
    return c, await c.master()


def test_inner_records_round_trip_and_refuse_what_does_not_fit() -> None:
    props = encode_properties({"TAGS": "A", "a": "b"})
    body = encode_inner_records([(b"one", props), (b"", b""), (b"x" * 300, b"")])
    walked = inner_records(body, 0, len(body))
    assert [bytes(body[r.body_at : r.body_at + r.body_len]) for r in walked] == [
        b"one",
        b"",
        b"x" * 300,
    ]
    assert bytes(body[walked[0].props_at : walked[0].props_at + walked[0].props_len]) == props
    assert sum(r.size for r in walked) == len(body) and walked[1].size == INNER_MIN_SIZE
    for bad in (body[:-1], body + b"\0", b"", bytes(4) + body[4:]):
        with pytest.raises(MessageFormatError):
            inner_records(bad, 0, len(bad))
    lying = bytearray(body)
    lying[16:20] = (10**6).to_bytes(4, "big")  # BODY length past the record
    with pytest.raises(MessageFormatError):
        inner_records(lying, 0, len(lying))


@pytest.mark.asyncio
async def test_a_request_is_one_entry_and_every_message_reads_as_its_own(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 2)
        end = b.store.ledger_end_index
        msgs = [
            NewMessage(
                b"m%d" % i, tags="A" if i % 2 else "B", keys=[f"k{i}"], properties={"i": str(i)}
            )
            for i in range(10)
        ]
        results = await b.producer.produce("t", msgs)
        assert b.store.ledger_end_index == end + 1  # one entry for the ten
        [qid] = {r.queue_id for r in results}  # one round-robin pick for the request
        assert [r.queue_offset for r in results] == list(range(10))
        base = results[0].commitlog_offset
        assert [r.commitlog_offset for r in results] == [base + i for i in range(10)]
        assert len({r.msg_id for r in results}) == 10
        record = decode_message(b.store.get(end + 1).body, verify_crc=True)
        assert record.sys_flag & INNER_BATCH_FLAG and record.properties["INNER_NUM"] == "10"

        r = await b.reads.pull(b.reads.pulled_message, "t", qid, 0, max_messages=32)
        assert r.status == "FOUND" and r.next_offset == 10 and r.max_offset == 10
        assert [m.body for m in r.messages] == [m.body for m in msgs]
        for m, res, sent in zip(r.messages, results, msgs, strict=True):
            assert (m.msg_id, m.commitlog_offset, m.queue_offset) == (
                res.msg_id,
                res.commitlog_offset,
                res.queue_offset,
            )
            assert (m.tags, m.keys, m.properties) == (sent.tags, list(sent.keys), sent.properties)
            assert b.reads.get_message(b.reads.pulled_message, m.msg_id) == m
        part = await b.reads.pull(b.reads.pulled_message, "t", qid, 4, max_messages=3)
        assert [m.queue_offset for m in part.messages] == [4, 5, 6] and part.next_offset == 7
        odd = await b.reads.pull(b.reads.pulled_message, "t", qid, 0, max_messages=32, tags="A")
        assert [m.body for m in odd.messages] == [b"m%d" % i for i in range(1, 10, 2)]
        assert [m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", "k7")] == [b"m7"]
        # A byte budget counts the record once: all of its messages come with it.
        tight = await b.reads.pull(
            b.reads.pulled_message, "t", qid, 0, max_messages=32, max_bytes=1
        )
        assert len(tight.messages) == 10
        # No message lies between two message addresses of a batch, nor past its last.
        inside = results[0].msg_id[:-16] + f"{base + 10:016X}"
        with pytest.raises(Exception, match="no message"):
            b.reads.get_message(b.reads.pulled_message, inside)
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_pinned_queues_split_a_request_into_one_record_per_run(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 2)
        end = b.store.ledger_end_index
        pins = [0, 0, 1, 1, 0]
        results = await b.producer.produce(
            "t", [NewMessage(b"%d" % i, queue_id=q) for i, q in enumerate(pins)]
        )
        assert b.store.ledger_end_index == end + 3  # [0, 0], [1, 1], [0]: the last one single
        assert [(r.queue_id, r.queue_offset) for r in results] == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (0, 2),
        ]
        r0 = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        assert [m.body for m in r0.messages] == [b"0", b"1", b"4"]
        assert [m.msg_id for m in r0.messages] == [results[i].msg_id for i in (0, 1, 4)]
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_a_session_retry_answers_the_batch_and_restart_rebuilds_its_units(
    tmp_path: Path,
) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        batch = [NewMessage(b"a", keys=["ka"]), NewMessage(b"b"), NewMessage(b"c")]
        first = await b.producer.produce("t", batch, producer_id="p1", sequence=1)
        assert await b.producer.produce("t", batch, producer_id="p1", sequence=1) == first
        assert b.reads.queue_bounds("t", 0) == (0, 3)
        before = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        await c.stop("n0")
        c.wipe_consume_queues("n0")
        b = await c.start("n0")
        await c.master()
        await until(lambda: b.reads.queue_bounds("t", 0) == (0, 3), 20, "the queue rebuilt")
        after = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        assert after.messages == before.messages
        assert [m.body for m in b.reads.query_by_key(b.reads.pulled_message, "t", "ka")] == [b"a"]
        assert await b.producer.produce("t", batch, producer_id="p1", sequence=1) == first
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_replicas_serve_the_same_batched_messages(tmp_path: Path) -> None:
    c = BrokerCluster(tmp_path, n=3, batch_records=True)
    await c.start_all()
    try:
        m = await c.master()
        results = await m.producer.produce(
            "t", [NewMessage(b"%d" % i, tags="T") for i in range(50)]
        )
        qid = results[0].queue_id
        for node in c.brokers.values():
            reads = node.reads
            await until(lambda reads=reads: reads.queue_bounds("t", qid)[1] == 50, 20, "dispatched")
            r = await node.reads.pull(node.reads.pulled_message, "t", qid, 0, max_messages=100)
            assert [x.msg_id for x in r.messages] == [x.msg_id for x in results]
            assert [x.body for x in r.messages] == [b"%d" % i for i in range(50)]
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_a_run_larger_than_an_entry_is_several_records(tmp_path: Path) -> None:
    """A request within every request limit whose run for one queue would make a record
    the log cannot hold (over ``StoreSettings.max_body_bytes``, or a data file) was
    refused 507 by the store (the docs audit of issue 32): it is several batch records
    now, every message in order. A transaction's half messages are one record, all or
    none: past it, 413 and nothing written."""
    c, b = await _single(tmp_path)  # 1 MiB data files: records of at most 448 KiB of messages
    try:
        await b.topics.create("t", 1)
        cap = b.producer.max_record_bytes
        assert cap == (1 << 20) // 2 - 64 * 1024
        end = b.store.ledger_end_index
        bodies = [bytes([65 + i]) * 100_000 for i in range(12)]  # 1.2 MB for queue 0
        results = await b.producer.produce("t", [NewMessage(x) for x in bodies])
        assert [r.queue_offset for r in results] == list(range(12))
        assert b.store.ledger_end_index == end + 3  # 4 inner records of ~100 KB a record
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0, max_messages=12)
        assert [m.body for m in r.messages] == bodies
        end = b.store.ledger_end_index
        with pytest.raises(errors.PayloadTooLargeError, match="one record"):
            await b.transactions.produce("t", [NewMessage(x) for x in bodies], "pg")
        assert b.store.ledger_end_index == end
    finally:
        await c.close()


def test_a_batch_record_is_what_rocketmq_5_writes() -> None:
    """SYSFLAG INNER_BATCH | NEED_UNWRAP (0xC0: RocketMQ's client unwraps only with the
    second), INNER_NUM and INNER_BASE (RocketMQ's dispatch reads both), inner BODYCRC 0
    (``MessageDecoder.encodeMessage``), the outer BODYCRC ``UtilAll.crc32``'s."""
    record = encode_batch_record(
        "t",
        [(b"a", encode_properties({"TAGS": "x"})), (b"bb", b"")],
        session=("p", 1, 0, 2),
        timestamp=1,
        store_host=("127.0.0.1", 1),
    )
    m = decode_message(record)
    assert BATCH_SYS_FLAG == 0xC0 == m.sys_flag
    assert list(m.properties.items())[-1] == ("INNER_BASE", "0")
    assert m.properties["INNER_NUM"] == "2" and m.queue_offset == 0
    assert m.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
    _, inners = batch_inners(record)
    assert [struct.unpack_from(">iI", record, r.body_at - 16) for r in inners] == [(0, 0)] * 2
    for base in (7, 123_456_789_012, 3, 0):
        set_queue_base(record, base)
        m = decode_message(record)
        assert (m.queue_offset, m.properties["INNER_BASE"], m.size) == (
            base,
            str(base),
            len(record),
        )
        assert m.properties["PRODUCER_ID"] == "p" and m.properties["INNER_NUM"] == "2"
        assert [
            bytes(record[r.body_at : r.body_at + r.body_len]) for r in batch_inners(record)[1]
        ] == [
            b"a",
            b"bb",
        ]
    # Not a batch record's tail, or a base that cannot be one: refused, nothing changed.
    before = bytes(record)
    with pytest.raises(MessageFormatError, match="INNER_BASE"):
        set_queue_base(record, -1)
    single = bytearray(record[:-1])  # the last pair no longer ends in \x02
    with pytest.raises(MessageFormatError, match="INNER_BASE"):
        set_queue_base(single, 5)
    assert bytes(record) == before and struct.unpack_from(">q", single, QUEUE_OFFSET_POS)[0] == 0


@pytest.mark.asyncio
async def test_stored_batches_carry_0xc0_their_inner_base_and_zero_inner_crcs(
    tmp_path: Path,
) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        end = b.store.ledger_end_index
        first = await b.producer.produce("t", [NewMessage(b"%d" % i) for i in range(3)])
        second = await b.producer.produce("t", [NewMessage(b"x%d" % i) for i in range(4)])
        assert [r.queue_offset for r in first + second] == list(range(7))
        assert b.store.ledger_end_index == end + 2
        for index, base, n in ((end + 1, 0, 3), (end + 2, 3, 4)):
            raw = b.store.get(index).body
            record = decode_message(raw)  # the BODYCRC checked, RocketMQ's way
            assert struct.unpack_from(">i", raw, SYS_FLAG_POS)[0] == 0xC0
            assert record.queue_offset == base
            assert record.properties["INNER_BASE"] == str(base)
            assert record.properties["INNER_NUM"] == str(n)
            assert struct.unpack_from(">I", raw, BODY_CRC_POS)[0] == (
                zlib.crc32(record.body) & 0x7FFFFFFF
            )
            _, inners = batch_inners(raw)
            assert [struct.unpack_from(">I", raw, r.body_at - 12)[0] for r in inners] == [0] * n
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0, max_messages=10)
        assert [m.body for m in r.messages] == [b"0", b"1", b"2", b"x0", b"x1", b"x2", b"x3"]
        assert all("INNER_BASE" not in m.properties for m in r.messages)
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_properties_of_32767_bytes_are_stored_and_32768_refused(tmp_path: Path) -> None:
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        most = {"k": "v" * (32_767 - 3)}  # k\x01vvv...\x02: 32,767 bytes encoded
        assert len(encode_properties(most)) == 32_767
        sent = [NewMessage(b"big", properties=most), NewMessage(b"small")]
        results = await b.producer.produce("t", sent)
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        assert [m.properties for m in r.messages] == [most, {}]
        end, bounds = b.store.ledger_end_index, b.reads.queue_bounds("t", 0)
        too_long = {"k": "v" * (32_768 - 3)}
        # Alone, a message's properties hold its UNIQ_KEY too; in a batch record, not.
        for batch, why in (
            ([NewMessage(b"big", properties=too_long)], "message 0: properties of 32810 bytes"),
            (
                [*sent[1:], sent[0], NewMessage(b"x", properties=too_long)],
                "message 2: properties of 32768 bytes",
            ),
        ):
            with pytest.raises(errors.PayloadTooLargeError, match=f"{why}.*limit of 32767"):
                await b.producer.produce("t", batch)
        assert (b.store.ledger_end_index, b.reads.queue_bounds("t", 0)) == (end, bounds)
        assert results[1].queue_offset == 1 and bounds == (0, 2)
    finally:
        await c.close()


def test_a_properties_limit_over_32767_is_refused() -> None:
    from broker.settings import Limits  # noqa: PLC0415

    assert Limits().max_properties_bytes == 32_767
    with pytest.raises(ValueError, match="signed short"):
        Limits(max_properties_bytes=32_768)


@pytest.mark.asyncio
async def test_records_written_before_issue_31_are_still_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/formats.md "Records written before issue 31": the full CRC-32 in BODYCRC and
    batch records of SYSFLAG 0x80 (as written then) are read, recovered and dispatched
    again; only ``decode_message``'s check (RocketMQ's) refuses the old CRC."""
    import broker.batch  # noqa: PLC0415
    import broker.message  # noqa: PLC0415

    bodies = [b for i in range(200) if zlib.crc32(b := b"old %d" % i) & 0x80000000][:3]
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        with monkeypatch.context() as old:
            old.setattr(broker.message, "body_crc", zlib.crc32)
            old.setattr(broker.batch, "BATCH_SYS_FLAG", INNER_BATCH_FLAG)
            end = b.store.ledger_end_index
            await b.producer.produce("t", [NewMessage(bodies[0])])
            await b.producer.produce("t", [NewMessage(x) for x in bodies[1:]])
        single = b.store.get(end + 1).body
        with pytest.raises(MessageFormatError, match="BODYCRC"):
            decode_message(single)
        batch = decode_message(b.store.get(end + 2).body, verify_crc=False)
        assert batch.sys_flag == INNER_BATCH_FLAG
        await c.stop("n0")
        c.wipe_consume_queues("n0")
        b = await c.start("n0")
        await c.master()
        await until(lambda: b.reads.queue_bounds("t", 0) == (0, 3), 20, "the queue rebuilt")
        r = await b.reads.pull(b.reads.pulled_message, "t", 0, 0)
        assert [m.body for m in r.messages] == bodies
    finally:
        await c.close()
