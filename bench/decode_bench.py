"""The Python client's decoding of a pull answer: JSON against record pages (issue 31).

Run from the repository root::

    python bench/decode_bench.py [--messages 1000] [--body-size 1024] [--repeat 15]

One page of ``--messages`` messages (random ASCII bodies of ``--body-size`` bytes, tags,
a key, a user property) in two layouts: batch records of 100 messages (``--batch``, the
node default), then one ordinary record each, whose properties carry a UNIQ_KEY of their
own. Each page is made by the node's own renderers from the same records: the JSON
pull's (``JSONMessages``, ``pull_json``) and the record page's (``api.fetch``). For each
it times, per message, the best of ``--repeat`` decodes of the page by the client:
``decode_page`` alone (records), then with every message's body and tags read, then with
every field read; JSON is ``orjson.loads`` and ``decode_message`` per message (every
field decoded at once) with the same reads. No network, no broker: the client's CPU
alone. Prints a table and one ``JSON:`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import string
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.fetch import encode_page
from api.json_messages import JSONMessages, pull_json
from broker.batch import encode_batch_record, set_queue_base
from broker.message import encode_message, set_physical_offset
from broker.msgid import msg_id_prefix
from broker.pages import RawPage
from broker.properties import encode_properties, inner_properties, message_properties
from broker.reads import PullResult, _Decoded
from consumequeue.queue import UNIT
from ledgermq.client.fetch import decode_page
from ledgermq.client.types import ReceivedMessage, decode_message

GROUP = "g0"
TOPIC = "bench"


def records(n: int, body_size: int, batch: int, rng: random.Random) -> list[bytearray]:
    """``n`` messages as records: batch records of ``batch`` messages, or (``batch`` 1)
    ordinary records with a UNIQ_KEY each; queue offsets from 0."""
    out: list[bytearray] = []
    for first in range(0, n, batch):
        msgs = [
            (
                "".join(rng.choices(string.ascii_letters, k=body_size)).encode(),
                f"T{i % 3}",
                f"k{i}",
            )
            for i in range(first, min(n, first + batch))
        ]
        if batch == 1:
            body, tags, key = msgs[0]
            props = message_properties({"p": "1"}, tags=tags, keys=[key], uniq_key=f"U{first}")
            out.append(
                encode_message(
                    topic=TOPIC, body=body, properties=props, queue_offset=first, born_timestamp=1
                )
            )
            continue
        inner = [
            (body, encode_properties(inner_properties({"p": "1"}, tags=tags, keys=[key])))
            for body, tags, key in msgs
        ]
        record = encode_batch_record(
            TOPIC, inner, session=None, timestamp=1, store_host=("127.0.0.1", 1)
        )
        set_queue_base(record, first)
        out.append(record)
    return out


def pages(recs: list[bytearray], n: int) -> tuple[bytes, bytes]:
    """(the JSON pull's answer, the record page) of the records, laid back to back."""
    log = bytearray()
    units, offsets = b"", []
    make = JSONMessages(GROUP, "utf-8")
    rendered = []
    for record in recs:
        set_physical_offset(record, len(log))
        decoded = _Decoded.of(memoryview(record))
        for i in range(decoded.count):
            q = decoded.head.queue_offset + i
            units += UNIT.pack(len(log), len(record), 0)
            offsets.append(q)
            rendered.append(decoded.make(q, make))
        log += record

    @contextlib.contextmanager
    def view(start: int, size: int) -> Iterator[memoryview]:
        with memoryview(log) as v:
            yield v[start : start + size]

    page = RawPage(units, view, segment_bytes=len(log) + 1, queue_offsets=offsets)
    args: dict[str, Any] = {"status": "FOUND", "next_offset": n, "min_offset": 0}
    content, _, _ = encode_page(page, max_offset=n, prefix=msg_id_prefix(GROUP), **args)
    answer = pull_json(PullResult("FOUND", rendered, n, 0, n))
    return answer, bytes(content)


FIELDS = tuple(ReceivedMessage.__dataclass_fields__)


def best_us(fn: Callable[[], int], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        k = fn()
        times.append((time.perf_counter() - t0) / k * 1e6)
    return round(min(times), 2)


def measure(answer: bytes, page: bytes, repeat: int) -> dict[str, float]:
    def json_messages() -> list[ReceivedMessage]:
        return [decode_message(m) for m in orjson.loads(answer)["messages"]]

    def record_messages() -> list[ReceivedMessage]:
        return decode_page(page).result.messages

    def touch(get: Callable[[], list[ReceivedMessage]], what: str) -> Callable[[], int]:
        def run() -> int:
            ms = get()
            if what == "body+tags":
                for m in ms:
                    _ = m.body, m.tags
            elif what == "every field":
                for m in ms:
                    _ = [getattr(m, f) for f in FIELDS]
            return len(ms)

        return run

    assert json_messages() == record_messages(), "the two pages disagree"
    out = {}
    for what in ("decode", "body+tags", "every field"):
        out[f"json {what}"] = best_us(touch(json_messages, what), repeat)
        out[f"records {what}"] = best_us(touch(record_messages, what), repeat)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=100, help="messages per batch record")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.messages < 1 or a.batch < 2 or a.repeat < 1:
        ap.error("want --messages >= 1, --batch >= 2, --repeat >= 1")
    rng = random.Random(a.seed)
    results: dict[str, Any] = {"settings": vars(a), "layouts": {}}
    for layout, batch in ((f"batch records of {a.batch}", a.batch), ("ordinary records", 1)):
        answer, page = pages(records(a.messages, a.body_size, batch, rng), a.messages)
        figures = measure(answer, page, a.repeat)
        figures["json bytes"], figures["records bytes"] = len(answer), len(page)
        results["layouts"][layout] = figures
    print(
        f"\nThe client's decoding of one pull answer of {a.messages:,} messages"
        f" ({a.body_size} B bodies), µs per message, best of {a.repeat}:"
    )
    print(f"  {'layout':<26}{'reads':<14}{'JSON':>8}{'records':>9}")
    for layout, f in results["layouts"].items():
        for what in ("decode", "body+tags", "every field"):
            print(f"  {layout:<26}{what:<14}{f[f'json {what}']:>8}{f[f'records {what}']:>9}")
        print(f"  {layout:<26}{'bytes':<14}{f['json bytes']:>8}{f['records bytes']:>9}")
    print("JSON:", json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
