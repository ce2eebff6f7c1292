"""Every JSON answer of messages is rendered by one renderer (``api.json_messages``:
``JSONMessages`` makes each message straight from its record): the pull, the group pull
and the lookups by key and by message id must answer, byte for byte, what
``orjson.dumps`` makes of docs/http.md's objects of the broker's ``PulledMessage``s,
for single and batch records, both body encodings, and bodies that are not text. The
produce answer is rendered into fragments too."""

from __future__ import annotations

import base64
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.json_messages import JSONMessages, pull_json
from api.routes.messages import produce_answer
from broker.broker import Broker, PulledMessage
from broker.produce import NewMessage, ProduceResult
from tests.api.conftest import node_settings, running_node
from tests.broker.harness import BrokerCluster

_BODIES = [
    b"",
    b"plain",
    "caf\u00e9 \u2603 \U0001f600".encode(),
    b'quote " backslash \\ slash / tab \t newline \n nul \x00 del \x7f',
    b"\xff\xfe not utf-8 \x80",
    b"\xed\xa0\x80",  # an encoded surrogate: not valid UTF-8
    bytes(range(256)),
]


def documented(m: PulledMessage, encoding: str) -> dict[str, Any]:
    """A message as docs/http.md shows it; ``utf-8`` falls back to base64 per message."""
    body: str | None = None
    enc = "utf-8"
    if encoding == "utf-8":
        try:
            body = m.body.decode("utf-8")
        except UnicodeDecodeError:
            body = None
    if body is None:
        body, enc = base64.b64encode(m.body).decode("ascii"), "base64"
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.msg_id,
        "commitlog_offset": m.commitlog_offset,
        "body": body,
        "encoding": enc,
        "key": m.keys[0] if m.keys else None,
        "keys": m.keys,
        "tags": m.tags,
        "properties": m.properties,
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
    }


def _messages(rng: random.Random, n: int) -> list[NewMessage]:
    out = []
    for i in range(n):
        body = rng.choice(_BODIES) if i % 3 else rng.randbytes(rng.randrange(0, 64))
        out.append(
            NewMessage(
                body,
                tags=rng.choice([None, "A", "B", 'q"uote']),
                keys=rng.choice([[], [f"k{i}"], [f"k{i}", "shared", "\u00e9"]]),
                properties=rng.choice([{}, {"a": "b"}, {"x": str(i), "\u2603": 'v"\\'}]),
            )
        )
    return out


async def _fill(b: Broker) -> None:
    await b.topics.create("t", 2)
    rng = random.Random(7)
    for seq in range(6):  # a session's messages carry session properties
        await b.producer.produce("t", _messages(rng, rng.randrange(1, 40)))
        await b.producer.produce("t", _messages(rng, 3), producer_id="p1", sequence=seq)


@pytest.mark.asyncio
@pytest.mark.parametrize("batch_records", [True, False])
async def test_the_json_pull_is_the_documented_object_of_every_message(
    tmp_path: Path, batch_records: bool
) -> None:
    c = BrokerCluster(tmp_path, n=1, batch_records=batch_records)
    await c.start_all()
    try:
        b = await c.master()
        await _fill(b)
        for qid in (0, 1):
            for encoding in ("utf-8", "base64"):
                for tags in (None, "A||B"):
                    offset, seen = 0, 0
                    for _ in range(100):  # bounded: the queue holds fewer than 300
                        want = await b.reads.pull(
                            b.reads.pulled_message, "t", qid, offset, max_messages=7, tags=tags
                        )
                        make = JSONMessages(b.settings.group, encoding)
                        got = await b.reads.pull(make, "t", qid, offset, max_messages=7, tags=tags)
                        assert pull_json(got) == orjson.dumps(
                            {
                                "status": want.status,
                                "messages": [documented(m, encoding) for m in want.messages],
                                "next_offset": want.next_offset,
                                "min_offset": want.min_offset,
                                "max_offset": want.max_offset,
                            }
                        )
                        assert make.body_bytes == sum(len(m.body) for m in want.messages)
                        seen += len(want.messages)
                        if want.status != "FOUND" or want.next_offset == want.max_offset:
                            break
                        offset = want.next_offset
                    assert seen > 0
    finally:
        await c.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("batch_records", [True, False])
async def test_group_pulls_and_lookups_answer_the_documented_objects(
    tmp_path: Path, batch_records: bool
) -> None:
    """Over HTTP: each answer's bytes are ``orjson.dumps`` of docs/http.md's objects of
    what the broker's ``PulledMessage`` reads answer."""
    settings = replace(node_settings(tmp_path / "n0"), batch_records=batch_records)
    async with running_node(settings) as node:
        b, http = node.broker, node.http
        await _fill(b)
        for encoding in ("utf-8", "base64"):
            want = await b.groups.group_pull(b.reads.pulled_message, "g", "t", max_messages=100)
            r = await http.post(
                "/v1/groups/g/pull", json={"topic": "t", "max_messages": 100, "encoding": encoding}
            )
            assert len(want.messages) == 100
            assert r.content == orjson.dumps(
                {
                    "messages": [documented(m, encoding) for m in want.messages],
                    "next_offsets": {str(q): o for q, o in sorted(want.next_offsets.items())},
                }
            )
            uniq = next((m.uniq_key for m in want.messages if m.uniq_key), "no-uniq-key")
            for key in ("shared", "k1", "\u00e9", "missing", uniq):
                found = b.reads.query_by_key(b.reads.pulled_message, "t", key, 50)
                r = await http.get(
                    "/v1/topics/t/messages", params={"key": key, "max": 50, "encoding": encoding}
                )
                assert r.content == orjson.dumps(
                    {"messages": [documented(m, encoding) for m in found]}
                )
            for m in want.messages[::7]:
                r = await http.get(f"/v1/messages/{m.msg_id}", params={"encoding": encoding})
                assert r.content == orjson.dumps(
                    documented(b.reads.get_message(b.reads.pulled_message, m.msg_id), encoding)
                )
                assert r.headers["content-type"] == "application/json"
        text = (await http.get("/metrics")).text
        assert 'ledgermq_pulled_messages_total{topic="t"}' in text


def test_the_produce_answer_is_every_result_in_order() -> None:
    results = [
        ProduceResult("67300000000000000000", 0, 0, 0),
        ProduceResult("6730000000000000ABCD", 65_535, 2**62, 2**63 - 1),
        ProduceResult("67300000000000000001", 7, 12, 3),
    ]
    assert orjson.loads(produce_answer(results).body) == {
        "results": [
            {
                "msg_id": r.msg_id,
                "queue_id": r.queue_id,
                "queue_offset": r.queue_offset,
                "commitlog_offset": r.commitlog_offset,
            }
            for r in results
        ]
    }
    assert orjson.loads(produce_answer([]).body) == {"results": []}
