"""The cost of checking every message read (issue 17): a consumer's read of one message,
unchecked as before against checked as now, on a ``FileStore`` in the page cache.

Run from the repository root::

    python bench/read_crc_bench.py [--sizes 256,1024,16384,262144] [--mib 64] [--repeat 5]

For each body size it appends real message records (``encode_message``) until about
``--mib`` MiB of log (at least 2,000 messages), then times reading every one of them, in
log order, two ways:

- ``unchecked``: ``FileStore.read(commitlog_offset, size)`` (a slice of the mapping) and
  ``decode_message(..., verify_crc=False)``: the read path before;
- ``checked``: ``FileStore.read_entry_at(pos, size)`` (the entry header, its index unit,
  the body CRC over the whole record) and the same decode: the read path now.

and, to show where the time goes, the two reads alone (no decode). The best of
``--repeat`` passes counts. It prints µs per message, MB/s of records and the added cost
in µs and in percent.

Then (unless ``--no-pull``) the same on the consumer's whole path, one node in this
process: 2,000 messages of 1 KiB read 32 per request through ``Broker.pull`` and through
the HTTP app (httpx's ASGI transport, JSON included), checked as now and with the
broker's record read swapped for the unchecked one (``DLedgerServer.read``, as before).
Last, one ``JSON:`` line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.message import decode_message, encode_message
from dledger.store import BODY_OFFSET, FileStore, StoreSettings

MiB = 1 << 20


def build(directory: Path, body_bytes: int, total_bytes: int) -> tuple[FileStore, list[Any]]:
    store = FileStore(directory, StoreSettings(data_file_size=256 * MiB, flush="async"))
    n = max(2000, total_bytes // (body_bytes + 200))
    body = os.urandom(body_bytes)
    records = [
        bytes(encode_message(topic="bench", body=body, born_timestamp=i, store_timestamp=i))
        for i in range(min(n, 256))
    ]
    metas = []
    for k in range(0, n, 256):
        metas += store.append_as_leader(1, records[: min(256, n - k)])
    store.update_committed(metas[-1].index)
    return store, [(m.pos, m.size - BODY_OFFSET) for m in metas]


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(body_bytes: int, total_bytes: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="read-crc-") as d:
        store, where = build(Path(d), body_bytes, total_bytes)
        try:
            read, read_entry = store.read, store.read_entry_at

            def unchecked_read() -> None:
                for pos, size in where:
                    read(pos + BODY_OFFSET, size)

            def checked_read() -> None:
                for pos, size in where:
                    read_entry(pos, size)

            def unchecked() -> None:
                for pos, size in where:
                    decode_message(read(pos + BODY_OFFSET, size), verify_crc=False)

            def checked() -> None:
                for pos, size in where:
                    raw = memoryview(read_entry(pos, size))[BODY_OFFSET:]
                    decode_message(raw, verify_crc=False)

            checked()  # warm the page cache and the code paths once
            times = {
                name: best_of(repeat, fn) / len(where)
                for name, fn in (
                    ("read_unchecked", unchecked_read),
                    ("read_checked", checked_read),
                    ("unchecked", unchecked),
                    ("checked", checked),
                )
            }
        finally:
            store.close()
    record_bytes = where[0][1]
    return {
        "body_bytes": body_bytes,
        "record_bytes": record_bytes,
        "messages": len(where),
        **{f"{k}_us": v * 1e6 for k, v in times.items()},
        "added_us": (times["checked"] - times["unchecked"]) * 1e6,
        "added_pct": 100 * (times["checked"] / times["unchecked"] - 1),
        "checked_mb_s": record_bytes / times["checked"] / 1e6,
        "unchecked_mb_s": record_bytes / times["unchecked"] / 1e6,
    }


async def measure_pull(repeat: int) -> dict[str, float]:
    import httpx  # noqa: PLC0415  # only this part needs the broker and the app

    from api.app import create_app  # noqa: PLC0415
    from broker.broker import Broker, NewMessage  # noqa: PLC0415
    from broker.settings import BrokerSettings  # noqa: PLC0415

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="read-crc-pull-") as d:
        settings = BrokerSettings(data_dir=Path(d), peers="n0-127.0.0.1:0")
        broker = Broker(settings)
        await broker.start()
        try:
            while not broker.is_master:
                await asyncio.sleep(0.01)
            for _ in range(20):
                batch = [NewMessage(body=os.urandom(1024), queue_id=0) for _ in range(100)]
                await broker.producer.produce("bench", batch)
            app = create_app(settings, broker)
            checked = broker.commitlog.read_record
            server = broker.server

            def unchecked(commitlog_offset: int, size: int | None = None) -> memoryview:
                assert size is not None
                return memoryview(server.read(commitlog_offset, size))

            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://bench"
            ) as http:
                for mode, record in (("checked", checked), ("unchecked", unchecked)):
                    broker.commitlog.read_record = record  # type: ignore[method-assign]
                    for via in ("broker", "http"):
                        best = float("inf")
                        for _ in range(repeat):
                            t0, n = time.perf_counter(), 0
                            for off in range(0, 2000, 32):
                                if via == "broker":
                                    r = await broker.reads.pull(
                                        broker.reads.pulled_message,
                                        "bench",
                                        0,
                                        off,
                                        max_messages=32,
                                    )
                                    n += len(r.messages)
                                else:
                                    q = {"offset": off, "max_messages": 32}
                                    a = await http.get(
                                        "/v1/topics/bench/queues/0/messages", params=q
                                    )
                                    n += len(a.json()["messages"])
                            best = min(best, (time.perf_counter() - t0) / n)
                        out[f"{via}_{mode}_us"] = best * 1e6
        finally:
            await broker.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024,16384,262144")
    ap.add_argument("--mib", type=int, default=64, help="log built per size")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-pull", action="store_true", help="skip the consumer-path figures")
    args = ap.parse_args()
    rows = [measure(int(s), args.mib * MiB, args.repeat) for s in args.sizes.split(",")]
    head = (
        f"{'body B':>8} {'msgs':>7} {'read µs':>9} {'+check µs':>10}"
        f" {'read+decode µs':>15} {'+check µs':>10} {'added µs':>9} {'added %':>8}"
        f" {'MB/s before':>12} {'MB/s now':>9}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['body_bytes']:>8} {r['messages']:>7} {r['read_unchecked_us']:>9.2f}"
            f" {r['read_checked_us']:>10.2f} {r['unchecked_us']:>15.2f} {r['checked_us']:>10.2f}"
            f" {r['added_us']:>9.2f} {r['added_pct']:>7.0f}% {r['unchecked_mb_s']:>12.0f}"
            f" {r['checked_mb_s']:>9.0f}"
        )
    pull: dict[str, float] = {}
    if not args.no_pull:
        pull = asyncio.run(measure_pull(args.repeat))
        print("\npull of 32 x 1 KiB per request, µs per message:")
        for via in ("broker", "http"):
            before, now = pull[f"{via}_unchecked_us"], pull[f"{via}_checked_us"]
            print(
                f"  {'Broker.pull' if via == 'broker' else 'HTTP GET':12} unchecked {before:6.2f}"
                f"  checked {now:6.2f}  added {now - before:5.2f} ({100 * (now / before - 1):.0f}%)"
            )
    print("JSON: " + json.dumps({"rows": rows, "pull": pull}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
