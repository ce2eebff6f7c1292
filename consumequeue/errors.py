"""The consume-queue layer's errors.

A ``ConsumeQueueError`` is a broken invariant of derived state (a unit that disagrees
with a re-dispatch, a corrupt index file): the broker stops dispatching and can delete
and rebuild the files from the commitlog. ``ConsumeQueueGapError`` is the one the broker
can act on directly: dispatch skipped a queue offset, so it must go back and re-dispatch.
"""

from __future__ import annotations


class ConsumeQueueError(Exception):
    """A consume queue or key index file breaks an invariant of its format."""


class ConsumeQueueGapError(ConsumeQueueError):
    """A put skipped ahead of the queue's next offset (``expected`` < ``given``)."""

    def __init__(self, topic: str, queue_id: int, expected: int, given: int) -> None:
        super().__init__(
            f"consume queue {topic}/{queue_id}: put at queue offset {given} leaves a gap,"
            f" the next offset is {expected}"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.expected = expected
        self.given = given
