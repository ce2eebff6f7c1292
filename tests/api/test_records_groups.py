"""The group pull and the POP receive in the record format (issue 31; docs/formats.md
"Record pages of many queues") on one in-process node: the same messages, next offsets,
budget, long polls and errors as their JSON answers, across segments, batch records,
tags and binary bodies; the framing holds together byte by byte and a malformed answer
is refused clearly; the Python client uses them by default and gets what JSON gives;
a receipt handle from a record answer acks, nacks and extends exactly as one from JSON."""

from __future__ import annotations

import asyncio
import base64
import pickle
import random
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from api import fetch, group_records, media
from broker.message import decode_head
from ledgermq import client
from ledgermq.client import fetch as client_fetch
from ledgermq.client.types import PopMessage, ReceivedMessage, decode_message, decode_pop_message
from tests.api.conftest import TEST_LIMITS, Node, node_settings, running_node, serving
from tests.api.test_app import produce
from tests.fuzz.targets_api import _answer_seeds

RECORDS = {"accept": media.RECORDS}


def _group_of(r: httpx.Response) -> list[client_fetch.QueuePage]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media.RECORDS
    pages = client_fetch.decode_group(r.content)
    assert int(r.headers[media.PULL_COUNT]) == sum(len(p.result.messages) for p in pages)
    return pages


async def group_both(
    node: Node, group: str, **body: Any
) -> tuple[dict[str, Any], list[client_fetch.QueuePage]]:
    """The same group pull as JSON, then as records (without ``auto_commit`` a pull
    changes nothing, so both read the same state)."""
    url = f"/v1/groups/{group}/pull"
    j = await node.http.post(url, json={**body, "encoding": "base64"})
    assert j.status_code == 200, j.text
    r = await node.http.post(url, json=body, headers=RECORDS)
    return j.json(), _group_of(r)


def assert_same_group(j: dict[str, Any], pages: list[client_fetch.QueuePage]) -> None:
    got = [m for p in pages for m in p.result.messages]
    expected = [decode_message(m) for m in j["messages"]]
    assert got == expected
    for g, w in zip(got, expected, strict=True):
        assert type(g) is client_fetch.RecordMessage
        for name in ReceivedMessage.__dataclass_fields__:
            assert getattr(g, name) == getattr(w, name), name
    assert {str(p.queue_id): p.result.next_offset for p in pages} == j["next_offsets"]
    for p in pages:
        assert all(m.queue_id == p.queue_id for m in p.result.messages)
        assert p.result.status in fetch.STATUSES


async def _fill(
    node: Node, topic: str, *, queues: int, batches: int, seed: int, per_request: int = 100
) -> None:
    """Random binary bodies (up to ~2 KB), keys, tags and properties, ``per_request``
    messages a request."""
    rng = random.Random(seed)
    await node.http.post("/v1/topics", json={"name": topic, "queues": queues})
    for batch in range(batches):
        msgs = [
            {
                "body": base64.b64encode(rng.randbytes(rng.randrange(0, 2000))).decode(),
                "encoding": "base64",
                "keys": [f"k{batch}-{i}", "shared"][: rng.randrange(3)],
                "tags": rng.choice([None, "A", "B"]),
                "properties": {"batch": str(batch), "é": "ü"} if i % 3 else {},
            }
            for i in range(per_request)
        ]
        await produce(node, topic, *msgs)


async def _walk_group(node: Node, group: str, topic: str, total: int | None, **body: Any) -> int:
    """Group pulls both ways from the committed offsets, committing each answer's next
    offsets, until nothing is left: how many pulls it took."""
    seen = 0
    for n in range(1, 200):
        j, pages = await group_both(node, group, topic=topic, **body)
        assert_same_group(j, pages)
        if not j["messages"]:
            assert total is None or seen == total
            return n
        seen += len(j["messages"])
        r = await node.http.put(
            f"/v1/groups/{group}/offsets", json={"topic": topic, "offsets": j["next_offsets"]}
        )
        assert r.status_code == 200, r.text
    raise AssertionError("the walk did not end")


# ---- the group pull --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_group_pulls_equal_the_json_ones_across_segments(node: Node) -> None:
    """1 MiB commitlog segments, 64-unit consume-queue segments, three queues: group
    pulls of 100 and of 37 cross both kinds of boundary and the queues' ends."""
    await _fill(node, "big", queues=3, batches=16, seed=3)
    assert node.broker.store.ledger_end_pos > 1 << 20
    await _walk_group(node, "g100", "big", 1600, max_messages=100)
    await _walk_group(node, "g37", "big", 1600, max_messages=37)
    # queues named, in another order: the pages come in that order (JSON's messages too)
    queues = (await node.http.get("/v1/topics/big")).json()["queues"]
    near_end = {"2": queues[2]["max_offset"] - 10}
    r = await node.http.put("/v1/groups/gq/offsets", json={"topic": "big", "offsets": near_end})
    assert r.status_code == 200, r.text
    j, pages = await group_both(node, "gq", topic="big", max_messages=100, queue_ids=[2, 0])
    assert_same_group(j, pages)
    assert [p.queue_id for p in pages] == [2, 0]
    await _walk_group(node, "gq", "big", None, max_messages=50, queue_ids=[2, 0])


@pytest.mark.asyncio
async def test_batch_records_and_the_budget_equal_the_json_group_pull(tmp_path: Path) -> None:
    """Batch records (pages start and end inside them) and a response budget of 40 KB
    spent across the queues (a batch record's messages count their inner records): the
    record answer takes exactly the JSON answer's messages."""
    limits = replace(TEST_LIMITS, max_response_bytes=40_000)
    settings = node_settings(tmp_path / "n0", batch_records=True, limits=limits)
    async with running_node(settings) as n:
        await _fill(n, "bb", queues=2, batches=8, seed=5)
        assert n.broker.store.ledger_end_index < 24  # a record per request
        await _walk_group(n, "g", "bb", 800, max_messages=100)
        await _walk_group(n, "g7", "bb", 800, max_messages=7)
        # records of 10 messages (~10 KB): the budget, not max_messages, cuts the answers
        await _fill(n, "small", queues=2, batches=40, seed=6, per_request=10)
        pulls = await _walk_group(n, "g", "small", 400, max_messages=100)
        assert pulls > 400 / 100 + 1


@pytest.mark.asyncio
async def test_statuses_long_poll_and_auto_commit(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "lp", "queues": 2})
    j, pages = await group_both(node, "g", topic="lp")
    assert_same_group(j, pages)
    assert [p.result.status for p in pages] == ["NO_NEW_MSG", "NO_NEW_MSG"]
    assert all(not p.result.messages and p.result.next_offset == 0 for p in pages)
    # A long poll across both queues answers the message committed while it waits.
    url = "/v1/groups/g/pull"
    waiting = asyncio.create_task(
        node.http.post(url, json={"topic": "lp", "wait_ms": 4000}, headers=RECORDS)
    )
    await produce(node, "lp", {"body": "late", "tags": "T", "queue_id": 1})
    pages = _group_of(await asyncio.wait_for(waiting, 10))
    assert [(p.queue_id, p.result.status) for p in pages] == [(0, "NO_NEW_MSG"), (1, "FOUND")]
    assert [m.body for m in pages[1].result.messages] == [b"late"]
    # and one with nothing to find answers every queue's next offset when its wait ends
    body = {"topic": "lp", "wait_ms": 50, "queue_ids": [0]}
    idle = _group_of(await node.http.post(url, json=body, headers=RECORDS))
    assert [(p.queue_id, p.result.status, p.result.messages) for p in idle] == [
        (0, "NO_NEW_MSG", [])
    ]
    # auto_commit commits what the record answer holds, as the JSON one does
    await produce(node, "lp", *[{"body": f"m{i}", "queue_id": i % 2} for i in range(6)])
    body = {"topic": "lp", "max_messages": 4, "auto_commit": True}
    pages = _group_of(await node.http.post(url, json=body, headers=RECORDS))
    assert sum(len(p.result.messages) for p in pages) == 4
    offsets = (await node.http.get("/v1/groups/g/offsets")).json()["offsets"]
    assert {o["queue_id"]: o["committed_offset"] for o in offsets} == {
        p.queue_id: p.result.next_offset for p in pages
    }
    j, pages = await group_both(node, "g", topic="lp")
    assert_same_group(j, pages)
    assert sum(len(p.result.messages) for p in pages) == 3


@pytest.mark.asyncio
async def test_refusals_are_the_json_ones_and_change_nothing(node: Node) -> None:
    await produce(node, "e", {"body": "x", "queue_id": 0})
    await node.http.put("/v1/groups/popper", json={"start": "earliest"})
    before = node.log_state()
    for url, body, code in (
        ("/v1/groups/g/pull", {"topic": "none"}, "TOPIC_NOT_FOUND"),
        ("/v1/groups/g/pull", {"topic": "e", "max_messages": 101}, "INVALID_ARGUMENT"),
        ("/v1/groups/g/pull", {"topic": "e", "queue_ids": [9]}, "INVALID_ARGUMENT"),
        ("/v1/groups/g/pull", {"topic": "e", "wait_ms": -1}, "INVALID_ARGUMENT"),
        ("/v1/groups/popper/pull", {"topic": "e"}, "GROUP_MODE_CONFLICT"),
        ("/v1/groups/g/receive", {"topic": "none"}, "TOPIC_NOT_FOUND"),
        ("/v1/groups/g/receive", {"topic": "e", "max_messages": 0}, "INVALID_ARGUMENT"),
        ("/v1/groups/g/receive", {"topic": "e", "invisible_ms": 1}, "INVALID_ARGUMENT"),
    ):
        as_json = await node.http.post(url, json=body)
        r = await node.http.post(url, json=body, headers=RECORDS)
        assert r.status_code == as_json.status_code >= 400, (url, body, r.text)
        assert r.headers["content-type"].startswith(media.JSON)
        assert r.json() == as_json.json() and r.json()["error"]["code"] == code, r.text
    bad = await node.http.post(
        "/v1/groups/g/pull", content=b"{not json", headers={**RECORDS, "content-type": media.JSON}
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert node.log_state() == before
    assert (await node.http.get("/v1/groups/g/offsets")).status_code == 404  # no commit


@pytest.mark.asyncio
async def test_group_and_pop_answers_are_counted_and_documented(node: Node) -> None:
    await produce(node, "mx", {"body": "x" * 10, "queue_id": 0}, {"body": "y" * 5, "queue_id": 0})
    r = await node.http.post("/v1/groups/g/pull", json={"topic": "mx"}, headers=RECORDS)
    assert len(_group_of(r)[0].result.messages) == 2
    await node.http.put("/v1/groups/p", json={"start": "earliest"})
    r = await node.http.post("/v1/groups/p/receive", json={"topic": "mx"}, headers=RECORDS)
    assert len(client_fetch.decode_received(r.content)) == 2
    text = (await node.http.get("/metrics")).text
    assert 'ledgermq_pulled_messages_total{topic="mx"} 4.0' in text
    assert 'ledgermq_pulled_bytes_total{topic="mx"} 30.0' in text
    doc = (await node.http.get("/openapi.json")).json()
    for path in ("/v1/groups/{group}/pull", "/v1/groups/{group}/receive"):
        op = doc["paths"][path]["post"]
        assert media.RECORDS in op["responses"]["200"]["content"]
        assert media.RECORDS in op["description"]
    # Arrow is not offered here: JSON; a record page preferred to Arrow: records
    for accept, answer in (
        (media.ARROW_STREAM, media.JSON),
        (f"{media.ARROW_STREAM}, {media.RECORDS};q=0.5", media.RECORDS),
        (f"{media.RECORDS};q=0", media.JSON),
    ):
        r = await node.http.post(
            "/v1/groups/g/pull", json={"topic": "mx"}, headers={"accept": accept}
        )
        assert r.headers["content-type"].startswith(answer)


@pytest.mark.asyncio
async def test_the_group_framing_holds_together(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "fr", "queues": 3})
    await produce(node, "fr", *[{"body": f"m{i}", "queue_id": i % 3} for i in range(7)])
    r = await node.http.post("/v1/groups/g/pull", json={"topic": "fr"}, headers=RECORDS)
    body = r.content
    magic, version, n_pages, n_messages = group_records.GROUP_HEADER.unpack_from(body)
    assert (magic, version, n_pages, n_messages) == (b"LMQG", 1, 3, 7)
    at = group_records.GROUP_HEADER.size
    for queue_id in range(n_pages):
        q, size = group_records.PAGE_FRAME.unpack_from(body, at)
        at += group_records.PAGE_FRAME.size
        page = client_fetch.decode_page(body[at : at + size]).result  # a one-queue page
        assert q == queue_id and [m.queue_id for m in page.messages] == [q] * len(page.messages)
        at += size
    assert at == len(body)


# ---- POP receive -------------------------------------------------------------------------------


async def _receive_both(
    node: Node, topic: str, **body: Any
) -> tuple[list[PopMessage], list[PopMessage]]:
    """The same receive by two groups in the same state (``jg``: JSON, ``rg``: records)."""
    j = await node.http.post(
        "/v1/groups/jg/receive", json={"topic": topic, **body, "encoding": "base64"}
    )
    r = await node.http.post(
        "/v1/groups/rg/receive", json={"topic": topic, **body}, headers=RECORDS
    )
    assert j.status_code == 200 and r.status_code == 200, (j.text, r.text)
    assert r.headers["content-type"] == media.RECORDS
    got = client_fetch.decode_received(r.content)
    assert int(r.headers[media.PULL_COUNT]) == len(got)
    return [decode_pop_message(m) for m in j.json()["messages"]], got


def assert_same_pop(want: list[PopMessage], got: list[PopMessage]) -> None:
    """The same messages and attempts (the handles' epochs and the times are each
    group's own)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is client_fetch.RecordPopMessage
        for name in ReceivedMessage.__dataclass_fields__:
            assert getattr(g, name) == getattr(w, name), name
        assert g.delivery_attempt == w.delivery_attempt
        assert g.receipt_handle.rsplit(":", 1)[0] == w.receipt_handle.rsplit(":", 1)[0]
        assert abs(g.invisible_until - w.invisible_until) < 60_000


async def _pop_groups(node: Node, **config: Any) -> None:
    for group in ("jg", "rg"):
        r = await node.http.put(f"/v1/groups/{group}", json={"start": "earliest", **config})
        assert r.status_code == 200, r.text


@pytest.mark.asyncio
async def test_receives_equal_the_json_ones_and_handles_round_trip(tmp_path: Path) -> None:
    """Batch records, tags, binary bodies, across segments: two groups receive the same
    messages, one as JSON, one as records; the record handles ack, nack and extend."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await _fill(n, "pp", queues=3, batches=14, seed=9)
        assert n.broker.store.ledger_end_pos > 1 << 20
        await _pop_groups(n)
        seen = 0
        for most, tags in ((32, None), (100, "A"), (7, "A||B"), (100, None)):
            want, got = await _receive_both(n, "pp", max_messages=most, tags=tags)
            assert_same_pop(want, got)
            assert want, (most, tags)
            seen += len(got)
            for group, ms in (("jg", want), ("rg", got)):
                r = await n.http.post(
                    f"/v1/groups/{group}/ack",
                    json={"topic": "pp", "receipt_handles": [m.receipt_handle for m in ms]},
                )
                assert [x["status"] for x in r.json()["results"]] == ["OK"] * len(ms)
        # nack: delivered again with the next attempt, in both forms alike
        want, got = await _receive_both(n, "pp", max_messages=5)
        for group, ms in (("jg", want), ("rg", got)):
            r = await n.http.post(
                f"/v1/groups/{group}/nack",
                json={
                    "topic": "pp",
                    "receipt_handles": [m.receipt_handle for m in ms],
                    "delay_ms": 0,
                },
            )
            assert [x["status"] for x in r.json()["results"]] == ["OK"] * 5
        nacked = {m.msg_id for m in got}
        again: list[PopMessage] = []
        for _ in range(20):  # (the receives rotate their first queue: fresh ones come too)
            want, got = await _receive_both(n, "pp", max_messages=100)
            assert_same_pop(want, got)
            again += [m for m in got if m.msg_id in nacked]
            if len(again) == len(nacked):
                break
        assert {m.msg_id for m in again} == nacked and {m.delivery_attempt for m in again} == {2}
        got = again
        # extend: the new handle acks, the old one no longer does
        r = await n.http.post(
            "/v1/groups/rg/invisible",
            json={"topic": "pp", "receipt_handle": got[0].receipt_handle, "invisible_ms": 60_000},
        )
        assert r.status_code == 200, r.text
        new = r.json()["receipt_handle"]
        r = await n.http.post(
            "/v1/groups/rg/ack",
            json={"topic": "pp", "receipt_handles": [got[0].receipt_handle, new]},
        )
        assert [x["status"] for x in r.json()["results"]] == ["INVALID_RECEIPT_HANDLE", "OK"]


@pytest.mark.asyncio
async def test_a_retried_attempt_and_a_long_poll_in_records(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "wp", "queues": 2})
    await node.http.put("/v1/groups/w", json={"start": "earliest"})
    url = "/v1/groups/w/receive"
    waiting = asyncio.create_task(
        node.http.post(url, json={"topic": "wp", "wait_ms": 4000}, headers=RECORDS)
    )
    await produce(
        node,
        "wp",
        {"body": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64", "queue_id": 1},
    )
    r = await asyncio.wait_for(waiting, 10)
    (m,) = client_fetch.decode_received(r.content)
    assert (m.body, m.queue_id, m.delivery_attempt) == (b"\xff\x00", 1, 1)
    # nothing to hand out: an empty answer once the wait ends
    r = await node.http.post(url, json={"topic": "wp", "wait_ms": 50}, headers=RECORDS)
    assert client_fetch.decode_received(r.content) == []
    assert len(r.content) == group_records.GROUP_HEADER.size
    # a retry with the same attempt_id answers the same messages, the same handles
    await produce(node, "wp", *[{"body": f"f{i}", "queue_id": i % 2} for i in range(4)])
    body = {"topic": "wp", "attempt_id": "a1", "max_messages": 3}
    first = client_fetch.decode_received(
        (await node.http.post(url, json=body, headers=RECORDS)).content
    )
    again = (await node.http.post(url, json={**body, "encoding": "base64"})).json()["messages"]
    assert len(first) == 3
    assert sorted(m.receipt_handle for m in first) == sorted(m["receipt_handle"] for m in again)
    assert {m.receipt_handle: m for m in first} == {
        m["receipt_handle"]: decode_pop_message(m) for m in again
    }


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"LMQG",
        group_records.GROUP_HEADER.pack(b"LMQX", 1, 0, 0),
        group_records.GROUP_HEADER.pack(b"LMQG", 2, 0, 0),
        group_records.GROUP_HEADER.pack(b"LMQG", 1, 1, 0),  # a page missing
        group_records.GROUP_HEADER.pack(b"LMQG", 1, 0, 1),  # a message missing
        group_records.GROUP_HEADER.pack(b"LMQG", 1, 0, 0) + b"!",
        group_records.GROUP_HEADER.pack(b"LMQG", 1, 1, 0) + struct.pack(">II", 0, 99),
        group_records.GROUP_HEADER.pack(b"LMQG", 1, 1, 0) + struct.pack(">II", 0, 3) + b"abc",
    ],
)
def test_a_malformed_group_answer_is_refused_clearly(content: bytes) -> None:
    with pytest.raises(client_fetch.RecordPageError):
        client_fetch.decode_group(content)
    with pytest.raises(client_fetch.RecordPageError):
        client_fetch.decode_received(content.replace(b"LMQG", b"LMQP"))


def test_a_malformed_pop_answer_is_refused_clearly() -> None:
    head = group_records.GROUP_HEADER.pack(b"LMQP", 1, 0, 1)
    for content in (
        head,  # a receipt missing
        head + group_records.RECEIPT.pack(1, 2, 50) + b"v1:0:0:1",  # a handle past the end
        head + group_records.RECEIPT.pack(1, 2, 2) + b"\xff\xff",  # no page for it
    ):
        with pytest.raises(client_fetch.RecordPageError):
            client_fetch.decode_received(content)
    with pytest.raises(client_fetch.RecordPageError):  # a group answer is not a POP one
        client_fetch.decode_received(group_records.GROUP_HEADER.pack(b"LMQG", 1, 0, 0))


# ---- the client --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_client_consumes_and_pops_the_same_both_ways(tmp_path: Path) -> None:
    """A group consumer and a POP consumer of the async client, records (the default)
    and JSON (``record_pull=False``): the same messages; the record ones ack."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await _fill(n, "cc", queues=2, batches=3, seed=11)
        transport = httpx.ASGITransport(app=n.app)
        got: dict[bool, list[ReceivedMessage]] = {}
        for record_pull in (True, False):
            async with client.AsyncConsumer(
                "http://node",
                f"g-{record_pull}",
                "cc",
                transport=transport,
                record_pull=record_pull,
            ) as c:
                out: list[ReceivedMessage] = []
                for _ in range(40):
                    batch = await c.poll(max_messages=64)
                    if not batch:
                        break
                    out += batch
                got[record_pull] = out
        assert len(got[True]) == 300 and got[True] == got[False]
        assert all(type(m) is client_fetch.RecordMessage for m in got[True])
        assert not any(isinstance(m, client_fetch.RecordMessage) for m in got[False])
        popped: dict[bool, list[PopMessage]] = {}
        for record_pull in (True, False):
            await n.http.put(f"/v1/groups/p-{record_pull}", json={"start": "earliest"})
            async with client.AsyncPopConsumer(
                "http://node",
                f"p-{record_pull}",
                "cc",
                transport=transport,
                record_pull=record_pull,
            ) as c:
                ms = await c.receive(max_messages=50)
                assert all((type(m) is client_fetch.RecordPopMessage) is record_pull for m in ms)
                assert all(r.ok for r in await c.ack(ms))
                popped[record_pull] = ms
        assert len(popped[True]) == 50  # (the handles differ: each group's epochs)
        m = popped[True][0]
        plain = m.plain() if isinstance(m, client_fetch.RecordPopMessage) else None
        assert type(plain) is PopMessage and plain == m and m == plain
        assert pickle.loads(pickle.dumps(m)) == plain and "RecordPopMessage(" in repr(m)
        assert m != popped[False][0]  # another group's handle
        assert [
            (m.msg_id, m.body, m.tags, m.properties, m.delivery_attempt) for m in popped[True]
        ] == [(m.msg_id, m.body, m.tags, m.properties, m.delivery_attempt) for m in popped[False]]


@pytest.mark.asyncio
async def test_a_pop_answer_keeps_the_records_its_messages_were_read_from(tmp_path: Path) -> None:
    """``RecordRefs`` keeps the checked entry a message's views were cut from (no second
    read): a real receive reads nothing again, ordinary and batch records alike; views
    of anything else make it read the record again, to the same bytes."""
    async with running_node(node_settings(tmp_path / "n0", batch_records=True)) as n:
        await produce(n, "rr", *[{"body": f"b{i}", "queue_id": 0} for i in range(5)])
        await produce(n, "rr", {"body": "alone", "queue_id": 1})
        await n.http.put("/v1/groups/p", json={"start": "earliest"})
        reads = n.broker.reads
        refs = group_records.RecordRefs(reads.read_record)
        got = await n.broker.pop.receive(refs, "p", "rr", max_messages=10)
        assert len(got) == 6 and refs.reread == 0 and len(refs.records) == 2
        for offset, kept in refs.records.items():
            record = reads.read_record(offset, len(kept))
            assert bytes(kept) == bytes(record)
            h = decode_head(record)
            copy = memoryview(bytes(record))  # views of another buffer: read again
            again = group_records.RecordRefs(reads.read_record)
            again(h, 0, offset, copy[h.body_at : h.body_at + 1], copy[h.props_at : h.props_at])
            assert again.reread == 1 and bytes(again.records[offset]) == bytes(record)


def test_the_blocking_client_reads_group_and_pop_answers_over_sockets(tmp_path: Path) -> None:
    """Over real sockets (uvicorn on 127.0.0.1, httpx): the blocking Consumer and
    PopConsumer ask for the record format by default and get what JSON gives."""
    with serving(node_settings(tmp_path / "n0")) as node:
        with client.Admin(node.url) as admin:
            admin.create_topic("bl", queues=2)
            for group in ("p-rec", "p-json"):
                admin.configure_group(group, start="earliest")
        with client.Producer(node.url) as p:
            p.send("bl", [client.Message(f"m{i}", tags="T", queue_id=i % 2) for i in range(6)])
        polled, popped = {}, {}
        for record_pull, name in ((True, "rec"), (False, "json")):
            with client.Consumer(node.url, f"g-{name}", "bl", record_pull=record_pull) as c:
                polled[name] = c.poll(max_messages=10)
            with client.PopConsumer(node.url, f"p-{name}", "bl", record_pull=record_pull) as pc:
                got = pc.receive(max_messages=10)
                assert all(r.ok for r in pc.ack(got))
                popped[name] = got
        assert polled["rec"] == polled["json"] and len(polled["rec"]) == 6
        assert type(polled["rec"][0]) is client_fetch.RecordMessage
        assert type(popped["rec"][0]) is client_fetch.RecordPopMessage
        assert sorted(m.body for m in popped["rec"]) == sorted(m.body for m in popped["json"])


def test_a_page_framed_for_another_queue_is_refused() -> None:
    """A frame names its page's queue: a record of another queue in it is refused."""
    group, pop = (seed[1:] for seed in _answer_seeds())
    assert client_fetch.decode_group(group)[0].queue_id == 1
    at = group_records.GROUP_HEADER.size
    wrong = group[:at] + group_records.PAGE_FRAME.pack(0, len(group) - at - 8)[:4] + group[at + 4 :]
    with pytest.raises(client_fetch.RecordPageError, match="not of queue 0"):
        client_fetch.decode_group(wrong)
    assert [m.queue_id for m in client_fetch.decode_received(pop)] == [1, 0, 0]
