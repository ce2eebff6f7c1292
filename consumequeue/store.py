"""``ConsumeQueueStore``: every consume queue of a node, ``<root>/<topic>/<queue_id>/``.

Invariants:
- at most one open ``ConsumeQueue`` per (topic, queue_id), kept in a dict and opened
  lazily by ``queue`` (the dispatcher's per-message lookup is one dict hit);
- at most ``max_open_queues`` of them have their segments mapped, give or take the
  queues written since the last ``flush``: past it, the least recently used (by
  ``queue`` and ``find``) whose units are all synced are suspended, when one more is
  mapped and at ``trim`` (the owner's, after a flush) (``ConsumeQueue
  .suspend``: descriptors and mappings closed, positions kept), and map their segments
  again when used. Topics are cheap: 1,000 idle ones hold no descriptor;
- topic directory names are the topic names as they are (``[A-Za-z0-9_%|-]{1,127}``,
  legal file names on Linux, and no ``.`` or ``/`` so a name cannot leave ``root``);
  queue directories are the decimal queue ids;
- only directories in ``root`` are topics: the owner may keep files beside them (the
  broker's dispatch checkpoint);
- ``flush`` makes the directory tree durable too (a queue created or a topic deleted
  since the last flush changes ``root`` or a topic directory), so a checkpoint taken
  after it names exactly the queues a power loss leaves.

Thread safety: as ``ConsumeQueue``: the owner serialises calls, ``flush`` may run on
another thread while the owner goes on writing (it works on a snapshot of the open
queues, and takes the set of directories to sync under a lock).
"""

from __future__ import annotations

import re
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from dledger.store.meta import fsync_dir

from .errors import ConsumeQueueError
from .queue import ConsumeQueue, ConsumeQueueSettings

# A directory name: a broker's topic names, and "." within one (the broker's own system
# topics have it: no client can name them), never "." or ".." alone.
TOPIC_PATTERN = re.compile(r"(?!\.\.?$)[A-Za-z0-9_%|.-]{1,127}")


SUSPEND_LOOKS = 64  # queues with unsynced units a suspension pass passes over, at most


def check_topic(topic: str) -> str:
    """``topic`` if it is a legal topic name, else ``ValueError``."""
    if not TOPIC_PATTERN.fullmatch(topic):
        raise ValueError(f"illegal topic name {topic!r}: must match {TOPIC_PATTERN.pattern}")
    return topic


class ConsumeQueueStore:
    """The consume queues under ``root``."""

    def __init__(self, root: Path, settings: ConsumeQueueSettings) -> None:
        self.root = root
        self.settings = settings
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # The queues whose segments are mapped, least recently used first.
        self._mapped: OrderedDict[tuple[str, int], ConsumeQueue] = OrderedDict()
        self.suspensions = 0  # queues suspended so far (their segments unmapped)
        self._dirs_dirty: set[Path] = set()  # directories whose entries changed since flush
        self._dirs_lock = threading.Lock()  # the owner adds to it, a flush takes it
        root.mkdir(parents=True, exist_ok=True)

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, opened (or created empty) on first use."""
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            return self._open(topic, queue_id)
        if key in self._mapped:
            self._mapped.move_to_end(key)
        return q

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it is open; never creates one (call ``load`` first to see the
        queues on disk)."""
        key = (topic, queue_id)
        if key in self._mapped:
            self._mapped.move_to_end(key)
        return self._queues.get(key)

    def _resumed(self, q: ConsumeQueue) -> None:
        """``q`` mapped its segments (opened, or used while suspended): the most recently
        used now; the least recently used synced ones past the limit are suspended."""
        key = (q.topic, q.queue_id)
        self._mapped[key] = q
        self._mapped.move_to_end(key)
        self._suspend_past_limit(key)

    def trim(self) -> int:
        """Suspend the least recently used synced queues past ``max_open_queues`` (the
        owner calls it after a ``flush``, on its own thread); returns how many are
        mapped now."""
        if self._mapped:
            self._suspend_past_limit(next(reversed(self._mapped)))
        return len(self._mapped)

    def _suspend_past_limit(self, in_use: tuple[str, int]) -> None:
        mapped = self._mapped
        over = len(mapped) - self.settings.max_open_queues
        if over <= 0:
            return
        # Bounded: from the least recently used on, passing over at most SUSPEND_LOOKS
        # with unsynced units (written since the last flush: ``trim`` gets them after the
        # next one), never the one in use.
        gone: list[tuple[tuple[str, int], bool]] = []
        for looks, (key, q) in enumerate(mapped.items()):
            if len(gone) >= over or looks >= over + SUSPEND_LOOKS:
                break
            if key != in_use and (q.closed or q.suspend()):
                gone.append((key, q.closed))
        for key, closed in gone:
            del mapped[key]
            self.suspensions += not closed

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        check_topic(topic)
        if queue_id < 0:
            raise ValueError(f"queue_id must be >= 0, got {queue_id}")
        topic_dir = self.root / topic
        if not (topic_dir / str(queue_id)).is_dir():
            self._dirty(self.root, topic_dir)
        q = ConsumeQueue(self.root, topic, queue_id, self.settings)
        self._queues[(topic, queue_id)] = q
        q.on_resume = self._resumed
        self._resumed(q)
        return q

    def _dirty(self, *dirs: Path) -> None:
        with self._dirs_lock:
            self._dirs_dirty.update(dirs)

    def load(self) -> None:
        """Open every queue on disk (recovering each one's tail)."""
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue  # the owner's bookkeeping next to the topics (a checkpoint)
            if not TOPIC_PATTERN.fullmatch(topic_dir.name):
                raise ConsumeQueueError(f"{topic_dir}: not a topic directory")
            for queue_dir in sorted(topic_dir.iterdir()):
                name = queue_dir.name
                if not queue_dir.is_dir() or not name.isdigit() or str(int(name)) != name:
                    raise ConsumeQueueError(f"{queue_dir}: not a queue directory")
                if (topic_dir.name, int(name)) not in self._queues:
                    self._open(topic_dir.name, int(name))

    def topics(self) -> dict[str, list[int]]:
        """Open queues: topic → sorted queue ids."""
        out: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self._queues):
            out.setdefault(topic, []).append(queue_id)
        return out

    def delete_topic(self, topic: str) -> None:
        """Close the topic's queues and remove its directory (queues not open too)."""
        check_topic(topic)
        for key in [k for k in self._queues if k[0] == topic]:
            self._queues.pop(key).close()
            self._mapped.pop(key, None)
        shutil.rmtree(self.root / topic, ignore_errors=True)
        self._dirty(self.root)

    def delete_queue(self, topic: str, queue_id: int) -> None:
        """Close one queue and remove its directory."""
        q = self._queues.pop((topic, queue_id), None)
        self._mapped.pop((topic, queue_id), None)
        if q is not None:
            q.close()
        shutil.rmtree(self.root / check_topic(topic) / str(queue_id), ignore_errors=True)
        self._dirty(self.root / topic)

    def delete_all(self) -> None:
        """Close every queue and remove every topic directory, also ones that do not load
        (the owner rebuilds the queues from the log); files beside them stay."""
        self.close()
        for d in sorted(self.root.iterdir()):
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
        self._dirty(self.root)

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def flush(self) -> None:
        for q in list(self._queues.values()):
            if not q.closed:
                q.flush()
        with self._dirs_lock:
            dirs, self._dirs_dirty = self._dirs_dirty, set()
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):  # leaves first
            fsync_dir(d, missing_ok=True)  # one deleted since: its parent is in the set too

    def close(self) -> None:
        for q in self._queues.values():
            q.close()
        self._queues.clear()
        self._mapped.clear()

    @property
    def mapped(self) -> int:
        """Queues whose segments are mapped now."""
        return len(self._mapped)
