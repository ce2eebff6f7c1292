"""The metadata snapshot: its bytes, made of the state appliers' parts; taking one at the
dispatched index and handing it to Raft for followers behind the log head; finding the
newest usable one on a restart (docs/formats.md, "Metadata entries").

The bytes are one JSON object (orjson): ``version``, ``applied_index``, then each state
applier's fields in the appliers' order (``topics``, ``offsets``, ``sessions``), then
``extra``: ``{"queues": {"topic/queue_id": next_offset}}``, every consume queue's next
offset at that entry. An install restarts the queues there, and a rebuild over a log
whose head is gone starts them there (``broker/dispatch/recovery.py``).

Invariants:
- a snapshot is taken at the dispatched index only, on the loop thread between two
  dispatch steps: the state and the queue table of exactly one entry;
- the store's commit point is durable before a snapshot is written: after a restart the
  log knows that every entry the snapshot covers is committed, Raft takes it back at
  once and a rebuild can start the queues from its table (broker simulation seed 270
  with an 8 s fault phase: a snapshot past the durable commit point, a rebuild);
- parsing changes nothing, and anything malformed is a ``ValueError`` naming what is
  wrong, never another exception: the bytes come from a file or from the leader;
- Raft is handed the newest snapshot (``served_index``) as soon as it takes it: after a
  restart it refuses until its commit index is back, and the snapshot is offered again
  at every beat until then, or until the log no longer continues it;
- a restart adopts the newest readable snapshot the local log continues: one past the
  log end is deleted (no local log continues it), one before the log head ends the
  search (the entries after it are gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from dledger.store import FileStore

from ..jsonint import decimal, json_int
from ..metadata import MetadataState, SnapshotFiles
from ..positions import pos_of
from .entry import StateApplier

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1


def snapshot_bytes(
    meta: MetadataState,
    parts: Sequence[StateApplier[Any]],
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """The snapshot of ``meta`` at its ``applied_index``: the appliers' parts, in order."""
    doc: dict[str, Any] = {"version": SNAPSHOT_VERSION, "applied_index": meta.applied_index}
    for applier in parts:
        doc.update(applier.snapshot_part())
    doc["extra"] = dict(extra or {})
    return orjson.dumps(doc)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A parsed snapshot, not adopted yet."""

    applied_index: int
    parts: tuple[tuple[StateApplier[Any], Any], ...]
    extra: dict[str, Any]

    def adopt(self, meta: MetadataState) -> None:
        """Make it the state of every applier it was parsed for, in place."""
        for applier, part in self.parts:
            applier.adopt_part(part)
        meta.applied_index = self.applied_index


def parse_snapshot(raw: bytes, parts: Sequence[StateApplier[Any]]) -> Snapshot:
    """Read a snapshot for the appliers ``parts``; ``ValueError`` if it is malformed."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"metadata snapshot is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"metadata snapshot is a JSON {type(d).__name__}, not an object")
    if d.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {d.get('version')!r}")
    try:
        applied_index = json_int(d["applied_index"], "applied_index")
        parsed = tuple((applier, applier.parse_part(d)) for applier in parts)
        extra = d.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"extra is a {type(extra).__name__}, not an object")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"malformed metadata snapshot: {type(e).__name__}: {e}") from None
    return Snapshot(applied_index, parsed, dict(extra))


def parse_queue_table(raw: Any) -> dict[tuple[str, int], int]:
    """``{"topic/queue_id": next_offset}`` → ``{(topic, queue_id): next_offset}``."""
    if not isinstance(raw, dict):
        raise ValueError("the snapshot has no queue table")
    out: dict[tuple[str, int], int] = {}
    for key, next_offset in raw.items():
        topic, _, queue_id = str(key).rpartition("/")
        if (
            not topic
            or decimal(queue_id, 5) is None
            or not isinstance(next_offset, int)
            or next_offset < 0
        ):
            raise ValueError(f"bad queue table entry {key!r}: {next_offset!r}")
        out[topic, int(queue_id)] = next_offset
    return out


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    index: int
    raw: bytes
    servable: bool  # it has a queue table (older snapshots lack it): Raft may send it
    queues: Any  # that queue table as stored


class SnapshotManager:
    """This node's metadata snapshots: the files, the newest one's index and the one
    Raft holds (``serve(index, data)`` hands it over; False: not now)."""

    def __init__(
        self,
        store: FileStore,
        files: SnapshotFiles,
        meta: MetadataState,
        parts: Sequence[StateApplier[Any]],
        *,
        queue_table: Callable[[], dict[str, int]],
        serve: Callable[[int, bytes], bool] | None = None,
    ) -> None:
        self.store = store
        self.files = files
        self.meta = meta
        self.parts = parts
        self.queue_table = queue_table
        self.serve = serve
        self.snapshot_index = -1  # the newest snapshot on disk
        self.served_index = -1  # the snapshot Raft holds (with ``serve`` set)
        self._unserved: tuple[int, bytes] | None = None  # the newest, until Raft has it
        # A log position a follower that installs a snapshot must still receive (None:
        # none): a snapshot past it waits (``offer``). Set by ``Dispatch``.
        self.pinned: Callable[[], int | None] = lambda: None

    @property
    def unserved(self) -> bool:
        """A snapshot waits to be handed to Raft (after a restart)."""
        return self._unserved is not None

    def parse(self, raw: bytes) -> Snapshot:
        return parse_snapshot(raw, self.parts)

    async def keep(self, index: int, data: bytes) -> None:
        """Write a leader's snapshot of entry ``index`` (being installed). The older ones
        stay: until the log restarts, they are the ones a restart can use."""
        await asyncio.to_thread(self.files.save, index, data, prune=False)

    async def take(self, dispatched_index: int) -> bool:
        """Write the state and every queue's next offset as of the last entry applied,
        and hand the snapshot to Raft; False, doing nothing, when there is no newer
        entry or dispatch is not exactly there."""
        index = self.meta.applied_index
        if index == self.snapshot_index or index != dispatched_index:
            return False
        data = snapshot_bytes(self.meta, self.parts, {"queues": self.queue_table()})
        await asyncio.to_thread(self.store.flush)  # the commit point first (invariants)
        await asyncio.to_thread(self.files.save, index, data)
        self.snapshot_index = index
        self._unserved = (index, data)
        self.offer()
        return True

    def offer(self) -> None:
        """Hand the newest snapshot to Raft, if it does not hold it yet."""
        unserved = self._unserved
        if unserved is None or self.serve is None:
            return
        if unserved[0] < self.store.ledger_begin_index - 1:
            self._unserved = None  # the log no longer continues it: a newer one will do
            return
        pinned = self.pinned()
        if pinned is not None and pos_of(self.store, unserved[0] + 1) > pinned:
            return  # it covers a pending delay message's record: Raft keeps an older one
        if self.serve(*unserved):
            self._unserved = None
            self.served_index = unserved[0]

    def installed(self, index: int) -> None:
        """A leader's snapshot of entry ``index`` is this node's now (Raft holds it)."""
        self.snapshot_index = self.served_index = index
        self._unserved = None

    def load_newest(self) -> LoadedSnapshot | None:
        """Adopt the newest readable snapshot the local log can continue (a restart)."""
        store = self.store
        for index in reversed(self.files.indexes()):
            if index > store.ledger_end_index:
                # No local log continues it: an install that crashed before the log was
                # reset (Raft sends it again), or entries a power loss took. Kept, it
                # would crowd the usable snapshots out of the few that are kept.
                log.warning("metadata snapshot %d is past the log end: deleted", index)
                self.files.path(index).unlink(missing_ok=True)
                continue
            if index < store.ledger_begin_index - 1:
                break  # the entries after it are gone
            try:
                raw = self.files.path(index).read_bytes()
                snap = self.parse(raw)
            except (OSError, ValueError) as e:
                log.warning("metadata snapshot %d unusable, trying an older one: %s", index, e)
                continue
            snap.adopt(self.meta)
            self.snapshot_index = index
            queues = snap.extra.get("queues")
            servable = "queues" in snap.extra
            if servable:
                self._unserved = (index, raw)
            return LoadedSnapshot(index, raw, servable, queues)
        if store.ledger_begin_index > 0:
            log.error(
                "no metadata snapshot for a log that begins at entry %d", store.ledger_begin_index
            )
        return None
