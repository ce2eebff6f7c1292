"""ConsumeQueue: units by queue offset, idempotent dispatch, recovery, retention, reset."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumequeue import (
    UNIT_SIZE,
    ConsumeQueue,
    ConsumeQueueError,
    ConsumeQueueGapError,
    ConsumeQueueSettings,
)
from consumequeue.queue import UNIT
from dledger.store.mmapfile import segment_name

SMALL = ConsumeQueueSettings(segment_units=4)
SEGMENT = SMALL.segment_bytes


def unit(n: int) -> tuple[int, int, int]:
    """Unit of the n-th message: 100-byte messages back to back from offset 48."""
    return 48 + 100 * n, 100, n % 3 - 1


def open_queue(root: Path, settings: ConsumeQueueSettings = SMALL) -> ConsumeQueue:
    return ConsumeQueue(root, "T", 0, settings)


def filled(root: Path, n: int, settings: ConsumeQueueSettings = SMALL) -> ConsumeQueue:
    q = open_queue(root, settings)
    for i in range(n):
        assert q.put(i, *unit(i))
    return q


def segments(q: ConsumeQueue) -> list[str]:
    return sorted(p.name for p in q.path.iterdir() if p.name.isdigit())


def test_put_get_read_across_segments(tmp_path: Path) -> None:
    q = filled(tmp_path, 10)
    assert q.path == tmp_path / "T" / "0"
    assert segments(q) == [segment_name(k * SEGMENT) for k in range(3)]
    assert (q.min_offset, q.max_offset) == (0, 10)
    assert [q.get(i) for i in range(10)] == [unit(i) for i in range(10)]
    assert q.get(10) is None and q.get(-1) is None
    assert q.read(0, 100) == [(i, *unit(i)) for i in range(10)]
    assert q.read(3, 6) == [(i, *unit(i)) for i in range(3, 9)]
    assert q.read(10, 5) == [] and q.read(2, 0) == []
    assert q.max_commitlog_offset_end == unit(9)[0] + 100
    q.close()


def test_read_is_bounded_by_the_setting(tmp_path: Path) -> None:
    q = filled(tmp_path, 10, ConsumeQueueSettings(segment_units=4, max_read_units=3))
    assert [u[0] for u in q.read(1, 1000)] == [1, 2, 3]
    q.close()


def test_read_raw_is_read_as_bytes(tmp_path: Path) -> None:
    q = filled(tmp_path, 10, ConsumeQueueSettings(segment_units=4, max_read_units=5))
    for start, n in ((0, 100), (3, 4), (2, 5), (9, 3), (10, 2), (4, 0)):
        first, raw = q.read_raw(start, n)
        units = q.read(start, n)
        assert raw == b"".join(UNIT.pack(*u[1:]) for u in units), (start, n)
        assert first == start and len(raw) == UNIT_SIZE * len(units)
    q.correct_min_offset(unit(6)[0])
    assert q.read_raw(0, 2) == (6, UNIT.pack(*unit(6)) + UNIT.pack(*unit(7)))
    q.close()


def test_unit_bytes_are_the_design_format(tmp_path: Path) -> None:
    q = filled(tmp_path, 2)
    q.flush()
    data = (q.path / segment_name(0)).read_bytes()
    assert len(data) == SEGMENT
    assert data[UNIT_SIZE : 2 * UNIT_SIZE] == (148).to_bytes(8, "big") + (100).to_bytes(
        4, "big"
    ) + (0).to_bytes(8, "big", signed=True)
    assert data[2 * UNIT_SIZE :] == bytes(SEGMENT - 2 * UNIT_SIZE)
    q.close()


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    q = filled(tmp_path, 9)
    q.flush()
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (0, 9)
    assert q.read(0, 100) == [(i, *unit(i)) for i in range(9)]
    assert q.max_commitlog_offset_end == unit(8)[0] + 100
    assert q.put(9, *unit(9)) and q.get(9) == unit(9)
    q.close()


def test_empty_queue(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset, q.max_commitlog_offset_end) == (0, 0, -1)
    assert q.read(0, 10) == [] and q.get(0) is None
    assert q.first_offset_at_or_after(lambda c, s: True) == 0
    q.close()


def test_put_is_idempotent_and_a_different_unit_is_an_error(tmp_path: Path) -> None:
    q = filled(tmp_path, 6)
    assert q.put(2, *unit(2)) is False
    assert q.put(5, *unit(5)) is False
    with pytest.raises(ConsumeQueueError, match=r"T/0: queue offset 3 holds"):
        q.put(3, unit(3)[0], 99, unit(3)[2])
    assert q.put_batch(4, [unit(4), unit(5), unit(6), unit(7)]) == 2
    assert q.max_offset == 8 and q.read(0, 100) == [(i, *unit(i)) for i in range(8)]
    q.close()


def test_put_past_the_end_is_a_gap(tmp_path: Path) -> None:
    q = filled(tmp_path, 3)
    with pytest.raises(ConsumeQueueGapError) as info:
        q.put(5, *unit(5))
    assert (info.value.expected, info.value.given) == (3, 5)
    assert isinstance(info.value, ConsumeQueueError) and "T/0" in str(info.value)
    assert q.max_offset == 3
    q.close()


@pytest.mark.parametrize(
    ("commitlog_offset", "size"),
    [(unit(2)[0] + 99, 100), (unit(3)[0], 0), (-1, 10)],
    ids=["overlaps-previous", "zero-size", "negative"],
)
def test_put_refuses_a_unit_that_breaks_the_order(
    tmp_path: Path, commitlog_offset: int, size: int
) -> None:
    q = filled(tmp_path, 3)
    with pytest.raises(ConsumeQueueError, match="must have size > 0"):
        q.put(3, commitlog_offset, size, 0)
    assert q.max_offset == 3
    q.close()


def test_the_units_of_a_batch_record_repeat_it_and_survive_reopen(tmp_path: Path) -> None:
    """A batch record's messages each have a unit naming the record (broker.batch): a
    unit may repeat the previous one's record, never start inside it otherwise."""
    q = filled(tmp_path, 2)
    record = (unit(2)[0], 500)
    for i in range(2, 7):  # five messages of one record, across a segment boundary
        assert q.put(i, *record, i)
    with pytest.raises(ConsumeQueueError, match="repeat its record"):
        q.put(7, record[0] + 1, 499 - 1, 0)  # inside the record, ending elsewhere
    assert q.put(7, record[0] + 500, 100, 0)
    q.close()
    q = open_queue(tmp_path)
    assert q.max_offset == 8
    assert [u[1:3] for u in q.read(2, 6)] == [record] * 5 + [(record[0] + 500, 100)]
    assert q.truncate_dirty_tail(record[0]) == 2  # the whole record's units go together
    q.close()


def _write(path: Path, pos: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, pos)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x07" * 7,  # a partial unit
        (10**6).to_bytes(8, "big"),  # offset written, size not
        UNIT.pack(5, 100, 0),  # a whole unit that goes backwards
    ],
    ids=["partial", "offset-only", "backwards"],
)
def test_recovery_drops_a_torn_unit_and_zeroes_it(tmp_path: Path, garbage: bytes) -> None:
    q = filled(tmp_path, 6)
    q.close()
    last = tmp_path / "T" / "0" / segment_name(SEGMENT)
    _write(last, 2 * UNIT_SIZE, garbage)
    q = open_queue(tmp_path)
    assert q.max_offset == 6 and q.read(0, 100) == [(i, *unit(i)) for i in range(6)]
    assert last.read_bytes()[2 * UNIT_SIZE :] == bytes(2 * UNIT_SIZE)
    assert q.put(6, *unit(6)) and q.get(6) == unit(6)
    q.close()


def test_recovery_cuts_a_short_file_back_to_whole_units(tmp_path: Path) -> None:
    q = filled(tmp_path, 7)
    q.close()
    last = tmp_path / "T" / "0" / segment_name(SEGMENT)
    os.truncate(last, 2 * UNIT_SIZE + 13)  # unit 6 torn: 13 of its 20 bytes
    q = open_queue(tmp_path)
    assert q.max_offset == 6 and q.get(5) == unit(5)
    assert last.stat().st_size == SEGMENT
    q.close()


def test_recovery_stops_at_a_hole_and_zeroes_what_follows(tmp_path: Path) -> None:
    """A power loss can drop a page of the unsynced tail but keep a later one."""
    q = filled(tmp_path, 11)
    q.close()
    middle = tmp_path / "T" / "0" / segment_name(SEGMENT)
    _write(middle, UNIT_SIZE, bytes(UNIT_SIZE))  # unit 5 lost, 6.. kept
    q = open_queue(tmp_path)
    assert q.max_offset == 5
    assert segments(q) == [segment_name(0), segment_name(SEGMENT)]
    assert middle.read_bytes()[UNIT_SIZE:] == bytes(SEGMENT - UNIT_SIZE)
    assert q.put(5, *unit(5))
    q.close()


def test_recovery_of_a_full_last_segment_and_an_empty_one(tmp_path: Path) -> None:
    q = filled(tmp_path, 8)  # exactly two full segments
    q.close()
    (tmp_path / "T" / "0" / segment_name(2 * SEGMENT)).write_bytes(b"")  # creation crash
    q = open_queue(tmp_path)
    assert q.max_offset == 8 and segments(q) == [segment_name(0), segment_name(SEGMENT)]
    assert q.put(8, *unit(8)) and q.read(7, 5) == [(7, *unit(7)), (8, *unit(8))]
    q.close()


def test_load_refuses_strangers_and_gaps(tmp_path: Path) -> None:
    q = filled(tmp_path, 9)
    q.close()
    (tmp_path / "T" / "0" / segment_name(SEGMENT)).unlink()
    with pytest.raises(ConsumeQueueError, match="not contiguous"):
        open_queue(tmp_path)
    (tmp_path / "T" / "0" / "notes.txt").write_text("hi")
    with pytest.raises(ConsumeQueueError, match="unexpected file"):
        open_queue(tmp_path)


def _store_time(commitlog_offset: int, times: list[int]) -> int:
    return times[(commitlog_offset - 48) // 100]


@given(
    steps=st.lists(st.integers(0, 3), min_size=0, max_size=30),
    target=st.integers(-1, 100),
    head=st.integers(0, 5),
)
def test_first_offset_at_or_after_matches_a_linear_scan(
    tmp_path_factory: pytest.TempPathFactory, steps: list[int], target: int, head: int
) -> None:
    times = [sum(steps[: i + 1]) for i in range(len(steps))]  # non-decreasing store times
    q = filled(tmp_path_factory.mktemp("cq"), len(times))
    q.correct_min_offset(unit(min(head, len(times)))[0])
    found = q.first_offset_at_or_after(lambda c, _s: _store_time(c, times) >= target)
    expected = next(
        (i for i in range(q.min_offset, q.max_offset) if times[i] >= target), q.max_offset
    )
    assert found == expected
    q.destroy()


def test_truncate_dirty_tail_across_segments(tmp_path: Path) -> None:
    q = filled(tmp_path, 11)
    assert q.truncate_dirty_tail(unit(11)[0]) == 11  # nothing at or after it
    assert q.truncate_dirty_tail(unit(5)[0] + 1) == 6  # a unit is dropped by its start
    assert segments(q) == [segment_name(0), segment_name(SEGMENT)]
    assert q.max_commitlog_offset_end == unit(5)[0] + 100
    assert q.get(6) is None
    assert q.put(6, *unit(6))
    q.flush()
    q.close()
    q = open_queue(tmp_path)
    assert q.max_offset == 7 and q.read(0, 100) == [(i, *unit(i)) for i in range(7)]
    assert q.truncate_dirty_tail(unit(4)[0]) == 4  # to a segment boundary
    q.close()
    q = open_queue(tmp_path)
    assert q.max_offset == 4 and segments(q) == [segment_name(0)]
    assert q.truncate_dirty_tail(0) == 0 and q.max_commitlog_offset_end == -1
    assert q.put(0, *unit(0))
    q.close()


def test_truncate_to_a_recorded_length_ignores_what_the_units_say(tmp_path: Path) -> None:
    """Recovery cuts a queue to the length its checkpoint recorded, without a search
    through units written after it (a power loss may have torn them)."""
    q = filled(tmp_path, 11)
    q.flush()
    _write(q.path / segment_name(SEGMENT), 20, b"\xff" * 20)  # unit 5: torn, say
    q.close()
    q = open_queue(tmp_path)
    assert q.truncate(5) == 5 and q.read(0, 100) == [(i, *unit(i)) for i in range(5)]
    assert q.truncate(9) == 5  # never longer
    assert segments(q) == [segment_name(0), segment_name(SEGMENT)]
    q.close()
    q = open_queue(tmp_path)
    assert q.max_offset == 5 and q.max_commitlog_offset_end == unit(4)[0] + 100
    q.close()


def test_correct_min_offset_deletes_head_files_and_survives_reopen(tmp_path: Path) -> None:
    q = filled(tmp_path, 11)
    assert q.correct_min_offset(unit(6)[0] - 10) == 6
    assert segments(q) == [segment_name(SEGMENT), segment_name(2 * SEGMENT)]
    assert q.get(5) is None and q.get(6) == unit(6)
    assert q.read(0, 2) == [(6, *unit(6)), (7, *unit(7))]
    assert q.put(3, *unit(3)) is False  # below the head: already gone
    assert q.correct_min_offset(0) == 6  # never back
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (4, 11)  # the first file on disk ...
    assert q.correct_min_offset(unit(6)[0]) == 6  # ... until the broker re-derives it
    q.close()


def test_correct_min_offset_past_every_unit_keeps_the_last_segment(tmp_path: Path) -> None:
    q = filled(tmp_path, 10)
    assert q.correct_min_offset(unit(50)[0]) == 10
    assert (q.min_offset, q.max_offset, q.max_commitlog_offset_end) == (10, 10, -1)
    assert segments(q) == [segment_name(2 * SEGMENT)]
    assert q.read(0, 10) == []
    assert q.put(10, *unit(10)) and q.read(0, 10) == [(10, *unit(10))]
    q.close()


def test_reset_restarts_empty_at_the_offset_and_survives_reopen(tmp_path: Path) -> None:
    q = filled(tmp_path, 6)
    q.reset(17)
    assert (q.min_offset, q.max_offset, q.max_commitlog_offset_end) == (17, 17, -1)
    assert segments(q) == []
    q.close()
    q = open_queue(tmp_path)  # no segment yet: the reset point is remembered
    assert (q.min_offset, q.max_offset) == (17, 17)
    with pytest.raises(ConsumeQueueGapError):
        q.put(18, *unit(18))
    assert q.put(16, *unit(16)) is False
    assert q.put(17, *unit(17)) and q.put(18, *unit(18))
    assert segments(q) == [segment_name(16 * UNIT_SIZE)]  # units 16..19, 16 never written
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (17, 19)
    assert q.read(0, 10) == [(17, *unit(17)), (18, *unit(18))]
    q.reset(0)
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (0, 0)
    q.close()


def test_destroy_removes_the_directory(tmp_path: Path) -> None:
    q = filled(tmp_path, 5)
    q.destroy()
    assert not q.path.exists() and q.closed


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="segment_units"):
        ConsumeQueueSettings(segment_units=0)
    assert ConsumeQueueSettings().segment_bytes == 6_000_000


def test_segments_below_the_reset_point_are_leftovers(tmp_path: Path) -> None:
    """A crash between a reset writing its point and deleting the old files."""
    q = filled(tmp_path, 6)
    q.close()
    (tmp_path / "T" / "0" / "reset_offset").write_text("40\n")
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (40, 40) and segments(q) == []
    assert q.put(40, *unit(40))
    q.close()


# ---- issue 31: what an idle queue costs -------------------------------------------------


def _allocated(q: ConsumeQueue) -> int:
    return sum(os.stat(f.path).st_blocks * 512 for f in q._files.files)


def test_a_new_segment_is_sparse_and_its_blocks_grow_ahead_of_the_writes(tmp_path: Path) -> None:
    """A queue of 6 MB segments holding a few units takes a page of disk, not 6 MB; the
    chunks double as it fills (at most ``max_reserve_units``), and every unit written is
    in allocated blocks."""
    settings = ConsumeQueueSettings(max_reserve_units=1024)  # 20 KiB chunks at most
    q = open_queue(tmp_path, settings)
    assert q.put(0, *unit(0))
    f = q._files.files[0]
    assert os.stat(f.path).st_size == settings.segment_bytes
    assert _allocated(q) <= 2 * os.sysconf("SC_PAGE_SIZE")
    for i in range(1, 5000):
        assert q.put(i, *unit(i))
        assert f.reserved >= f.wrote
    assert 5000 * UNIT_SIZE <= _allocated(q) <= 5000 * UNIT_SIZE + 1024 * UNIT_SIZE + 8192
    q.close()
    q = open_queue(tmp_path, settings)  # a restart reads and extends the sparse segment
    assert (q.min_offset, q.max_offset) == (0, 5000)
    assert q.read(4990, 20) == [(i, *unit(i)) for i in range(4990, 5000)]
    assert q.put(5000, *unit(5000))
    q.close()


def test_a_full_disk_fails_the_put_before_anything_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks are allocated before a store through the mapping (a store into a hole of a
    full disk would be SIGBUS): ``ENOSPC`` is an ``OSError`` of ``put`` that leaves the
    queue as it was, and the same put succeeds once there is space."""
    q = filled(tmp_path, 3, ConsumeQueueSettings(segment_units=300_000, max_reserve_units=1))
    f = q._files.files[0]
    f.reserved = f.wrote  # the next put must allocate
    real = os.posix_fallocate

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError):
        q.put(3, *unit(3))
    assert q.max_offset == 3 and q.get(3) is None
    monkeypatch.setattr(os, "posix_fallocate", real)
    assert q.put(3, *unit(3))
    assert q.get(3) == unit(3)
    q.close()


def test_segments_are_mapped_for_random_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault reads in one page, not the device's read-around window (which zero-filled
    a whole new segment on its first store): every mapping, new or loaded, is advised."""
    advised: list[int] = []
    real = mmap.mmap.madvise

    class Spy(mmap.mmap):
        def madvise(self, option: int, *args: int) -> None:
            advised.append(option)
            real(self, option, *args)

    monkeypatch.setattr(mmap, "mmap", Spy)
    q = filled(tmp_path, 6)  # two segments
    q.close()
    q = open_queue(tmp_path)
    q.close()
    assert advised == [mmap.MADV_RANDOM] * 4
