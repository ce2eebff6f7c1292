"""The store contract: settings, errors, hooks and the ``LogStore`` protocol.

Both :class:`~dledger.store.file_store.FileStore` (mmap segments, the real thing) and
:class:`~dledger.store.memory_store.MemoryStore` (the in-memory twin for simulations)
implement :class:`LogStore`. The Raft layer owns roles and terms; the store owns bytes:
it assigns index and pos, checks that follower writes land exactly where the leader put
them, and keeps ledger begin/end, the committed index and the durable state files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..codes import DLedgerCode, DLedgerError
from .entry import (
    ENTRY_MAGICS,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    ConfigRecord,
    Entry,
    EntryMeta,
    place_entry,
)
from .meta import TermVote

__all__ = ["place_entry"]  # re-exported: the placement rule lives with the codec

GiB = 1 << 30
MiB = 1 << 20

AppendHook = Callable[[EntryMeta, memoryview, int], None]
"""``hook(entry, entry_bytes, body_offset)``: runs on the leader after the entry's pos is
fixed and before its bytes are written; may rewrite the body in ``entry_bytes`` (a
writable view of the whole encoded entry). The body CRC is computed after all hooks."""


class StoreError(DLedgerError):
    """An append, read or truncate the store refused; nothing was changed. ``damaged``:
    the refused bytes themselves fail their check (a body CRC), whoever sent them."""

    def __init__(self, code: DLedgerCode, message: str, *, damaged: bool = False) -> None:
        super().__init__(code, message)
        self.damaged = damaged


class CorruptEntryError(StoreError):
    """A read found this replica's copy of an entry damaged (its body fails its CRC, or
    its header disagrees with its index unit): bit rot, a bad sector, a stray write.

    Only that read is refused (``DISK_ERROR``): the rest of the log reads fine and the
    other replicas hold good copies, so a reader goes to one of them. Recovery does not
    see such damage below the checkpoint (it starts there); restoring the replica from
    a peer repairs it. ``index`` and ``pos`` name the entry (``index`` -1 if unknown)."""

    def __init__(self, index: int, pos: int, message: str) -> None:
        super().__init__(DLedgerCode.DISK_ERROR, message, damaged=True)
        self.index = index
        self.pos = pos


class StoreCorruptionError(RuntimeError):
    """Damage the store must not repair silently (e.g. inside the committed prefix).

    This stops the node: an operator has to look at the named file and position."""


class StoreFailedError(RuntimeError):
    """The store can no longer vouch for what is on disk: an fsync failed (the kernel may
    have dropped the dirty pages, so a later "successful" sync proves nothing: the
    PostgreSQL fsyncgate lesson), or undoing a failed write failed. Every later call
    raises it too. Crash-only: the node stops, and recovery on restart re-verifies the
    log from its last durable checkpoint."""


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Every limit of the store. Defaults follow DLedger where it has one."""

    data_file_size: int = GiB
    index_file_size: int = 160 * MiB
    flush: Literal["async", "sync"] = "async"
    flush_interval_ms: int = 10
    checkpoint_interval_ms: int = 3000
    max_body_bytes: int = 16 * MiB
    recovery_verify: Literal["checkpoint", "all"] = "checkpoint"
    file_reserved_hours: float = 72.0
    clean_interval_ms: int = 1000
    max_files_deleted_per_clean: int = 10
    disk_clean_ratio: float = 0.85
    disk_full_ratio: float = 0.90
    disk_check_interval_ms: int = 1000

    def __post_init__(self) -> None:
        if self.index_file_size % INDEX_UNIT_SIZE or self.index_file_size < INDEX_UNIT_SIZE:
            raise ValueError(f"index_file_size must be a positive multiple of {INDEX_UNIT_SIZE}")
        if self.data_file_size < 64 + MIN_BLANK_LEN:
            raise ValueError("data_file_size too small for a single entry")
        if self.flush not in ("async", "sync"):
            raise ValueError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        if self.recovery_verify not in ("checkpoint", "all"):
            raise ValueError("recovery_verify must be 'checkpoint' or 'all'")
        if not 0 < self.disk_clean_ratio <= self.disk_full_ratio <= 1:
            raise ValueError("need 0 < disk_clean_ratio <= disk_full_ratio <= 1")
        for name in ("flush_interval_ms", "checkpoint_interval_ms", "clean_interval_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def max_entry_bytes(self) -> int:
        """An entry plus the blank record that may follow it must fit one segment."""
        return min(self.max_body_bytes + 48, self.data_file_size - MIN_BLANK_LEN)


class LogStore(Protocol):
    """What the Raft layer needs from a log store."""

    @property
    def ledger_begin_index(self) -> int: ...
    @property
    def ledger_before_begin_term(self) -> int: ...
    @property
    def ledger_before_begin_chain(self) -> int: ...
    @property
    def ledger_end_index(self) -> int: ...
    @property
    def ledger_end_chain(self) -> int: ...
    @property
    def ledger_end_term(self) -> int: ...
    @property
    def ledger_begin_pos(self) -> int: ...
    @property
    def ledger_end_pos(self) -> int: ...
    @property
    def committed_index(self) -> int: ...
    @property
    def committed_pos(self) -> int: ...

    incarnation: str  # this log's identity: new with every empty data directory

    def add_append_hook(self, hook: AppendHook) -> None: ...
    def append_as_leader(
        self, term: int, bodies: Sequence[bytes | bytearray | memoryview], magic: int = ...
    ) -> Sequence[EntryMeta]: ...
    def append_as_follower(self, data: bytes | bytearray | memoryview) -> list[EntryMeta]: ...
    def get(self, index: int) -> Entry: ...
    def get_meta(self, index: int) -> EntryMeta: ...
    def term_at(self, index: int) -> int: ...
    def read(self, pos: int, size: int) -> bytes: ...
    def read_entries(self, from_index: int, max_bytes: int, max_entries: int) -> bytes: ...
    def read_batch(
        self, from_index: int, max_bytes: int, max_entries: int
    ) -> tuple[bytes, int, int]: ...
    def truncate(self, from_index: int) -> int: ...
    def reset(
        self,
        begin_index: int,
        begin_pos: int,
        before_begin_term: int,
        before_begin_chain: int = ...,
        config: ConfigRecord | None = ...,
    ) -> None: ...
    @property
    def config_version(self) -> int: ...
    def config_records(self) -> list[ConfigRecord]: ...
    def bootstrap_config(self, body: bytes) -> None: ...
    def first_index_of_term(self, term: int, end_index: int) -> int: ...
    def update_committed(self, index: int) -> None: ...
    def load_term_vote(self) -> TermVote: ...
    def save_term_vote(self, tv: TermVote) -> None: ...
    @property
    def durable_index(self) -> int: ...
    def sync(self) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def check_leader_bodies(
    bodies: Sequence[bytes | bytearray | memoryview], magic: int, settings: StoreSettings
) -> None:
    """A leader's batch before anything of it is encoded: bodies, each within the limit,
    and an entry magic; else ``StoreError`` (nothing is written)."""
    if not bodies:
        raise StoreError(DLedgerCode.REQUEST_WITH_EMPTY_BODYS, "append with no bodies")
    limit = settings.max_entry_bytes - 48
    if max(map(len, bodies)) > limit:
        i = next(i for i, body in enumerate(bodies) if len(body) > limit)
        raise StoreError(
            DLedgerCode.UNEXPECTED_ARGUMENT,
            f"body {i} is {len(bodies[i])} bytes, over the limit of {limit}",
        )
    if magic not in ENTRY_MAGICS:
        raise StoreError(DLedgerCode.UNEXPECTED_ARGUMENT, f"invalid entry magic {magic}")
