"""The Arrow pull on one in-process node (docs/spark.md): the same statuses, offsets and
messages as the JSON pull, across commitlog and consume-queue segment boundaries, with
the tag filter, content negotiation, metrics and the OpenAPI document."""

from __future__ import annotations

import asyncio
import base64
import random
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from api import media
from api.arrow import SCHEMA, encode_pulled
from broker import errors
from ledgermq import client
from tests.api.conftest import Node, node_settings, running_node
from tests.api.test_app import produce

pytestmark = pytest.mark.asyncio

ARROW = {"accept": media.ARROW_STREAM}


def as_json_row(m: dict[str, Any]) -> dict[str, Any]:
    """A JSON pull's message in the Arrow row's terms (bytes value, µs timestamps)."""
    body = base64.b64decode(m["body"]) if m["encoding"] == "base64" else m["body"].encode()
    return {
        "key": m["key"],
        "keys": m["keys"],
        "value": body,
        "topic": m["topic"],
        "queue_id": m["queue_id"],
        "queue_offset": m["queue_offset"],
        "msg_id": m["msg_id"],
        "tags": m["tags"],
        "properties": sorted(m["properties"].items()),
        "born_timestamp": m["born_timestamp"] * 1000,
        "store_timestamp": m["store_timestamp"] * 1000,
    }


def as_arrow_rows(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media.ARROW_STREAM
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.schema.equals(SCHEMA)
    # Timestamps as µs integers: the comparison is exact, not through datetime.
    for name in ("born_timestamp", "store_timestamp"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.int64()))
    rows = table.to_pylist()
    for row in rows:
        row["properties"] = sorted(row["properties"])
    assert int(r.headers[media.PULL_COUNT]) == len(rows)
    return rows


def headers_of(r: httpx.Response) -> tuple[str, int, int, int]:
    h = r.headers
    return (
        h[media.PULL_STATUS],
        int(h[media.PULL_NEXT_OFFSET]),
        int(h[media.PULL_MIN_OFFSET]),
        int(h[media.PULL_MAX_OFFSET]),
    )


async def pull_both(node: Node, url: str, **params: Any) -> tuple[dict[str, Any], httpx.Response]:
    j = (await node.http.get(url, params={**params, "encoding": "base64"})).json()
    a = await node.http.get(url, params=params, headers=ARROW)
    return j, a


async def test_every_message_equals_the_json_pull_across_segments(node: Node) -> None:
    """1 MiB commitlog segments and 64-unit consume-queue segments: pages of 100 from
    two queues cross both kinds of boundary."""
    await _equal_across_segments(node)


async def test_batch_records_equal_the_json_pull_across_segments(tmp_path: Path) -> None:
    """The same with every request stored as batch records (broker.batch): pages start
    and end inside records, and a tag filter picks messages out of them."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await _equal_across_segments(n)
        assert n.broker.store.ledger_end_index < 32  # 16 requests: a record each
        url = "/v1/topics/big/queues/1/messages"
        for params in ({"tags": "A", "max_messages": 7}, {"tags": "B", "offset": 250}):
            j, a = await pull_both(n, url, **params)
            assert j["status"] == "FOUND" and {m["tags"] for m in j["messages"]} == {params["tags"]}
            assert as_arrow_rows(a) == [as_json_row(m) for m in j["messages"]]


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
                "properties": {"batch": str(batch), "i": str(i)} if i % 3 else {},
            }
            for i in range(100)
        ]
        await produce(node, "big", *msgs)
    assert node.broker.store.ledger_begin_pos == 0 and node.broker.store.ledger_end_pos > 1 << 20
    for queue_id in (0, 1):
        url = f"/v1/topics/big/queues/{queue_id}/messages"
        offset, seen = 0, 0
        for _ in range(100):
            j, a = await pull_both(node, url, offset=offset, max_messages=100)
            assert headers_of(a) == (
                j["status"],
                j["next_offset"],
                j["min_offset"],
                j["max_offset"],
            )
            if j["status"] != "FOUND":
                break
            assert as_arrow_rows(a) == [as_json_row(m) for m in j["messages"]]
            seen += len(j["messages"])
            offset = j["next_offset"]
        assert seen == 800


async def test_statuses_offsets_and_tag_filter_match_json(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "p", "queues": 1})
    url = "/v1/topics/p/queues/0/messages"
    j, a = await pull_both(node, url)
    assert headers_of(a) == ("NO_NEW_MSG", 0, 0, 0) and j["status"] == "NO_NEW_MSG"
    assert as_arrow_rows(a) == []
    await produce(
        node,
        "p",
        *[{"body": f"m{i}", "tags": "AB"[i % 2], "key": f"k{i}"} for i in range(10)],
    )
    for params in (
        {"tags": "B"},
        {"tags": "A||B", "max_messages": 3, "offset": 2},
        {"tags": "C", "offset": 0},
        {"offset": 11},
        {"offset": 4, "max_messages": 2},
    ):
        j, a = await pull_both(node, url, **params)
        assert headers_of(a) == (j["status"], j["next_offset"], j["min_offset"], j["max_offset"])
        assert as_arrow_rows(a) == [as_json_row(m) for m in j["messages"]], params
    _, a = await pull_both(node, url, tags="B")
    assert [r["value"] for r in as_arrow_rows(a)] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    bad = await node.http.get(url, params={"max_messages": 0}, headers=ARROW)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
    # Arrow pages may be larger than JSON ones (the test node allows 100 JSON messages).
    assert (await node.http.get(url, params={"max_messages": 150})).status_code == 422
    big = await node.http.get(url, params={"max_messages": 150}, headers=ARROW)
    assert len(as_arrow_rows(big)) == 10
    limit = node.broker.settings.limits.max_arrow_pull_messages
    bad = await node.http.get(url, params={"max_messages": limit + 1}, headers=ARROW)
    assert bad.status_code == 422
    missing = await node.http.get("/v1/topics/none/queues/0/messages", headers=ARROW)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "TOPIC_NOT_FOUND"


@pytest.mark.parametrize(
    ("accept", "arrow"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        (media.ARROW_STREAM, True),
        (f"{media.ARROW_STREAM}, application/json;q=0.5", True),
        (f"application/json, {media.ARROW_STREAM};q=0.5", False),
        (f"{media.ARROW_STREAM};q=0", False),
        (f"{media.ARROW_STREAM};q=bad", False),
    ],
)
async def test_content_negotiation_keeps_json_the_default(
    node: Node, accept: str | None, arrow: bool
) -> None:
    assert media.wants_arrow(accept) is arrow
    await produce(node, "neg", {"body": "x", "queue_id": 0})
    headers = {"accept": accept} if accept is not None else {}
    r = await node.http.get("/v1/topics/neg/queues/0/messages", headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(media.ARROW_STREAM if arrow else "application/json")


async def test_arrow_pulls_are_counted_and_documented(node: Node) -> None:
    await produce(node, "mx", {"body": "x" * 10, "queue_id": 0}, {"body": "y" * 5, "queue_id": 0})
    r = await node.http.get("/v1/topics/mx/queues/0/messages", headers=ARROW)
    assert len(as_arrow_rows(r)) == 2
    text = (await node.http.get("/metrics")).text
    assert 'ledgermq_pulled_messages_total{topic="mx"} 2.0' in text
    assert 'ledgermq_pulled_bytes_total{topic="mx"} 15.0' in text
    doc = (await node.http.get("/openapi.json")).json()
    op = doc["paths"]["/v1/topics/{topic}/queues/{queue_id}/messages"]["get"]
    ok = op["responses"]["200"]
    assert set(ok["content"]) == {"application/json", media.ARROW_STREAM, media.RECORDS}
    assert media.PULL_NEXT_OFFSET in ok["headers"] and "406" in op["responses"]
    assert media.ARROW_STREAM in op["description"]


async def test_the_python_client_pulls_arrow(node: Node) -> None:
    assert client.ARROW_STREAM == media.ARROW_STREAM
    await produce(node, "cl", *[{"body": f"m{i}", "queue_id": 1} for i in range(5)])
    transport = httpx.ASGITransport(app=node.app)
    async with client.AsyncAdmin("http://node", transport=transport) as admin:
        page = await admin.pull_arrow("cl", 1, 1, max_messages=3)
        assert (page.status, page.next_offset, page.max_offset, page.count) == ("FOUND", 4, 5, 3)
        table = pa.ipc.open_stream(page.content).read_all()
        assert table.column("value").to_pylist() == [b"m1", b"m2", b"m3"]
        empty = await admin.pull_arrow("cl", 1, 5)
        assert (empty.status, empty.count) == ("NO_NEW_MSG", 0)
        with pytest.raises(client.TopicNotFoundError):
            await admin.pull_arrow("nope", 0, 0)


async def test_a_page_whose_records_retention_took_is_answered_busy(node: Node) -> None:
    """Units read, then the log's head deleted before the records are: BUSY, retried."""
    await node.http.post("/v1/topics", json={"name": "gone", "queues": 1})
    for _ in range(30):
        await produce(node, "gone", *[{"body": "x" * 1000} for _ in range(100)])
    page = (await node.broker.reads.pull_page("gone", 0, 0, max_messages=50)).page
    assert page.count == 50
    await node.broker.dispatcher.snapshot()
    await node.broker.dispatcher.checkpoint()
    assert await asyncio.to_thread(node.broker.store.clean, True) >= 1
    with pytest.raises(errors.BusyError, match="the log changed under the page"):
        encode_pulled(page, topic="gone", group="g0")
