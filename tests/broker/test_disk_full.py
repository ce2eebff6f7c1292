"""A full disk under one broker (issue 17): dispatch stalls and retries instead of dying,
writes are refused while it is stalled (or while less than the reserve is free), reads
go on, and everything acknowledged becomes readable once space returns, by itself.

Before: the dispatcher task died on the ENOSPC of a consume-queue roll, the node went on
acknowledging produces (its wait for dispatch just timed out), and none of them ever
reached a consume queue. The disk here is a real small tmpfs (``tests.smallfs``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from broker import errors
from broker.broker import Broker, NewMessage
from ledgermq.processes import free_ports
from tests.waiting import until

from ..smallfs import Ballast, MiB, free_bytes, small_fs
from .harness import SMALL_STORE, broker_settings

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def fs(tmp_path: Path) -> AsyncIterator[Path]:
    with small_fs(tmp_path / "fs", 8 * MiB) as path:
        yield path


async def _single(fs: Path, **overrides: object) -> Broker:
    port = free_ports(1)[0]
    settings = broker_settings(
        fs,
        "n0",
        {"n0": port},
        store=replace(SMALL_STORE, disk_full_ratio=1.0),  # the kernel says when it is full
        append_timeout_ms=2000,
        **overrides,
    )
    b = Broker(settings)
    await b.start()
    await until(lambda: b.is_master, what="master")
    return b


def _msgs(n: int, tag: str) -> list[NewMessage]:
    return [NewMessage(f"{tag}-{i}".encode() * 20, keys=[f"{tag}-{i}"]) for i in range(n)]


async def _all_bodies(b: Broker, topic: str) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    for _ in range(100):
        r = await b.reads.pull(b.reads.pulled_message, topic, 0, offset, max_messages=1000)
        out += [m.body for m in r.messages]
        if r.next_offset == offset:
            return out
        offset = r.next_offset
    raise AssertionError("pull did not end")


async def test_dispatch_stalls_on_a_full_disk_and_resumes_when_space_returns(fs: Path) -> None:
    b = await _single(fs, disk_reserve_bytes=0)  # no reserve: the stall path itself
    try:
        await b.topics.create("t", 1)
        first = _msgs(10, "a")
        await b.producer.produce("t", first)
        ballast = Ballast(fs)
        ballast.leave_free(0)
        # The commitlog's segment has its blocks already: these commit. The consume
        # queue rolls every 64 units (harness settings) and finds no space: stalled.
        second = _msgs(100, "b")
        results = await b.producer.produce("t", second)
        assert [r.queue_offset for r in results] == list(range(10, 110))
        await until(lambda: b.dispatcher.stall is not None, what="dispatch stalled")
        assert b.status().dispatch_stall is not None
        with pytest.raises(errors.DiskFullError, match="dispatch is stalled"):
            await b.producer.produce("t", _msgs(1, "c"))
        readable = await _all_bodies(b, "t")  # reads go on, up to where dispatch is
        assert readable == [m.body for m in (first + second)][: len(readable)]
        assert len(readable) < len(first) + len(second)
        assert b.failed is None and not any(t.done() for t in b._tasks)
        ballast.remove()
        await until(lambda: b.dispatcher.stall is None, timeout_s=20, what="dispatch resumed")
        third = _msgs(5, "d")
        await b.producer.produce("t", third)
        assert await _all_bodies(b, "t") == [m.body for m in first + second + third]
    finally:
        await b.stop()


async def test_writes_are_refused_under_the_disk_reserve_and_resume_above_it(fs: Path) -> None:
    b = await _single(fs, disk_reserve_bytes=2 * MiB, disk_check_interval_ms=50)
    try:
        await b.topics.create("t", 1)
        await b.producer.produce("t", _msgs(10, "a"))
        ballast = Ballast(fs)
        ballast.leave_free(1 * MiB)
        await until(lambda: b.gate._disk_free() < 2 * MiB, what="the broker sees the disk")
        with pytest.raises(errors.DiskFullError, match="reserve") as info:
            await b.producer.produce("t", _msgs(1, "b"))
        assert info.value.http_status == 507
        assert info.value.fields["retry_after_ms"] > 0
        with pytest.raises(errors.DiskFullError):
            await b.topics.create("u", 1)  # metadata writes too
        assert len(await _all_bodies(b, "t")) == 10
        ballast.remove()
        await until(lambda: free_bytes(fs) > 2 * MiB, what="space back")
        await until(lambda: b.gate._disk_free() > 2 * MiB, what="the broker sees it")
        await b.producer.produce("t", _msgs(3, "c"))
        assert len(await _all_bodies(b, "t")) == 13
    finally:
        await b.stop()
