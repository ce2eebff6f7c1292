"""Which delay messages are done: replicated timer state, a pure function of the
committed entries in log order (``TimerApplier``, ``broker/timers/applier.py``).

A delay message is stored first as a record of the system topic ``TIMER_TOPIC`` (one
queue, not addressable by any client); its queue offset there is its *timer*. The master
delivers it at its time by appending a copy into its topic that carries the timer
(``TIMER_ORIGIN``): the copy and the end of the timer are one entry, so a failover can
neither lose a delivery nor make a second one. A cancel (``timer.cancel``) ends a timer
without a copy.

What is kept is small whatever the number of pending timers: ``end`` (timers below were
scheduled), ``floor`` (every timer below is done) and two bitmaps from ``base`` (a
multiple of 8 at or below ``floor``): done, and of those cancelled. A million pending
timers cost 250 KB here; their times and records stay in the log and the timer topic's
consume queue (whose tag code is the delivery time), never in memory. Below ``base`` the
last ``RECALLS_KEPT`` cancelled timers are kept (``recalled``), so that a recall asked
again answers the same once the bitmaps have moved on; below ``forgotten`` how a timer
ended is not known.

Invariants:
- a timer is done at most once: delivered or cancelled, never both, never again;
- nothing at or past ``end`` is done (a copy or cancel of a timer not scheduled is
  ignored, alike on every replica);
- ``floor`` only grows; applying never raises on what the log holds;
- ``recalled`` holds, ascending, exactly the cancelled timers in ``[forgotten, base)``.
"""

from __future__ import annotations

import base64
import bisect
import itertools
from collections.abc import Mapping
from typing import Any

from ..jsonint import json_int

STATS = ("scheduled", "delivered", "cancelled", "dropped")
RECALLS_KEPT = 4096  # cancelled timers below ``base`` remembered (``was_cancelled``)


class TimerState:
    def __init__(self) -> None:
        self.end = 0
        self.base = 0
        self._done = bytearray()
        self._cancelled = bytearray()
        self.done_count = 0  # done timers at or above base
        self.stats = dict.fromkeys(STATS, 0)
        self.recalled: list[int] = []  # the cancelled timers in [forgotten, base)
        self.forgotten = 0

    # ---- reading ----------------------------------------------------------------------

    @property
    def floor(self) -> int:
        """The first timer not done (``end`` when every timer is)."""
        first = self._done[0] if self._done else 0
        ones = 0
        while ones < 8 and first >> ones & 1:
            ones += 1
        return min(self.end, self.base + ones)

    @property
    def pending(self) -> int:
        return self.end - self.base - self.done_count

    def is_done(self, timer: int) -> bool:
        if timer < self.base:
            return True
        i = timer - self.base
        return i >> 3 < len(self._done) and bool(self._done[i >> 3] >> (i & 7) & 1)

    def was_cancelled(self, timer: int) -> bool | None:
        """Whether a done timer was cancelled (False: delivered or dropped); None when
        that is forgotten (below ``forgotten``: more than ``RECALLS_KEPT`` cancels ago)."""
        if timer < self.base:
            if timer < self.forgotten:
                return None
            k = bisect.bisect_left(self.recalled, timer)
            return k < len(self.recalled) and self.recalled[k] == timer
        i = timer - self.base
        return i >> 3 < len(self._cancelled) and bool(self._cancelled[i >> 3] >> (i & 7) & 1)

    # ---- applying -------------------------------------------------------------------------

    def scheduled(self, timer: int) -> None:
        """The timer's record was applied (timers come in offset order)."""
        if timer >= self.end:
            self.end = timer + 1
            self.stats["scheduled"] += 1

    def finish(self, timer: int, how: str) -> bool:
        """End the timer (``how``: delivered, cancelled or dropped, its topic gone);
        False when it is not pending."""
        if not 0 <= timer < self.end or self.is_done(timer):
            return False
        i = timer - self.base
        need = (i >> 3) + 1
        if len(self._done) < need:
            self._done.extend(bytes(need - len(self._done)))
            self._cancelled.extend(bytes(need - len(self._cancelled)))
        self._done[i >> 3] |= 1 << (i & 7)
        if how == "cancelled":
            self._cancelled[i >> 3] |= 1 << (i & 7)
        self.done_count += 1
        self.stats[how] += 1
        self._trim()
        return True

    def _trim(self) -> None:
        """Drop the leading bytes of timers all done."""
        full = 0
        while full < len(self._done) and self._done[full] == 0xFF:
            full += 1
        if full:
            for j, bits in enumerate(self._cancelled[:full]):
                if bits:
                    self.recalled += [self.base + 8 * j + b for b in range(8) if bits >> b & 1]
            del self._done[:full]
            del self._cancelled[:full]
            self.base += 8 * full
            self.done_count -= 8 * full
            if len(self.recalled) > RECALLS_KEPT:
                cut = len(self.recalled) - RECALLS_KEPT
                self.forgotten = self.recalled[cut - 1] + 1
                del self.recalled[:cut]

    # ---- the snapshot part ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "end": self.end,
            "base": self.base,
            "done": base64.b64encode(bytes(self._done)).decode("ascii"),
            "cancelled": base64.b64encode(bytes(self._cancelled)).decode("ascii"),
            "stats": dict(self.stats),
            "recalled": list(self.recalled),
            "forgotten": self.forgotten,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TimerState:
        """``ValueError``, ``TypeError``, ``KeyError`` on a malformed part. A part written
        before ``recalled`` has forgotten every timer below ``base``."""
        s = cls()
        s.end = json_int(d["end"], "end")
        s.base = json_int(d["base"], "base")
        s._done = bytearray(base64.b64decode(d["done"], validate=True))
        s._cancelled = bytearray(base64.b64decode(d["cancelled"], validate=True))
        if s.base % 8 or len(s._cancelled) != len(s._done) or s.base > s.end:
            raise ValueError("timer bitmaps out of shape")
        s.done_count = sum(bin(b).count("1") for b in s._done)
        s.stats = {k: json_int(d["stats"].get(k, 0), k) for k in STATS}
        s.recalled = [json_int(t, "recalled") for t in d.get("recalled", [])]
        s.forgotten = json_int(d.get("forgotten", s.base), "forgotten")
        if not (
            s.forgotten <= s.base
            and all(s.forgotten <= t < s.base for t in s.recalled)
            and all(a < b for a, b in itertools.pairwise(s.recalled))
        ):
            raise ValueError("recalled timers out of order")
        return s
