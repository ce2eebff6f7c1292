"""What clients saw of one message of one POP group, and when it may go out again: the
part of the POP rules (docs/consuming.md) that the simulation's checker
(``tests/sim/pop_sim.py``, against the committed log) and the chaos checker
(``tests/chaos/pop_checker.py``, from client histories alone) share.

A message's deliveries and new invisible times are ordered by their handle's epoch (the
index of the log entry that set it: unique, increasing in log order), whatever order the
answers reached the clients in. A delivery's flight ends, at the earliest, when its
invisible time does (then the message is visible again) and it is due again after the
group's retry delay for its attempt; a nack or a new invisible time sent on its handle
may end it earlier (``releases``: answered or not, it may have applied). Times are the
log's, in ms (the master's clock as stamped on the entries).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.pop.state import RetryPolicy


@dataclass(slots=True)
class Seen:
    """A delivery (``received``) or a new invisible time, as a client was answered."""

    epoch: int  # the handle's: the entry that set it
    attempt: int
    visible_at: int  # log ms
    consumer: str
    received: bool


@dataclass(slots=True)
class History:
    """One message of one group: what its clients saw and sent."""

    seen: list[Seen] = field(default_factory=list)  # by epoch
    # Nacks and new invisible times sent on a handle (answered or not: they may have
    # applied): (the handle's epoch, earliest visible again, earliest due again).
    releases: list[tuple[int, int, int]] = field(default_factory=list)
    acked: int | None = None  # the epoch of the handle an ack answered OK for

    def before(self, epoch: int) -> Seen | None:
        """The latest seen with an epoch below ``epoch``."""
        prev = None
        for s in self.seen:
            if s.epoch >= epoch:
                break
            prev = s
        return prev

    def insert(self, s: Seen) -> tuple[int, Seen | None]:
        """``s`` in epoch order: (its place, None); or, when a seen of that epoch is
        there already (the same answer again), (its place, that one), ``s`` not added."""
        at = sum(1 for x in self.seen if x.epoch < s.epoch)
        if at < len(self.seen) and self.seen[at].epoch == s.epoch:
            return at, self.seen[at]
        self.seen.insert(at, s)
        return at, None

    def floors(self, prev: Seen, retry: RetryPolicy) -> tuple[int, int]:
        """When the flight ``prev`` saw ends at the earliest: visible again, due again."""
        visible = prev.visible_at
        due = prev.visible_at + retry.delay(prev.attempt)
        for epoch, v, d in self.releases:
            if epoch == prev.epoch:
                visible, due = min(visible, v), min(due, d)
        return visible, due

    def too_early(self, prev: Seen, retry: RetryPolicy, ts: int) -> list[str]:
        """Why going out again at log time ``ts`` after ``prev`` breaks the rule (none:
        it does not): inside ``prev``'s invisible time, or before it is due again."""
        visible, due = self.floors(prev, retry)
        out = []
        if ts < visible:
            out.append(
                f"while its delivery to {prev.consumer} (epoch {prev.epoch}) is invisible "
                f"until {visible}"
            )
        if ts < due:
            out.append(
                f"before it is due again at {due} (epoch {prev.epoch}, attempt {prev.attempt})"
            )
        return out
