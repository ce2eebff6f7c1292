"""Waiting for a condition in tests: one bounded poll, sync and async.

Tests hold on a slow, noisy machine by waiting for conditions, never for fixed times;
every wait has a deadline and says what it waited for when it runs out. ``wait_until``
and ``until`` return the condition's (truthy) value, so a wait can also fetch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.01  # between two looks at the condition


def wait_until(
    cond: Callable[[], T],
    timeout_s: float = 20.0,
    what: str = "condition",
    *,
    poll_s: float = POLL_S,
) -> T:
    """Poll ``cond`` (in this thread) until it is truthy; its value. AssertionError
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s} s"
        time.sleep(poll_s)


async def until(
    cond: Callable[[], T],
    timeout_s: float = 15.0,
    what: str = "condition",
    *,
    poll_s: float = POLL_S,
) -> T:
    """``wait_until`` on the event loop: other tasks run between the looks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert loop.time() < deadline, f"{what} not met within {timeout_s} s"
        await asyncio.sleep(poll_s)
