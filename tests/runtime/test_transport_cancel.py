"""A PeerLink stops when closed even if the close races with a failing connect.

On Python 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives while its inner
future completes: the link then caught the connect's OSError, backed off and reconnected
forever, and ``Transport.close`` (so ``Broker.stop``) hung. Seen as a 300 s timeout of
tests/broker/test_failover.py::test_a_slave_without_a_known_leader_says_no_master."""

from __future__ import annotations

import asyncio

import pytest

from dledger.runtime import transport
from dledger.runtime.transport import PeerLink, TransportSettings

pytestmark = pytest.mark.asyncio


async def test_close_racing_a_refused_connect_still_stops_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = PeerLink("n1", "127.0.0.1:9", TransportSettings(reconnect_min_ms=1))
    attempts = 0

    async def refused_while_being_cancelled(*_args: object, **_kw: object) -> object:
        # The close arrives in the very step in which the connect fails.
        nonlocal attempts
        attempts += 1
        assert link._task is not None
        link._task.cancel()
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(transport.asyncio, "open_connection", refused_while_being_cancelled)
    link.start()
    async with asyncio.timeout(5):
        await asyncio.gather(link._task, return_exceptions=True)
    assert link._task.cancelled() and attempts == 1
