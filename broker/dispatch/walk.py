"""``ReputMessageService``: the walk over the committed entries, on the master and on
slaves alike (RocketMQ's name; docs/architecture.md).

It reads the committed entries in index order, many in one read, decodes each once
(``Committed``, ``broker/dispatch/entry.py``) and hands it to every applier in their
order: the replicated state's appliers first, and only with an entry their state has
not applied, then the derived files'. NOOPs, and with a logged warning anything that is
not a message record, reach no applier (a node must not crash on a committed entry) and
count as dispatched.

Invariants:
- every committed entry up to ``dispatched_index`` went through every applier; it only
  grows, but for ``reset`` (a restart's recovery, an install);
- ``MetadataState.applied_index`` moves to an entry before any applier sees it, so the
  state appliers get each entry once, whatever the retries and replays;
- an ``OSError`` from an applier (a full disk) leaves that entry undispatched and the
  entries before it dispatched; its retry repeats only what did not happen (the state
  appliers have it, the derived files' are idempotent by position).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dledger.runtime.watermark import Watermark
from dledger.store import MAGIC_NORMAL, FileStore

from ..message import MessageFormatError
from ..metadata import MetadataState
from .entry import ENTRY_HEAD, Applier, decode

log = logging.getLogger(__name__)

READ_BYTES = 4 << 20  # at most this much of the log in one read


class ReputMessageService:
    def __init__(
        self,
        store: FileStore,
        meta: MetadataState,
        state: Sequence[Applier],
        derived: Sequence[Applier],
        stats: dict[str, int],
    ) -> None:
        self.store = store
        self.meta = meta
        self._fresh = (*state, *derived)  # the appliers of an entry the state lacks
        self._derived = tuple(derived)  # of an entry it has (a replay, a retry)
        self.stats = stats
        self._dispatched = Watermark()

    @property
    def dispatched_index(self) -> int:
        """Every committed entry up to here is dispatched."""
        return self._dispatched.index

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        """Wait until ``dispatched_index >= index``; False on timeout."""
        return await self._dispatched.wait(index, timeout_s)

    def reset(self, index: int) -> None:
        """Go on after entry ``index`` (a restart, an installed snapshot)."""
        self._dispatched.reset(index)

    def dispatch_some(self, max_entries: int) -> int:
        """Dispatch up to ``max_entries`` committed entries; returns how many. On a disk
        error (raised) the entries before the failing one stay dispatched."""
        store = self.store
        start = self.dispatched_index
        try:
            while self.dispatched_index - start < max_entries:
                first = self.dispatched_index + 1
                last = min(store.committed_index, start + max_entries)
                if last < first:
                    break
                raw, count, _ = store.read_batch(first, READ_BYTES, last - first + 1)
                if count == 0:
                    break
                self._walk(raw, count)
        finally:
            done = self.dispatched_index - start
            self.stats["entries"] += done
        return done

    def replay(self, until: int) -> None:
        """Dispatch the committed entries up to ``until`` (a restart's recovery: the
        appliers that have them let them pass)."""
        while self.dispatched_index < until:
            first = self.dispatched_index + 1
            raw, count, _ = self.store.read_batch(first, READ_BYTES, until - first + 1)
            assert count > 0, f"committed entry {first} is not in the log"
            self._walk(raw, count)

    def _walk(self, raw: bytes, count: int) -> None:
        off = 0
        unpack_head = ENTRY_HEAD.unpack_from
        done = self.dispatched_index
        try:
            for _ in range(count):
                magic, size, index, _term, pos = unpack_head(raw, off)
                self._entry(raw, off, magic, size, index, pos)
                done = index
                off += size
        finally:
            self._dispatched.advance(done)  # wakes wait_dispatched

    def _entry(  # noqa: PLR0917 - the entry header's fields, as _walk unpacks them
        self, raw: bytes, off: int, magic: int, size: int, index: int, pos: int
    ) -> None:
        meta = self.meta
        fresh = index > meta.applied_index
        if fresh:
            meta.applied_index = index
        if magic != MAGIC_NORMAL:
            return  # a NOOP or a cluster configuration: nothing to dispatch
        try:
            e = decode(raw, off, magic, index, pos, size)
        except MessageFormatError as err:
            self.stats["skipped"] += 1
            log.warning("entry %d at pos %d is not a message, skipped: %s", index, pos, err)
            return
        for applier in self._fresh if fresh else self._derived:
            applier.apply(e)
