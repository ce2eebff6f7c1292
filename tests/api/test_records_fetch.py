"""The binary fetch (issue 31) on one in-process node: a pull answered as a record page
(docs/formats.md "Record pages") holds exactly the messages, statuses and offsets of the
JSON pull, across segments, batch records (pages starting and ending inside them), tag
filters and binary bodies; its layout holds together byte by byte; content negotiation,
long polls, limits and errors behave as the JSON pull's; the Python client decodes it
lazily into the messages the JSON pull gives."""

from __future__ import annotations

import asyncio
import base64
import itertools
import pickle
import random
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from api import fetch, media
from broker.message import MIN_MESSAGE_SIZE, encode_message
from broker.message import decode_message as decode_record
from broker.properties import SYSTEM_PROPERTIES
from ledgermq import client
from ledgermq.client import fetch as client_fetch
from ledgermq.client.exchange import RECORD_PAGE
from ledgermq.client.types import ReceivedMessage, decode_message
from ledgermq.spark.pull import Puller
from tests.api.conftest import Node, node_settings, running_node, serving
from tests.api.test_app import produce
from tests.fuzz.targets_api import record_page_of as page_of_records

RECORDS = {"accept": media.RECORDS}


def page_of(r: httpx.Response) -> client_fetch.RecordPage:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media.RECORDS
    page = client_fetch.decode_page(r.content)
    res = page.result
    h = r.headers
    assert (
        h[media.PULL_STATUS],
        int(h[media.PULL_NEXT_OFFSET]),
        int(h[media.PULL_MIN_OFFSET]),
        int(h[media.PULL_MAX_OFFSET]),
        int(h[media.PULL_COUNT]),
    ) == (res.status, res.next_offset, res.min_offset, res.max_offset, len(res.messages))
    return page


async def pull_both(
    node: Node, url: str, **params: Any
) -> tuple[dict[str, Any], client_fetch.RecordPage]:
    j = (await node.http.get(url, params={**params, "encoding": "base64"})).json()
    r = await node.http.get(url, params=params, headers=RECORDS)
    return j, page_of(r)


def assert_same(j: dict[str, Any], page: client_fetch.RecordPage) -> None:
    res = page.result
    assert (res.status, res.next_offset, res.min_offset, res.max_offset) == (
        j["status"],
        j["next_offset"],
        j["min_offset"],
        j["max_offset"],
    )
    expected = [decode_message(m) for m in j["messages"]]
    assert res.messages == expected
    # field by field too (``==`` is RecordMessage's): each read from the record
    for got, want in zip(res.messages, expected, strict=True):
        assert isinstance(got, client_fetch.RecordMessage)
        assert got.plain() == want and type(got.plain()) is ReceivedMessage
        for name in ReceivedMessage.__dataclass_fields__:
            assert getattr(got, name) == getattr(want, name), name


def test_the_module_constants_agree_with_the_client() -> None:
    assert media.RECORDS == RECORD_PAGE == client_fetch.MEDIA_TYPE == fetch.MEDIA_TYPE
    assert fetch.HEADER.format == client_fetch.HEADER.format and fetch.HEADER.size == 40
    assert fetch.ENTRY.size == client_fetch.ENTRY_SIZE == 16
    assert fetch.STATUSES == client_fetch.STATUSES and fetch.MAGIC == client_fetch.MAGIC
    # what a message's ``properties`` leaves out, as the JSON pull does
    assert client_fetch._SYSTEM == SYSTEM_PROPERTIES
    assert client_fetch._MIN_RECORD == MIN_MESSAGE_SIZE


def test_tags_and_keys_read_alone_agree_with_the_whole_block() -> None:
    """TAGS and KEYS are found in a message's PROPERTIES block without parsing it (a
    consumer reading tags pays for no more): whenever the whole block parses, they are
    what it says, whatever names and values surround them (``XTAGS``, ``TAGSX``, a
    value ``TAGS``, a last pair without its separator, an empty block)."""
    rng = random.Random(5)
    pieces = ["TAGS", "KEYS", "XTAGS", "TAGSX", "a", "b c", " ", "é", "\x01", "\x02"]
    parsed = 0
    for _ in range(3000):
        block = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8)))
        record = encode_message(topic="t", body=b"", properties=block.encode(), born_timestamp=1)
        (m,) = client_fetch.decode_page(page_of_records([(record, [0])])).result.messages
        alone: list[object] = []
        for name in ("tags", "keys", "key"):
            try:
                alone.append(getattr(m, name))
            except client_fetch.RecordPageError:
                alone.append(client_fetch.RecordPageError)
        try:
            m.fields()
        except client_fetch.RecordPageError:
            continue
        parsed += 1
        assert alone == [m.tags, m.keys, m.key], repr(block)
    assert parsed > 500


@pytest.mark.asyncio
async def test_every_message_equals_the_json_pull_across_segments(node: Node) -> None:
    """1 MiB commitlog segments and 64-unit consume-queue segments: pages of 100 from two
    queues cross both kinds of boundary; bodies are random bytes (not UTF-8)."""
    await _equal_across_segments(node)


@pytest.mark.asyncio
async def test_batch_records_equal_the_json_pull(tmp_path: Path) -> None:
    """Every request stored as batch records (broker.batch): pages of 7 start and end
    inside records, and a tag filter picks messages out of them; each record is sent
    once, whole, and the table names the inner messages that belong."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await _equal_across_segments(n)
        assert n.broker.store.ledger_end_index < 32  # 16 requests: a record each
        url = "/v1/topics/big/queues/1/messages"
        for params in (
            {"tags": "A", "max_messages": 7},
            {"tags": "B", "offset": 250},
            {"offset": 53, "max_messages": 7},  # the middle of a record
            {"offset": 95, "max_messages": 10},  # across two records
        ):
            j, page = await pull_both(n, url, **params)
            assert j["status"] == "FOUND"
            assert_same(j, page)
            tags = params.get("tags")
            if tags:
                assert {m.tags for m in page.result.messages} == {tags}
        # Pages of 37 start and end inside records, and some cross a segment.
        for queue_id in (0, 1):
            url_q = f"/v1/topics/big/queues/{queue_id}/messages"
            offset = 0
            while offset < 800:
                j, page = await pull_both(n, url_q, offset=offset, max_messages=37)
                assert_same(j, page)
                offset = j["next_offset"]
        # The layout: a page inside one record holds that record once, whole.
        raw = await n.http.get(url, params={"offset": 53, "max_messages": 7}, headers=RECORDS)
        body = raw.content
        _, _, _, prefix_len, _, _, _, count, records_bytes = fetch.HEADER.unpack_from(body)
        table = fetch.HEADER.size + prefix_len
        entries = [fetch.ENTRY.unpack_from(body, table + 16 * i) for i in range(count)]
        area = table + 16 * count
        starts = sorted({at for _, at, _ in entries})
        spans = [*starts, records_bytes]
        for a, b in itertools.pairwise(spans):
            record = decode_record(body, area + a)  # RocketMQ's record, CRC checked
            assert record.size == b - a and record.sys_flag & 0x80
            assert [i for q, at, i in entries if at == a] == [
                q - record.queue_offset for q, at, _ in entries if at == a
            ]
        assert [q for q, _, _ in entries] == list(range(53, 60))


@pytest.mark.asyncio
async def test_a_record_split_across_chunks_is_sent_once(tmp_path: Path) -> None:
    """A page's chunks (``broker.pages``) may split a batch record's units: with one unit
    per chunk, the page is the same bytes as with one chunk for all."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await produce(n, "sp", *[{"body": f"b{i}", "queue_id": 0} for i in range(30)])
        await produce(n, "sp", *[{"body": f"c{i}", "tags": "T", "queue_id": 0} for i in range(9)])
        for tags in (None, "T"):
            r = await n.broker.reads.pull_page("sp", 0, 5, max_messages=40, tags=tags)
            args = {"status": r.status, "next_offset": r.next_offset, "min_offset": 0}
            one = fetch.encode_page(r.page, max_offset=39, prefix="6730", **args)
            split = replace(r.page, max_span_bytes=1)
            many = fetch.encode_page(split, max_offset=39, prefix="6730", **args)
            assert bytes(one[0]) == bytes(many[0]) and one[1] == many[1]
            msgs = client_fetch.decode_page(one[0]).result.messages
            expected = [f"b{i}" for i in range(5, 30)] if tags is None else []
            expected += [f"c{i}" for i in range(9)]
            assert [m.body.decode() for m in msgs] == expected


async def _equal_across_segments(node: Node) -> None:
    rng = random.Random(3)
    await node.http.post("/v1/topics", json={"name": "big", "queues": 2})
    for batch in range(16):
        msgs = [
            {
                "body": base64.b64encode(rng.randbytes(rng.randrange(1, 2000))).decode(),
                "encoding": "base64",
                "keys": [f"k{batch}-{i}", "shared"][: rng.randrange(3)],
                "tags": rng.choice([None, "A", "B"]),
                "properties": {"batch": str(batch), "i": str(i), "é": "ü"} if i % 3 else {},
            }
            for i in range(100)
        ]
        await produce(node, "big", *msgs)
    assert node.broker.store.ledger_begin_pos == 0 and node.broker.store.ledger_end_pos > 1 << 20
    for queue_id in (0, 1):
        url = f"/v1/topics/big/queues/{queue_id}/messages"
        offset, seen = 0, 0
        for _ in range(100):
            j, page = await pull_both(node, url, offset=offset, max_messages=100)
            assert_same(j, page)
            if j["status"] != "FOUND":
                break
            seen += len(j["messages"])
            offset = j["next_offset"]
        assert seen == 800


@pytest.mark.asyncio
async def test_statuses_offsets_limits_and_tag_filter_match_json(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "p", "queues": 1})
    url = "/v1/topics/p/queues/0/messages"
    j, page = await pull_both(node, url)
    assert page.result.status == "NO_NEW_MSG" and page.records_bytes == 0
    assert_same(j, page)
    await produce(
        node,
        "p",
        *[{"body": f"m{i}", "tags": "AB"[i % 2], "key": f"k{i}"} for i in range(10)],
    )
    for params in (
        {"tags": "B"},
        {"tags": "A||B", "max_messages": 3, "offset": 2},
        {"tags": "C", "offset": 0},  # NO_MATCHED_MSG
        {"offset": 11},  # OFFSET_ILLEGAL
        {"offset": 4, "max_messages": 2},
        {"offset": 10},  # NO_NEW_MSG at the end
    ):
        j, page = await pull_both(node, url, **params)
        assert_same(j, page)
    _, page = await pull_both(node, url, tags="B")
    assert [m.body for m in page.result.messages] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    statuses = set()
    for params in ({"tags": "C"}, {"offset": 11}, {"offset": 10}, {}):
        _, page = await pull_both(node, url, **params)
        statuses.add(page.result.status)
    assert statuses == set(fetch.STATUSES)
    # The JSON pull's limits (the test node allows 100 messages), not the Arrow ones.
    for headers in (RECORDS, {}):
        bad = await node.http.get(url, params={"max_messages": 101}, headers=headers)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
        missing = await node.http.get("/v1/topics/none/queues/0/messages", headers=headers)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "TOPIC_NOT_FOUND"
        bad_queue = await node.http.get("/v1/topics/p/queues/5/messages", headers=headers)
        assert bad_queue.status_code == 400 or bad_queue.status_code == 422


@pytest.mark.asyncio
async def test_a_long_poll_answers_the_message_committed_while_it_waits(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "lp", "queues": 1})
    url = "/v1/topics/lp/queues/0/messages"
    waiting = asyncio.create_task(
        node.http.get(url, params={"wait_ms": 4000, "tags": "T"}, headers=RECORDS)
    )
    await produce(node, "lp", {"body": "other", "tags": "U", "queue_id": 0})
    await produce(node, "lp", {"body": "wanted", "tags": "T", "queue_id": 0})
    page = page_of(await asyncio.wait_for(waiting, 10))
    assert page.result.status == "FOUND"
    assert [(m.body, m.tags, m.queue_offset) for m in page.result.messages] == [(b"wanted", "T", 1)]
    # and a long poll with nothing to find answers NO_NEW_MSG when its wait is over
    idle = page_of(await node.http.get(url, params={"offset": 2, "wait_ms": 50}, headers=RECORDS))
    assert (idle.result.status, idle.result.next_offset) == ("NO_NEW_MSG", 2)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, media.JSON),
        ("*/*", media.JSON),
        ("text/html", media.JSON),
        ("application/json", media.JSON),
        (media.RECORDS, media.RECORDS),
        (f"{media.RECORDS};q=0", media.JSON),
        (f"{media.RECORDS};q=nope", media.JSON),
        (f"{media.RECORDS};q=0.4, application/json;q=0.5", media.JSON),
        (f"application/json;q=0.5, {media.RECORDS}", media.RECORDS),
        (f"{media.ARROW_STREAM}, {media.RECORDS}", media.RECORDS),
        (f"{media.ARROW_STREAM}, {media.RECORDS};q=0.9", media.ARROW_STREAM),
        (f"{media.RECORDS.upper()}", media.RECORDS),
        (";;,,vnd.", media.JSON),
    ],
)
@pytest.mark.asyncio
async def test_content_negotiation(node: Node, accept: str | None, expected: str) -> None:
    assert media.pull_format(accept) == expected
    await produce(node, "neg", {"body": "x", "queue_id": 0})
    headers = {"accept": accept} if accept is not None else {}
    r = await node.http.get("/v1/topics/neg/queues/0/messages", headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(expected)


@pytest.mark.asyncio
async def test_record_pulls_are_counted_and_documented(node: Node) -> None:
    await produce(node, "mx", {"body": "x" * 10, "queue_id": 0}, {"body": "y" * 5, "queue_id": 0})
    r = await node.http.get("/v1/topics/mx/queues/0/messages", headers=RECORDS)
    assert len(page_of(r).result.messages) == 2
    text = (await node.http.get("/metrics")).text
    assert 'ledgermq_pulled_messages_total{topic="mx"} 2.0' in text
    assert 'ledgermq_pulled_bytes_total{topic="mx"} 15.0' in text
    doc = (await node.http.get("/openapi.json")).json()
    pull = doc["paths"]["/v1/topics/{topic}/queues/{queue_id}/messages"]["get"]
    assert media.RECORDS in pull["responses"]["200"]["content"]
    assert media.RECORDS in pull["description"]


@pytest.mark.asyncio
async def test_batch_record_metrics_count_only_the_bodies_taken(tmp_path: Path) -> None:
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await produce(n, "bm", *[{"body": "z" * (i + 1), "queue_id": 0} for i in range(5)])
        url = "/v1/topics/bm/queues/0/messages"
        page = page_of(
            await n.http.get(url, params={"offset": 2, "max_messages": 2}, headers=RECORDS)
        )
        assert [m.body for m in page.result.messages] == [b"zzz", b"zzzz"]
        text = (await n.http.get("/metrics")).text
        assert 'ledgermq_pulled_bytes_total{topic="bm"} 7.0' in text


@pytest.mark.asyncio
async def test_the_python_client_pulls_record_pages_by_default(node: Node) -> None:
    """The async client asks for record pages (``record_pull``, the default) and gets
    the messages the JSON client gets; one pickles as a plain ``ReceivedMessage``."""
    await node.http.post("/v1/topics", json={"name": "cl", "queues": 1})
    await produce(
        node,
        "cl",
        {"body": base64.b64encode(b"\xff\x00bin").decode(), "encoding": "base64", "queue_id": 0},
        {"body": "text", "keys": ["a", "b"], "tags": "T", "properties": {"p": "1"}, "queue_id": 0},
    )
    transport = httpx.ASGITransport(app=node.app)
    async with client.AsyncAdmin("http://node", transport=transport) as fast:
        got = await fast.pull("cl", 0, 0)
    async with client.AsyncAdmin("http://node", transport=transport, record_pull=False) as slow:
        want = await slow.pull("cl", 0, 0)
    assert all(isinstance(m, client_fetch.RecordMessage) for m in got.messages)
    assert not any(isinstance(m, client_fetch.RecordMessage) for m in want.messages)
    assert got == want
    assert got.messages[0].body == b"\xff\x00bin"
    assert (got.messages[1].key, got.messages[1].keys) == ("a", ("a", "b"))
    assert pickle.loads(pickle.dumps(got.messages[1])) == want.messages[1]
    assert "RecordMessage(" in repr(got.messages[1])


def _page(entries: list[tuple[int, int, int]], records: bytes, *, prefix: bytes = b"67") -> bytes:
    head = fetch.HEADER.pack(
        fetch.MAGIC, fetch.VERSION, 0, len(prefix), 1, 0, 1, len(entries), len(records)
    )
    return head + prefix + b"".join(fetch.ENTRY.pack(*e) for e in entries) + records


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"LMQR",
        _page([], b"")[:-1],
        b"XXXX" + _page([], b"")[4:],
        _page([], b"") + b"!",
        _page([(0, 0, 0)], b""),  # an entry past the area
        _page([(0, 0, 0)], b"\x00" * 200),  # no message record there
        _page([(0, 0, 0)], struct.pack(">ii", 200, -626843481) + b"\x00" * 100),  # too long
        struct.pack(">4sBB", b"LMQR", 1, 9) + _page([], b"")[6:],  # an unknown status
    ],
)
def test_a_malformed_page_is_refused_clearly(content: bytes) -> None:
    with pytest.raises(client_fetch.RecordPageError):
        client_fetch.decode_page(content)


@pytest.mark.asyncio
async def test_the_client_pulls_the_same_messages_both_ways(tmp_path: Path) -> None:
    """Batch records (pages starting in the middle of one), tag filters, binary and text
    bodies, keys and properties: the client's record pull (the default) and its JSON
    pull (``record_pull=False``) give the same messages, field by field."""
    rng = random.Random(7)
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await n.http.post("/v1/topics", json={"name": "cc", "queues": 2})
        for batch in range(6):
            msgs = [
                {
                    "body": base64.b64encode(rng.randbytes(rng.randrange(0, 300))).decode(),
                    "encoding": "base64",
                    "queue_id": batch % 2,
                    "keys": [f"k{batch}-{i}", "shared"][: rng.randrange(3)],
                    "tags": rng.choice([None, "A", "B"]),
                    "properties": {"i": str(i), "ключ": "значение"} if i % 2 else {},
                }
                for i in range(40)
            ]
            await produce(n, "cc", *msgs)
        await produce(n, "cc", *[{"body": f"text {i}", "queue_id": 0} for i in range(3)])
        transport = httpx.ASGITransport(app=n.app)
        fast = client.AsyncAdmin("http://node", transport=transport)
        slow = client.AsyncAdmin("http://node", transport=transport, record_pull=False)
        async with fast, slow:
            for queue_id, offset, most, tags in (
                (0, 0, 100, None),
                (0, 17, 30, None),  # starts and ends inside batch records
                (1, 39, 2, None),  # across two records
                (0, 5, 100, "A"),
                (1, 3, 7, "A||B"),
                (0, 120, 10, None),  # the ordinary records at the end
                (0, 123, 10, None),  # NO_NEW_MSG
                (1, 500, 10, None),  # OFFSET_ILLEGAL
            ):
                got = await fast.pull("cc", queue_id, offset, max_messages=most, tags=tags)
                want = await slow.pull("cc", queue_id, offset, max_messages=most, tags=tags)
                assert got == want, (queue_id, offset, most, tags)
                assert all(type(m) is client_fetch.RecordMessage for m in got.messages)
                for g, w in zip(got.messages, want.messages, strict=True):
                    assert (g.body, g.key, g.keys, g.tags, g.properties) == (
                        w.body,
                        w.key,
                        w.keys,
                        w.tags,
                        w.properties,
                    )
                    assert (g.msg_id, g.queue_offset, g.queue_id, g.topic) == (
                        w.msg_id,
                        w.queue_offset,
                        w.queue_id,
                        w.topic,
                    )
                    assert (g.born_timestamp, g.store_timestamp) == (
                        w.born_timestamp,
                        w.store_timestamp,
                    )


def test_the_blocking_client_and_the_spark_puller_read_record_pages(tmp_path: Path) -> None:
    """Over real sockets: the blocking client (httpx) and the Spark source's puller
    (http.client) ask for record pages and decode them."""
    with serving(node_settings(tmp_path / "n0")) as node:
        with client.Producer(node.url) as p:
            p.send("bl", [client.Message(f"m{i}", tags="T", queue_id=0) for i in range(5)])
        with client.Admin(node.url) as fast, client.Admin(node.url, record_pull=False) as slow:
            got, want = fast.pull("bl", 0, 1), slow.pull("bl", 0, 1)
        assert got == want and [m.body for m in got.messages] == [b"m1", b"m2", b"m3", b"m4"]
        assert type(got.messages[0]) is client_fetch.RecordMessage
        puller = Puller([node.url], client.ClientSettings())  # record_pull: the default
        try:
            page = puller.pull("bl", 0, 2, n=10, wait_ms=0)
        finally:
            puller.close()
        assert page.messages == want.messages[1:]
        assert type(page.messages[0]) is client_fetch.RecordMessage
