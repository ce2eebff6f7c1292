"""The release loop of delay messages (``Timers.run``, broker/timers/service.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.metadata import MetadataState
from broker.settings import BrokerSettings
from broker.timers.applier import TimerApplier
from broker.timers.service import Timers

pytestmark = pytest.mark.asyncio


async def test_the_loop_ends_when_cancelled_as_it_is_woken() -> None:
    """``Broker.stop`` cancels the loop; cancelled as its wake was set (a recall had just
    set it), ``asyncio.wait_for`` returned the wake instead of raising, the loop went on,
    and the stop waited for it for ever (seen as a node that did not stop after a
    recall, in tests/api/test_delay.py)."""
    meta = MetadataState()
    nothing = cast(Any, None)
    timers = Timers(
        settings=BrokerSettings(),
        gate=cast(Any, SimpleNamespace(is_master=False)),  # a slave: every turn waits
        topics=nothing,
        metalog=nothing,
        meta=meta,
        reads=nothing,
        cq=nothing,
        producer=nothing,
        dispatch=nothing,
        applier=TimerApplier(meta),
        clock=lambda: 0,
    )
    loop = asyncio.create_task(timers.run())
    for _ in range(3):
        await asyncio.sleep(0)  # (the loop waits on its wake)
    timers._wake.set()
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop, 5)
