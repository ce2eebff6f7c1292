"""The configuration entries a log holds, kept beside it (the ``members`` file).

The Raft layer uses the newest configuration entry (``MAGIC_CONFIG``) of its log, and the
log may be gigabytes: rather than scan it on every start, the store notes each
configuration entry as it is written, in a small file replaced atomically, and serves
them from memory (``LogStore.config_records``).

Invariants (what makes the file safe to trust after a crash):
- every configuration entry the log holds is in the file: the file is written (durably)
  *before* the entry's bytes, under the store lock, so no crash and no checkpoint can
  leave an entry in the log that the file misses;
- the file may name entries the log no longer holds (a crash between a truncate and the
  file's rewrite, or before the entry's bytes were written): ``valid`` drops every record
  past the log's end or whose term disagrees with the log's at its index;
- records below the log's head (retention, a snapshot's reset) are kept as the base: the
  newest of them is the configuration in force before the log's first entry.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from .entry import BODY_OFFSET, MAGIC_CONFIG, ConfigRecord, EntryMeta
from .meta import MetaFileError, write_atomic

MAX_RECORDS = 1024
"""Records past the newest committed one are a log's uncommitted configuration entries;
more than this in a file means a damaged or hostile file."""


class ConfigJournal:
    """The records, oldest first, and their file (None: kept in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[ConfigRecord] = []
        self.version = 0  # bumped on every change: the Raft layer re-reads on a new one
        if path is not None:
            self.records = _load(path)

    def _save(self) -> None:
        self.version += 1
        if self.path is not None:
            doc = [[r.index, r.term, r.body.decode()] for r in self.records]
            write_atomic(self.path, json.dumps(doc, separators=(",", ":")))

    def add(self, new: Sequence[ConfigRecord], floor_index: int) -> None:
        """Entries about to be written (call before their bytes go in); records that one
        at or below ``floor_index`` (committed and durable) supersedes are dropped."""
        if new:
            self.records = [r for r in self.records if r.index < new[0].index] + list(new)
            self.compact(floor_index)
            self._save()

    def truncated(self, from_index: int) -> None:
        """The log lost ``from_index`` and after (call after the truncate)."""
        if any(r.index >= from_index for r in self.records):
            self.records = [r for r in self.records if r.index < from_index]
            self._save()

    def reset(self, base: ConfigRecord | None) -> None:
        """The log restarts after a snapshot whose configuration is ``base`` (call
        before the log's reset: a crash in between leaves a log that ends before the
        snapshot, whose configurations ``base`` supersedes)."""
        keep = [r for r in self.records if base is None or r.index < base.index]
        self.records = keep + ([base] if base is not None else [])
        self._save()

    def bootstrap(self, body: bytes) -> None:
        """The first start's configuration, when the log has none."""
        if not self.records:
            self.records = [ConfigRecord(-1, 0, body)]
            self._save()

    def valid(
        self, end_index: int, begin_index: int, term_at: Callable[[int], int]
    ) -> list[ConfigRecord]:
        """The records the log agrees with (see the module's invariants)."""
        out: list[ConfigRecord] = []
        for r in self.records:
            if r.index > end_index:
                break
            if r.index >= begin_index and term_at(r.index) != r.term:
                continue  # replaced by another entry since: not a configuration any more
            out.append(r)
        return out

    def compact(self, floor_index: int) -> None:
        """Forget records that a newer one at or below ``floor_index`` (committed)
        supersedes; keeps the file small. Not saved by itself."""
        older = [i for i, r in enumerate(self.records) if r.index <= floor_index]
        if len(older) > 1:
            del self.records[: older[-1]]


INCARNATION_PATTERN = re.compile(r"[0-9A-Za-z._-]{1,64}")


def new_incarnation_id() -> str:
    return os.urandom(8).hex()


def load_incarnation(path: Path, new: Callable[[], str]) -> str:
    """The data directory's incarnation: made once, when the directory is first used,
    and kept in ``path``. A node whose directory was lost comes back with another one:
    its group tells it from the member it was (``dledger.core.membership``)."""
    try:
        raw = path.read_text().strip()
    except FileNotFoundError:
        raw = new()
        write_atomic(path, raw + "\n")
    except UnicodeDecodeError:
        raise MetaFileError(f"{path}: not text") from None
    if not INCARNATION_PATTERN.fullmatch(raw):
        raise MetaFileError(f"{path}: {raw[:80]!r} is not an incarnation id")
    return raw


def config_records(data: memoryview, metas: Sequence[EntryMeta]) -> list[ConfigRecord]:
    """The configuration entries among ``metas``, whose encoded entries lie back to back
    in ``data`` (a follower's append)."""
    out: list[ConfigRecord] = []
    if any(m.magic == MAGIC_CONFIG for m in metas):
        off = 0
        for m in metas:
            if m.magic == MAGIC_CONFIG:
                out.append(
                    ConfigRecord(m.index, m.term, bytes(data[off + BODY_OFFSET : off + m.size]))
                )
            off += m.size
    return out


def _load(path: Path) -> list[ConfigRecord]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(raw)
        if not isinstance(doc, list) or len(doc) > MAX_RECORDS:
            raise ValueError(f"expected a list of at most {MAX_RECORDS} records")
        records = [ConfigRecord(int(i), int(t), str(b).encode()) for i, t, b in doc]
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise MetaFileError(f"{path}: {e}") from None
    if any(a.index >= b.index for a, b in itertools.pairwise(records)):
        raise MetaFileError(f"{path}: records out of order")
    return records
