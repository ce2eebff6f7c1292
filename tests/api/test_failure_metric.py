"""``ledgermq_last_failure_timestamp_seconds`` (issue 32, the LedgerMQNodeFailed alert): a
node that fails exits at once, and its ``ledgermq_node_failed`` 1 with it, mostly before
any scrape saw it. The failing node writes when it failed into its data directory, and
the process a supervisor starts next exports it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from api.metrics import NodeMetrics
from broker.broker import FAILURE_FILE, Broker
from tests.waiting import until

from .conftest import node_settings

pytestmark = pytest.mark.asyncio


async def gauges(broker: Broker) -> dict[str, float]:
    text = (await NodeMetrics(broker, cache_s=0).render()).decode()
    found = re.findall(
        r"^(ledgermq_node_failed|ledgermq_last_failure_timestamp_seconds) (\S+)$",
        text,
        re.MULTILINE,
    )
    return {name: float(value) for name, value in found}


async def test_the_next_process_on_the_data_directory_says_when_the_node_failed(
    tmp_path: Path,
) -> None:
    settings = node_settings(tmp_path / "n0")
    broker = Broker(settings)
    await broker.start()
    try:
        await until(lambda: broker.is_master, what="master")
        assert await gauges(broker) == {
            "ledgermq_node_failed": 0.0,
            "ledgermq_last_failure_timestamp_seconds": 0.0,
        }
        before = time.time()
        broker.server.fail("a test's own failure", RuntimeError("boom"))
        shown = await gauges(broker)
        assert shown["ledgermq_node_failed"] == 1.0
        assert before <= shown["ledgermq_last_failure_timestamp_seconds"] <= time.time()
    finally:
        await broker.stop()
    assert "boom" in (settings.data_dir / FAILURE_FILE).read_text(encoding="utf-8")
    again = Broker(settings)  # the restart
    await again.start()
    try:
        await until(lambda: again.is_master, what="master again")
        after = await gauges(again)
        assert after["ledgermq_node_failed"] == 0.0
        assert after["ledgermq_last_failure_timestamp_seconds"] == pytest.approx(
            shown["ledgermq_last_failure_timestamp_seconds"], abs=0.001
        )
    finally:
        await again.stop()
