"""Retention: which head segments of the log may be deleted, and where the log begins
after they are (DLedger's ``fileReservedHours`` and disk-ratio clean).

The rule, for the oldest segment first (``head_segment_due``, a pure function):
- never a segment that holds a byte at or above the floor: the committed position, or
  the caller's retention floor if lower (the broker's dispatch position, a snapshot's
  ``next_pos``), so nothing uncommitted, undispatched or not yet snapshotted goes;
- never the last (active) segment;
- otherwise it goes when it is older than ``file_reserved_hours``, or while disk usage is
  above ``disk_clean_ratio``, or when the caller forces it;
- at most ``max_files_deleted_per_clean`` per call, oldest first, stopping at the first
  segment that must stay (the log stays contiguous).

Deleting the head moves the log's begin to the next segment's first entry; the term and
chain CRC of the entry before it are kept (``LogHead``) so that a COMPARE or a snapshot
at the new before-begin entry still checks exactly.

Above ``disk_full_ratio`` appends are refused instead (``DiskFullCheck``, DLedger's
``isDiskFull``, which its ``CleanSpaceService`` sets).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..codes import DLedgerCode
from .base import StoreError, StoreSettings
from .entry import INDEX_UNIT_SIZE, EntryHeader, decode_header
from .mmapfile import MmapFileList


def disk_usage_ratio(path: Path) -> float:
    """The used fraction of the file system holding ``path``."""
    u = shutil.disk_usage(path)
    return (u.total - u.free) / u.total if u.total else 0.0


class DiskFullCheck:
    """Refuses appends while disk usage is above ``disk_full_ratio``; ``usage`` (the used
    fraction) is asked at most every ``disk_check_interval_ms``."""

    def __init__(self, usage: Callable[[], float], settings: StoreSettings) -> None:
        self.usage = usage
        self._settings = settings
        self._ratio = 0.0
        self._checked_at = -1e18

    def full(self) -> bool:
        """Is the disk too full to append to? (What ``check`` refuses on; also read by
        the node's ``ledgermq_disk_full`` gauge, so a follower that refuses the leader's
        pushes says so.)"""
        now = time.monotonic()
        s = self._settings
        if now - self._checked_at >= s.disk_check_interval_ms / 1000:
            self._ratio = self.usage()
            self._checked_at = now
        return self._ratio > s.disk_full_ratio

    def check(self) -> None:
        """``StoreError(DISK_FULL)`` if the disk is too full to append to."""
        if self.full():
            raise StoreError(
                DLedgerCode.DISK_FULL,
                f"disk usage {self._ratio:.1%} is above {self._settings.disk_full_ratio:.0%}",
            )


@dataclass(frozen=True, slots=True)
class LogHead:
    """Where the log begins: its first entry's index and pos, and the term and chain CRC
    of the entry just before it (gone, or never held: a snapshot covers it)."""

    begin_index: int
    begin_pos: int
    before_begin_term: int
    before_begin_chain: int


def retention_floor_pos(committed_pos: int, floor_pos: int | None) -> int:
    """The position retention must keep everything at or above."""
    return committed_pos if floor_pos is None else min(committed_pos, floor_pos)


def head_segment_due(
    *,
    limit_pos: int,
    floor_pos: int,
    age_s: float,
    usage_ratio: float,
    force: bool,
    settings: StoreSettings,
) -> bool:
    """May the oldest segment, ending at ``limit_pos``, be deleted? (The caller never
    asks about the last segment.)"""
    if limit_pos > floor_pos:
        return False
    expired = age_s > settings.file_reserved_hours * 3600
    return expired or force or usage_ratio > settings.disk_clean_ratio


def delete_head_segments(
    data: MmapFileList,
    index: MmapFileList,
    head: LogHead,
    *,
    end_index: int,
    floor_pos: int,
    now_s: float,
    settings: StoreSettings,
    disk_usage: Callable[[], float],
    force: bool,
    header_at: Callable[[int], EntryHeader],
    before_delete: Callable[[LogHead], None],
    adopt: Callable[[LogHead], None],
) -> int:
    """Delete the head segments that are due; returns how many.

    ``header_at(i)``: the header of entry ``i`` (read before anything is deleted);
    ``before_delete(head)``: the store makes the new head durable (its checkpoint)
    before the segment goes, so that a crash in between leaves a begin that recovery
    finds in the data, never a checkpoint naming a segment that is gone;
    ``adopt(head)``: the store takes the new head, right after each deletion, so that
    its begin never names a deleted segment for longer than that; ``disk_usage`` is
    asked again after each deletion, which frees space."""
    deleted = 0
    while deleted < settings.max_files_deleted_per_clean and len(data.files) > 1:
        seg = data.files[0]
        due = head_segment_due(
            limit_pos=seg.limit,
            floor_pos=floor_pos,
            age_s=now_s - seg.path.stat().st_mtime,
            usage_ratio=disk_usage(),
            force=force,
            settings=settings,
        )
        if not due:
            break
        head = _head_after_first_segment(data, head, end_index, header_at)
        before_delete(head)
        data.delete_head(head.begin_pos, 1)
        index.delete_head(head.begin_index * INDEX_UNIT_SIZE, len(index.files))
        adopt(head)
        deleted += 1
    return deleted


def _head_after_first_segment(
    data: MmapFileList, head: LogHead, end_index: int, header_at: Callable[[int], EntryHeader]
) -> LogHead:
    """Where the log begins once its first segment is gone: the second segment's first
    entry (or the log end, when the second segment holds none yet)."""
    nxt = data.files[1]
    # the second segment holds no entry yet: the log begins at its end
    new_begin = end_index + 1 if nxt.start >= data.end else decode_header(nxt.mm, 0).index
    if new_begin > head.begin_index:
        before = header_at(new_begin - 1)
        term, chain = before.term, before.chain_crc
    else:  # the head held no entry, only padding after a reset (an installed snapshot)
        term, chain = head.before_begin_term, head.before_begin_chain
    return LogHead(new_begin, nxt.start, term, chain)
