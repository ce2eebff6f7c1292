"""The consume queues' applier: a 20-byte unit per message into the queue of its topic
incarnation (RocketMQ's ``CommitLogDispatcherBuildConsumeQueue``).

The queues are derived state, and a replay must build them byte for byte as live
dispatch did. The rule that makes it possible: a message goes into a queue iff its
topic's incarnation at its entry still exists, that is, the current incarnation
(``TopicMeta.created_index``) was created before the entry and has the queue
(``MetadataState.queued``). It needs the metadata at or *after* the entry, never before
it: after a restart the metadata may come from a snapshot newer than the queues'
checkpoint (``broker/dispatch/recovery.py``).

Invariants:
- a record's units go in at the queue offsets baked into it (base + i for a batch
  record's messages), all pointing at the record: a gap or a different unit at a taken
  offset means the master assigned queue offsets wrongly, replicas would diverge, and
  ``ConsumeQueueError`` stops the node;
- entries up to ``held_index`` are in the queues already (a restart replays them for
  the metadata and the keys alone): they change no queue;
- a waited-on queue that changes is reported to ``Arrivals`` at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from consumequeue import ConsumeQueueError, ConsumeQueueStore
from dledger.store import BODY_OFFSET

from ..metadata import MetadataState
from .arrivals import Arrivals
from .entry import Committed

log = logging.getLogger(__name__)


def queue_table(cq: ConsumeQueueStore) -> dict[str, int]:
    """Every consume queue's next offset, as ``{"topic/queue_id": offset}``: what the
    dispatch checkpoint (as the queues' lengths) and the metadata snapshot record."""
    return {f"{q.topic}/{q.queue_id}": q.max_offset for q in cq}


def queue_of(e: Committed, meta: MetadataState) -> tuple[str, int] | None:
    """The queue the record's messages go into by the metadata held (the module's
    rule); None for a metadata operation, or a message of an incarnation deleted by now
    (recovery dropped its queues)."""
    info = e.info
    if e.system or not meta.queued(info.topic, info.queue_id, e.index):
        return None
    return info.topic, info.queue_id


class ConsumeQueueApplier:
    def __init__(
        self,
        cq: ConsumeQueueStore,
        meta: MetadataState,
        arrivals: Arrivals,
        stats: dict[str, int],
        on_topic_deleted: Callable[[str], None] | None = None,
    ) -> None:
        self.cq = cq
        self.meta = meta
        self.arrivals = arrivals
        self.stats = stats
        self.on_topic_deleted = on_topic_deleted  # the produce path forgets its offsets
        # The queues hold every entry up to here already: a replay below it changes no
        # queue (set by recovery and by an install).
        self.held_index = -1
        self.rebuild_until = -1  # entries up to here are a rebuild (see ``_put_units``)

    def apply(self, e: Committed) -> None:
        if e.index <= self.held_index:
            return
        key = queue_of(e, self.meta)
        if key is None:
            return
        self._put_units(key, e)
        self.stats["messages"] += len(e.tags_hashes)
        self.arrivals.changed(key)

    def _put_units(self, key: tuple[str, int], e: Committed) -> None:
        """The units of the record's messages (one per tags hash, from its queue offset
        on), all pointing at the record."""
        q = self.cq.queue(*key)
        queue_offset = e.info.queue_offset
        if (
            e.index <= self.rebuild_until
            and q.min_offset == q.max_offset
            and queue_offset > q.max_offset
        ):
            # Rebuilding a queue whose first messages retention already deleted from the
            # log: the queue starts where the log's first message of it says.
            q.reset(queue_offset)
        commitlog_offset, size = e.commitlog_offset, e.size - BODY_OFFSET
        try:
            q.put_batch(queue_offset, ((commitlog_offset, size, h) for h in e.tags_hashes))
        except ConsumeQueueError:
            log.critical("consume queue %s/%d broken at entry %d", key[0], key[1], e.index)
            raise

    def topic_deleted(self, name: str, index: int) -> None:
        """The entry at ``index`` deleted topic ``name``: its queues go, unless a replay
        reached an entry the queues hold (they are gone already)."""
        if index <= self.held_index:
            return
        self.cq.delete_topic(name)
        self.arrivals.topic_changed(name)  # gone: back to 0, as a topic made again starts
        if self.on_topic_deleted is not None:
            self.on_topic_deleted(name)

    def install(self, table: dict[tuple[str, int], int]) -> None:
        """Restart the queues at a snapshot's next offsets (the units before refer to
        log this node never gets); a queue the snapshot does not list goes."""
        cq = self.cq
        for q in list(cq):
            if (q.topic, q.queue_id) not in table:
                cq.delete_queue(q.topic, q.queue_id)
        for (topic, queue_id), next_offset in table.items():
            if next_offset or cq.find(topic, queue_id) is not None:
                cq.queue(topic, queue_id).reset(next_offset)
