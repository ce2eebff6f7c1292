"""The JSON pull renders each message straight from its record (``JSONMessages``): the
answer must be exactly what ``message_out`` makes of the broker's ``PulledMessage``s, for
single and batch records, both body encodings, and bodies that are not text. The
produce answer is rendered into fragments too."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from api.routes.messages import JSONMessages, message_out, produce_answer, pull_json
from broker.produce import NewMessage, ProduceResult
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


@pytest.mark.asyncio
@pytest.mark.parametrize("batch_records", [True, False])
async def test_the_json_pull_is_message_out_of_every_message(
    tmp_path: Path, batch_records: bool
) -> None:
    c = BrokerCluster(tmp_path, n=1, batch_records=batch_records)
    await c.start_all()
    try:
        b = await c.master()
        await b.topics.create("t", 2)
        rng = random.Random(7)
        for seq in range(6):  # a session's messages carry session properties
            await b.produce("t", _messages(rng, rng.randrange(1, 40)))
            await b.produce("t", _messages(rng, 3), producer_id="p1", sequence=seq)
        for qid in (0, 1):
            for encoding in ("utf-8", "base64"):
                for tags in (None, "A||B"):
                    offset, seen = 0, 0
                    for _ in range(100):  # bounded: the queue holds fewer than 300
                        want = await b.pull("t", qid, offset, max_messages=7, tags=tags)
                        make = JSONMessages(b.settings.group, encoding)
                        got = await b.pull_as(make, "t", qid, offset, max_messages=7, tags=tags)
                        doc = orjson.loads(pull_json(got))
                        assert doc == {
                            "status": want.status,
                            "messages": [message_out(m, encoding) for m in want.messages],
                            "next_offset": want.next_offset,
                            "min_offset": want.min_offset,
                            "max_offset": want.max_offset,
                        }
                        assert make.body_bytes == sum(len(m.body) for m in want.messages)
                        seen += len(want.messages)
                        if want.status != "FOUND" or want.next_offset == want.max_offset:
                            break
                        offset = want.next_offset
                    assert seen > 0
    finally:
        await c.close()


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
