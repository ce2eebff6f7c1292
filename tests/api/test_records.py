"""Produce in the record format (issue 31, docs/http.md): RocketMQ's batch encoding of
inner records, which the Python client sends by default, stored as one batch record as
it came; read back exactly as a JSON produce of the same messages; a malformed body
answered 400 naming the first bad inner record, with nothing written."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import httpx
import orjson
import pytest

from broker.batch import BATCH_SYS_FLAG, batch_inners
from broker.message import decode_message
from broker.records import MEDIA_TYPE
from ledgermq.client import AsyncProducer, Message
from ledgermq.client.records import record_request
from tests.api.conftest import Node

pytestmark = pytest.mark.asyncio

HEADERS = {"content-type": MEDIA_TYPE}
MESSAGES = [
    Message("plain"),
    Message(b"\x00\xffbinary", tags="TagA", keys=["k1", "k2"], properties={"p": "1"}),
    Message("keyed", key="solo", tags="TagB"),
]


def inner(body: bytes, props: bytes = b"", crc: int | None = None, magic: int = 0) -> bytes:
    """One inner record, BODYCRC as given (None: the masked CRC-32 of the body)."""
    crc = zlib.crc32(body) & 0x7FFF_FFFF if crc is None else crc
    size = 22 + len(body) + len(props)
    return (
        struct.pack(">iiIii", size, magic, crc, 0, len(body))
        + body
        + struct.pack(">H", len(props))
        + props
    )


async def _topic(node: Node, name: str, queues: int = 2) -> None:
    r = await node.http.post("/v1/topics", json={"name": name, "queues": queues})
    assert r.status_code == 201, r.text


async def _read(node: Node, topic: str, queues: int = 2) -> list[dict[str, Any]]:
    out = []
    for q in range(queues):
        r = await node.http.get(f"/v1/topics/{topic}/queues/{q}/messages?offset=0")
        assert r.status_code == 200, r.text
        out += orjson.loads(r.content)["messages"]
    return out


def _seen(m: dict[str, Any]) -> tuple[Any, ...]:
    return (m["body"], m.get("encoding"), m["tags"], m["keys"], m["properties"], m["queue_id"])


async def test_the_record_format_reads_back_as_the_same_messages_sent_as_json(node: Node) -> None:
    await _topic(node, "rec")
    await _topic(node, "json")
    transport = httpx.ASGITransport(app=node.app)
    async with AsyncProducer("http://node", transport=transport, record_format=False) as p:
        await p.send("json", MESSAGES)
    async with AsyncProducer("http://node", transport=transport) as p:
        got = await p.send("rec", MESSAGES)
    rec, js = await _read(node, "rec"), await _read(node, "json")
    assert [_seen(m) for m in rec] == [_seen(m) for m in js]
    assert [m["msg_id"] for m in rec] == [r.msg_id for r in got]
    assert [m["queue_offset"] for m in rec] == [0, 1, 2]
    # one batch record, as RocketMQ 5 writes one: SYSFLAG 0xC0, inner BODYCRC 0
    r = await node.http.get("/v1/topics/rec/messages", params={"key": "solo"})
    assert [m["body"] for m in orjson.loads(r.content)["messages"]] == ["keyed"]
    store = node.broker.store
    entry = store.get(store.ledger_end_index)
    record = decode_message(entry.body)
    assert record.sys_flag == BATCH_SYS_FLAG and record.topic == "rec"
    base, inners = batch_inners(entry.body)
    assert base == 0 and len(inners) == 3
    assert all(struct.unpack_from(">I", entry.body, i.body_at - 12)[0] == 0 for i in inners)


async def test_a_session_resend_is_answered_not_stored_again_and_queues_hold(node: Node) -> None:
    await _topic(node, "s", queues=4)
    content, query = record_request([Message("a", queue_id=3), Message("b", queue_id=3)]) or (
        b"",
        {},
    )
    params = {**query, "producer_id": "p-rec", "sequence": 7}
    first = await node.http.post(
        "/v1/topics/s/messages", content=content, params=params, headers=HEADERS
    )
    again = await node.http.post(
        "/v1/topics/s/messages", content=content, params=params, headers=HEADERS
    )
    assert first.status_code == again.status_code == 200, first.text
    assert first.json() == again.json()
    assert [r["queue_id"] for r in first.json()["results"]] == [3, 3]
    assert [m["body"] for m in await _read(node, "s", 4)] == ["a", "b"]
    keyed = record_request(
        [Message("x", sharding_key="order-1"), Message("y", sharding_key="order-1")]
    )
    assert keyed is not None and keyed[1] == {"sharding_key": "order-1"}
    r = await node.http.post(
        "/v1/topics/s/messages", content=keyed[0], params=keyed[1], headers=HEADERS
    )
    assert r.status_code == 200, r.text
    assert len({x["queue_id"] for x in r.json()["results"]}) == 1


async def test_rocketmqs_client_encoding_with_bodycrc_zero_is_taken(node: Node) -> None:
    await _topic(node, "z", queues=1)
    body = inner(b"from java", b"TAGS\x01T\x02KEYS\x01a b\x02", crc=0) + inner(b"two", crc=0)
    r = await node.http.post("/v1/topics/z/messages", content=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    [m, n] = await _read(node, "z", 1)
    assert (m["body"], m["tags"], m["keys"], n["body"]) == ("from java", "T", ["a", "b"], "two")


BAD = [
    ("truncated", inner(b"ok") + inner(b"cut")[:-3], "inner record 1"),
    ("magic", inner(b"ok", magic=7), "MAGICCODE 7"),
    ("crc", inner(b"ok") + inner(b"bad", crc=12345), "inner record 1: BODYCRC"),
    ("uniq key", inner(b"ok", b"UNIQ_KEY\x01X\x02"), "property UNIQ_KEY is reserved"),
    ("session", inner(b"ok", b"PRODUCER_SEQ\x011\x02"), "property PRODUCER_SEQ is reserved"),
    ("separators", inner(b"ok", b"a\x01b\x01c\x02"), "inner record 0: PROPERTIES"),
    ("not utf-8", inner(b"ok", b"a\x01\xff\x02"), "not valid UTF-8"),
    ("empty", b"", "no inner record"),
    ("keys", inner(b"ok", b"KEYS\x01a  b\x02"), "KEYS"),
]


@pytest.mark.parametrize(("what", "body", "said"), BAD, ids=[b[0] for b in BAD])
async def test_a_malformed_body_names_the_first_bad_record_and_writes_nothing(
    node: Node, what: str, body: bytes, said: str
) -> None:
    await _topic(node, "bad")
    before = node.log_state()
    r = await node.http.post("/v1/topics/bad/messages", content=body, headers=HEADERS)
    assert r.status_code == 422, (what, r.text)
    err = r.json()["error"]
    assert err["code"] == "INVALID_ARGUMENT" and said in err["message"], (what, err)
    assert node.log_state() == before


async def test_the_request_limits_and_the_query_are_checked(node: Node) -> None:
    await _topic(node, "lim")
    before = node.log_state()
    limits = node.broker.settings.limits
    many = inner(b"m") * (limits.max_messages_per_request + 1)
    r = await node.http.post("/v1/topics/lim/messages", content=many, headers=HEADERS)
    assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE", r.text
    big = inner(b"x" * (limits.max_body_bytes + 1))
    r = await node.http.post("/v1/topics/lim/messages", content=big, headers=HEADERS)
    assert r.status_code == 413, r.text
    for params in ({"queue_id": "2"}, {"queue_id": "x"}, {"queue_id": "0", "sharding_key": "k"}):
        r = await node.http.post(
            "/v1/topics/lim/messages", content=inner(b"q"), params=params, headers=HEADERS
        )
        assert r.status_code in (400, 422) and r.json()["error"]["code"] == "INVALID_ARGUMENT", (
            r.text
        )
    assert node.log_state() == before


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # (a sync test in the module)
def test_the_client_sends_json_what_the_format_cannot_say() -> None:
    assert record_request([Message("later", delay_ms=1000)]) is None
    assert record_request([Message("a", queue_id=0), Message("b", queue_id=1)]) is None
    assert record_request([{"body": "as a mapping"}]) is None
    assert record_request([Message("x", properties={"TAGS": "t"})]) is None  # (refused)
    with pytest.raises(ValueError, match="no \\\\x01 or \\\\x02"):
        record_request([Message("x", properties={"a": "b\x02c\x01d"})])
    content, query = record_request(["s", b"b"]) or (b"", {})
    assert query == {} and len(content) == 2 * 22 + 2


async def test_the_compact_answer_names_every_message_as_the_full_one_would(node: Node) -> None:
    await _topic(node, "runs", queues=2)
    content, query = record_request([Message(f"m{i}", queue_id=1) for i in range(5)]) or (b"", {})
    r = await node.http.post(
        "/v1/topics/runs/messages",
        content=content,
        params={**query, "results": "runs"},
        headers=HEADERS,
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    [[queue_id, offset, address, count]] = doc["runs"]  # one record: one run
    assert (queue_id, offset, count) == (1, 0, 5)
    stored = await _read(node, "runs")
    assert [m["msg_id"] for m in stored] == [
        f"{doc['msg_id_prefix']}{address + i:016X}" for i in range(5)
    ]
    assert [m["queue_offset"] for m in stored] == list(range(5))


async def test_the_metrics_count_a_record_format_produces_messages_and_body_bytes(
    node: Node,
) -> None:
    await _topic(node, "counted", queues=1)
    content, query = record_request([Message("abc"), Message(b"\x00" * 10)]) or (b"", {})
    r = await node.http.post(
        "/v1/topics/counted/messages", content=content, params=query, headers=HEADERS
    )
    assert r.status_code == 200, r.text
    text = (await node.http.get("/metrics")).text
    assert 'ledgermq_produced_messages_total{topic="counted"} 2.0' in text
    assert 'ledgermq_produced_bytes_total{topic="counted"} 13.0' in text
