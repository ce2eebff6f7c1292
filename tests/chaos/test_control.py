"""The chaos run's supervisor (``tests/chaos/control.py``): a phase over its bound is
left and halts the run, a signal does the same within a look, a phase's error reaches
the waiter, and an awaited thread is left by a timeout without the loop waiting for it
at its close. No root needed: the phases here are threads that block on an event the
test releases at its end."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from .control import POLL_S, HaltedError, Supervisor, in_thread

BLOCK_S = 30.0  # a blocked phase's own bound: the test releases it long before


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the test's end: every blocked thread ends, and is waited for (bounded)."""
    gate = threading.Event()
    before = set(threading.enumerate())
    yield gate
    gate.set()
    for t in set(threading.enumerate()) - before:
        t.join(timeout=10)
        assert not t.is_alive(), t


def test_a_phase_over_its_bound_is_left_and_halts_the_run(release: threading.Event) -> None:
    sup = Supervisor(say=lambda _s: None)
    halts: list[str] = []
    t0 = time.monotonic()
    with sup.on_halt(lambda: halts.append("called")), pytest.raises(HaltedError):
        sup.run("stuck phase", lambda: release.wait(BLOCK_S), bound_s=0.3, settle_s=0.1)
    assert time.monotonic() - t0 < 0.3 + 0.1 + 10 * POLL_S + 2.0  # bound, settle, looks
    assert sup.reason == "the stuck phase did not end within 0.3 s"
    assert halts == ["called"] and sup.halted.is_set() and sup.signal is None
    with pytest.raises(HaltedError):  # a halted run starts no phase
        sup.run("next", lambda: None, bound_s=10)


def test_a_signal_halts_the_phase_under_way_and_the_old_handlers_come_back(
    release: threading.Event,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    sup = Supervisor(say=lambda _s: None)

    def phase() -> None:  # the signal comes while the phase blocks
        os.kill(os.getpid(), signal.SIGTERM)
        release.wait(BLOCK_S)

    t0 = time.monotonic()
    with sup.catching_signals(), pytest.raises(HaltedError):
        sup.run("load", phase, bound_s=BLOCK_S, settle_s=0.1)
    assert time.monotonic() - t0 < 5.0, "stopped within a look and the settle, not the bound"
    assert sup.signal == signal.SIGTERM
    assert sup.reason == "SIGTERM during the load"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_phase_returns_its_value_and_its_error_reaches_the_waiter() -> None:
    sup = Supervisor(say=lambda _s: None)
    assert sup.run("sum", lambda: 1 + 2, bound_s=10) == 3

    def broken() -> None:
        raise ValueError("a bug in a phase")

    with pytest.raises(ValueError, match="a bug in a phase"):
        sup.run("broken", broken, bound_s=10)
    assert not sup.halted.is_set()


def test_an_awaited_thread_is_left_by_a_timeout_and_the_loop_closes_without_it(
    release: threading.Event,
) -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(in_thread(lambda: release.wait(BLOCK_S), "blocked"), 0.2)
        assert await in_thread(lambda: "done", "quick") == "done"

    t0 = time.monotonic()
    asyncio.run(main())  # asyncio.to_thread's executor would hold the close for BLOCK_S
    assert time.monotonic() - t0 < 5.0
