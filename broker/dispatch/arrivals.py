"""``Arrivals``: long-polling readers waiting for a consume queue to grow (RocketMQ's
``MessageArrivingListener``); what the reads' ``wait_queue`` is.

Invariants:
- a reader waits on the queue's next offset, a ``Watermark`` per waited-on queue: it is
  woken by the change that puts its message (``changed``), never by polling;
- a queue deleted or restarted (a topic deleted, a snapshot installed) is ``changed``
  like a grown one: its readers then wait on from its new next offset (0 for a queue
  that is gone, as a topic made again starts);
- a queue's mark goes when a change finds nobody waiting on it: the table holds only
  queues someone waits on (or did, until their next change).
"""

from __future__ import annotations

from consumequeue import ConsumeQueueStore
from dledger.runtime.watermark import Watermark

QueueKey = tuple[str, int]  # (topic, queue id)


class Arrivals:
    def __init__(self, cq: ConsumeQueueStore) -> None:
        self.cq = cq
        self._marks: dict[QueueKey, Watermark] = {}

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool:
        """Wait until the queue holds a message at ``queue_offset``; False on timeout."""
        key = (topic, queue_id)
        mark = self._marks.get(key)
        if mark is None:
            mark = self._marks[key] = Watermark(self._next_offset(key))
        return await mark.wait(queue_offset + 1, timeout_s)

    def waiting_on(self, topic: str, queue_id: int) -> int:
        """How many readers wait for the queue's next message."""
        mark = self._marks.get((topic, queue_id))
        return 0 if mark is None else mark.waiting

    def changed(self, key: QueueKey) -> None:
        """The queue changed (grew, or was deleted or restarted): tell its waiters, and
        forget it when none is left (``wait_queue`` looks at the queue again)."""
        mark = self._marks.get(key)
        if mark is not None:
            mark.reset(self._next_offset(key))
            if not mark.waiting:
                del self._marks[key]

    def topic_changed(self, topic: str) -> None:
        """Every waited-on queue of ``topic`` changed (the topic was deleted)."""
        for key in [k for k in self._marks if k[0] == topic]:
            self.changed(key)

    def all_changed(self) -> None:
        """Every waited-on queue changed (a snapshot install restarted them all)."""
        for key in list(self._marks):
            self.changed(key)

    def _next_offset(self, key: QueueKey) -> int:
        q = self.cq.find(*key)
        return 0 if q is None else q.max_offset  # a queue not made yet starts at 0
