"""A node that stops working exits non-zero (issue 17, "The node's own tasks"): the tick,
ready and dispatcher tasks are supervised, and when one dies (or the store fails) the
node stops serving and ``serve`` raises ``NodeFailedError``, which ``ledgermq broker``
turns into exit status 70, so a supervisor restarts it and recovery runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from broker.broker import Broker
from ledgermq.node import EXIT_NODE_FAILED, HttpSettings, NodeFailedError, serve
from tests.api.conftest import node_settings
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def test_serve_stops_and_raises_when_the_node_fails(tmp_path: Path) -> None:
    settings = node_settings(tmp_path / "n0")
    assert settings.advertised_url is not None
    port = int(settings.advertised_url.rsplit(":", 1)[1])
    broker = Broker(settings)
    task = asyncio.create_task(serve(settings, HttpSettings(port=port), broker=broker))
    try:
        async with httpx.AsyncClient(base_url=settings.advertised_url, timeout=5) as http:

            async def healthy() -> bool:
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.HTTPError:
                    return False

            for _ in range(500):  # bounded: 500 tries (a request or 20 ms each)
                if await healthy():
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the node never served")
            await until(lambda: broker.is_master, what="master")
            broker.server.fail("a test's own failure", RuntimeError("boom"))
        with pytest.raises(NodeFailedError, match="boom"):
            async with asyncio.timeout(30):
                await task
    finally:
        if not task.done():
            task.cancel()
    assert EXIT_NODE_FAILED == 70
