"""``dledger.store.retention`` alone: the rule for the oldest segment as a pure
function (age, disk ratio, floor, force), and the head deletion over segment lists a
``FileStore`` wrote: the bound per call, the active segment, the new log head. (Through
the whole store, with its clock and checkpoint: ``test_file_store``'s retention tests.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreSettings
from dledger.store.entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    EntryHeader,
    EntryMeta,
    decode_header,
    decode_index_unit,
)
from dledger.store.mmapfile import MmapFileList
from dledger.store.retention import (
    LogHead,
    delete_head_segments,
    head_segment_due,
    retention_floor_pos,
)

SEG = 1024
INDEX_SEG = 32 * 8
SETTINGS = StoreSettings(
    data_file_size=SEG,
    index_file_size=INDEX_SEG,
    file_reserved_hours=1.0,
    disk_clean_ratio=0.85,
    max_files_deleted_per_clean=2,
)
HOUR_S = 3600.0


@pytest.mark.parametrize(
    ("limit_pos", "age_h", "usage", "force", "due"),
    [
        (1024, 0.5, 0.10, False, False),  # young, room on the disk: stays
        (1024, 1.5, 0.10, False, True),  # older than file_reserved_hours
        (1024, 0.5, 0.90, False, True),  # disk above disk_clean_ratio
        (1024, 0.5, 0.10, True, True),  # forced
        (2048, 1.5, 0.90, True, False),  # holds a byte at or above the floor: never
    ],
)
def test_head_segment_due(
    limit_pos: int, age_h: float, usage: float, force: bool, due: bool
) -> None:
    got = head_segment_due(
        limit_pos=limit_pos,
        floor_pos=2047,
        age_s=age_h * HOUR_S,
        usage_ratio=usage,
        force=force,
        settings=SETTINGS,
    )
    assert got is due


def test_the_floor_is_the_lower_of_committed_and_the_callers() -> None:
    assert retention_floor_pos(5000, None) == 5000
    assert retention_floor_pos(5000, 3000) == 3000
    assert retention_floor_pos(5000, 9000) == 5000  # never past committed data


@pytest.fixture
def log(tmp_path: Path) -> Iterator[tuple[MmapFileList, MmapFileList, list[EntryMeta]]]:
    """A 5-segment log of terms 1 then 2 (7 entries a segment), all committed."""
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        metas = list(s.append_as_leader(1, [b"a" * 100] * 15))
        metas += s.append_as_leader(2, [b"b" * 100] * 15)
        s.update_committed(len(metas) - 1)
    data = MmapFileList(tmp_path / "data", SEG)
    index = MmapFileList(tmp_path / "index", INDEX_SEG)
    data.load()
    index.load()
    data.set_end(metas[-1].pos + metas[-1].size)
    index.set_end(len(metas) * INDEX_UNIT_SIZE)
    yield data, index, metas
    data.close()
    index.close()


def _delete(
    lists: tuple[MmapFileList, MmapFileList, list[EntryMeta]],
    *,
    floor_pos: int,
    now_s: float,
    usage: list[float] | None = None,
    force: bool = False,
) -> tuple[int, LogHead]:
    data, index, metas = lists
    readings = iter(usage or [])

    def disk_usage() -> float:
        return next(readings, 0.0)

    def header_at(i: int) -> EntryHeader:
        u = decode_index_unit(index.read(i * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE))
        return decode_header(data.read(u.pos, BODY_OFFSET))

    heads = [LogHead(0, 0, -1, 0)]

    def before_delete(head: LogHead) -> None:
        # the store writes the new head's checkpoint here: the segment is still there
        assert data.files[0].limit <= head.begin_pos and data.files[0].path.exists()
        intents.append(head)

    intents: list[LogHead] = []
    deleted = delete_head_segments(
        data,
        index,
        heads[0],
        end_index=len(metas) - 1,
        floor_pos=floor_pos,
        now_s=now_s,
        settings=SETTINGS,
        disk_usage=disk_usage,
        force=force,
        header_at=header_at,
        before_delete=before_delete,
        adopt=heads.append,
    )
    assert len(heads) == deleted + 1  # the store is told of every new head
    assert intents == heads[1:]  # each made durable before its segment went
    return deleted, heads[-1]


def _mtime(data: MmapFileList) -> float:
    return os.stat(data.files[0].path).st_mtime


def test_forced_deletion_is_bounded_per_call_and_moves_the_log_head(
    log: tuple[MmapFileList, MmapFileList, list[EntryMeta]],
) -> None:
    data, index, metas = log
    deleted, head = _delete(log, floor_pos=10 * SEG, now_s=_mtime(data), force=True)
    assert deleted == SETTINGS.max_files_deleted_per_clean == 2
    first = next(m for m in metas if m.pos >= 2 * SEG)  # the third segment's first entry
    before = metas[first.index - 1]
    assert head.begin_index == first.index and head.begin_pos == 2 * SEG
    assert head.before_begin_term == before.term == 1
    assert data.begin == 2 * SEG
    # the index segments wholly before the new head's unit went too
    assert index.begin <= first.index * INDEX_UNIT_SIZE < index.begin + INDEX_SEG


def test_young_segments_stay_until_they_age(
    log: tuple[MmapFileList, MmapFileList, list[EntryMeta]],
) -> None:
    data = log[0]
    now_s = _mtime(data)
    assert _delete(log, floor_pos=10 * SEG, now_s=now_s + 0.5 * HOUR_S)[0] == 0
    assert _delete(log, floor_pos=10 * SEG, now_s=now_s + 1.5 * HOUR_S)[0] == 2


def test_disk_pressure_is_asked_again_after_each_deletion(
    log: tuple[MmapFileList, MmapFileList, list[EntryMeta]],
) -> None:
    data = log[0]
    # above disk_clean_ratio, then below it once one segment is gone
    deleted, head = _delete(log, floor_pos=10 * SEG, now_s=_mtime(data), usage=[0.9, 0.5])
    assert deleted == 1 and head.begin_pos == SEG


def test_never_past_the_floor_nor_the_active_segment(
    log: tuple[MmapFileList, MmapFileList, list[EntryMeta]],
) -> None:
    data, _, metas = log
    assert _delete(log, floor_pos=SEG - 1, now_s=_mtime(data), force=True)[0] == 0
    for _ in range(5):  # as many calls as there are segments
        _delete(log, floor_pos=1 << 40, now_s=_mtime(data), force=True)
    assert len(data.files) == 1 and data.files[0].start <= metas[-1].pos  # the active one
