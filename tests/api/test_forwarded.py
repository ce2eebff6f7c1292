"""Forwarded headers (issue 32): a client behind no proxy cannot pass for another one.
uvicorn believes ``X-Forwarded-For`` from 127.0.0.1 by default, so the per-client
long-poll limit could be dodged through any local proxy (or by the header alone from
the node's own host); a node believes it only from ``--forwarded-allow-ips``."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.routes.common import LongPolls
from ledgermq.node import HttpSettings, http_config
from tests.api.conftest import TEST_LIMITS, free_ports, node_settings, running_node
from tests.waiting import until

pytestmark = pytest.mark.asyncio

PULL = "/v1/topics/fw/queues/0/messages"


async def _second_poll_status(tmp_path: Path, forwarded_allow_ips: str) -> int:
    """With one long poll allowed per client, park one as 10.0.0.1, then ask for
    another as 10.0.0.2 (each named only by X-Forwarded-For), over a real socket to
    uvicorn configured as a node configures it: the second's status."""
    settings = node_settings(tmp_path, limits=replace(TEST_LIMITS, max_long_polls_per_client=1))
    (port,) = free_ports(1)
    http = HttpSettings(port=port, forwarded_allow_ips=forwarded_allow_ips)
    async with running_node(settings) as node:
        server = uvicorn.Server(http_config(node.app, http))
        serving = asyncio.create_task(server.serve())
        first: asyncio.Task[httpx.Response] | None = None
        try:
            await until(lambda: server.started, what="uvicorn serves", timeout_s=30)
            r = await node.http.post("/v1/topics", json={"name": "fw", "queues": 1})
            assert r.status_code in (200, 201), r.text
            polls: LongPolls = node.app.state.long_polls
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
                first = asyncio.create_task(
                    c.get(
                        PULL,
                        params={"offset": 0, "wait_ms": TEST_LIMITS.max_wait_ms},
                        headers={"x-forwarded-for": "10.0.0.1"},
                    )
                )
                await until(lambda: polls.total == 1, what="the first long poll is parked")
                second = await c.get(
                    PULL,
                    params={"offset": 0, "wait_ms": 50},
                    headers={"x-forwarded-for": "10.0.0.2"},
                )
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first
                return second.status_code
        finally:
            server.should_exit = server.force_exit = True
            async with asyncio.timeout(30):
                await serving


async def test_forwarded_for_is_not_believed_by_default(tmp_path: Path) -> None:
    assert await _second_poll_status(tmp_path, "") == 429  # one client: the socket's address


async def test_forwarded_for_is_believed_from_a_configured_proxy(tmp_path: Path) -> None:
    assert await _second_poll_status(tmp_path, "127.0.0.1") == 200  # two clients
