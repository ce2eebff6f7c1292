"""KeyIndex: keys → candidate commitlog offsets; rolling, time ranges, truncation, crashes."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from consumequeue import ConsumeQueueError, KeyIndex, KeyIndexSettings, key_hash
from consumequeue.keyindex import COUNT, COUNT_POS, HEADER_SIZE

TINY = KeyIndexSettings(
    slots_per_file=4, max_entries_per_file=8, max_query_results=16, max_keys_per_message=4
)
T0 = 1_700_000_000_000


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_put_and_query_every_key_of_a_message(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    assert index.last_commitlog_offset == -1 and index.query("k1", 10) == []
    index.put(["k1", "k2", "", "k1"], 100, T0)  # empty and repeated keys are skipped
    index.put(["k2"], 200, T0 + 1)
    assert index.query("k1", 10) == [100]
    assert index.query("k2", 10) == [200, 100]  # newest first
    assert index.query("k3", 10) == []
    assert index.last_commitlog_offset == 200
    index.close()


def test_one_slot_chains_every_key_and_keeps_them_apart(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, KeyIndexSettings(slots_per_file=1, max_entries_per_file=100))
    for n in range(20):
        index.put([f"key{n % 3}"], 48 + n, T0 + n)
    assert index.query("key1", 100) == [48 + n for n in range(19, -1, -1) if n % 3 == 1]
    index.close()


def test_a_hash_collision_is_a_candidate_the_caller_must_check(tmp_path: Path) -> None:
    assert zlib.crc32(b"plumless") == zlib.crc32(b"buckeroo") == key_hash("plumless")
    index = KeyIndex(tmp_path, TINY)
    index.put(["plumless"], 100, T0)
    index.put(["buckeroo"], 200, T0)
    assert index.query("plumless", 10) == [200, 100]
    index.put(["plumless", "buckeroo"], 300, T0)  # one message, two entries: one result
    assert index.query("buckeroo", 10) == [300, 200, 100]
    index.close()


def test_files_roll_when_full_and_queries_go_newest_first(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)  # two entries per message
    assert names(tmp_path) == [f"{1000 + 4 * k:020d}" for k in range(3)]
    assert index.file_count == 3
    assert index.query("order", 100) == [1000 + n for n in range(9, -1, -1)]
    assert index.query("id3", 100) == [1003]
    index.close()


def test_a_store_time_far_from_the_file_start_rolls(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["k"], 100, T0)
    index.put(["k"], 200, T0 + 2**31)  # the i32 delta would overflow
    index.put(["k"], 300, T0 - 2**31 - 1)  # a master whose clock is behind
    assert index.file_count == 3
    assert index.query("k", 10) == [300, 200, 100]
    assert index.query("k", 10, begin_ms=T0 + 1) == [200]
    index.close()


def test_time_range_and_result_bounds(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(12):
        index.put(["k"], 100 + n, T0 + 10 * n)
    assert index.query("k", 100, begin_ms=T0 + 20, end_ms=T0 + 50) == [105, 104, 103, 102]
    assert index.query("k", 100, begin_ms=T0 + 21, end_ms=T0 + 29) == []
    assert index.query("k", 100, begin_ms=T0 + 200) == []
    assert index.query("k", 3) == [111, 110, 109]
    assert index.query("k", 0) == [] and index.query("k", -1) == []
    assert len(index.query("k", 10**6)) == 12  # the setting caps at 16, 12 exist
    small = KeyIndex(tmp_path / "capped", TINY.__class__(max_query_results=5))
    for n in range(8):
        small.put(["k"], 100 + n, T0)
    assert small.query("k", 100) == [107, 106, 105, 104, 103]
    small.close()
    index.close()


def test_re_put_is_idempotent(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["a"], 100, T0)
    index.put(["b"], 200, T0)
    index.put(["a"], 200, T0)  # a re-dispatch of the last message
    index.put(["a"], 50, T0)  # an older one
    assert index.query("a", 10) == [100] and index.last_commitlog_offset == 200
    index.close()


def test_too_many_keys_index_the_first_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put([f"k{n}" for n in range(6)], 100, T0)
    assert index.query("k3", 10) == [100] and index.query("k4", 10) == []
    assert "has 6 keys; indexing the first 4" in caplog.text
    index.close()


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)
    index.flush()
    index.close()
    index = KeyIndex(tmp_path, TINY)
    assert index.last_commitlog_offset == 1009 and index.file_count == 3
    assert index.query("order", 100) == [1000 + n for n in range(9, -1, -1)]
    index.put(["order"], 1010, T0)
    assert index.query("order", 1) == [1010]
    index.close()


def test_delete_files_below_never_takes_the_newest(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)
    assert index.delete_files_below(1004) == 1  # the first file ends at 1003
    assert index.query("order", 100) == [1000 + n for n in range(9, 3, -1)]
    assert index.delete_files_below(10**9) == 1
    assert names(tmp_path) == [f"{1008:020d}"]
    assert index.query("order", 100) == [1009, 1008]
    index.close()


def test_truncate_dirty_tail_forgets_entries_and_lets_them_be_re_indexed(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)
    index.truncate_dirty_tail(1006)  # the last file goes, the middle one is cut
    assert names(tmp_path) == [f"{1000:020d}", f"{1004:020d}"]
    assert index.last_commitlog_offset == 1005
    assert index.query("order", 100) == [1005, 1004, 1003, 1002, 1001, 1000]
    assert index.query("id7", 100) == [] and index.query("id6", 100) == []
    index.put(["other", "id6"], 1006, T0)
    assert index.query("id6", 100) == [1006] and index.query("order", 1) == [1005]
    index.close()
    index = KeyIndex(tmp_path, TINY)
    assert index.query("id6", 100) == [1006] and index.query("other", 100) == [1006]
    index.truncate_dirty_tail(0)
    assert index.last_commitlog_offset == -1 and names(tmp_path) == []
    assert index.query("order", 100) == []
    index.close()


def _set_count(path: Path, count: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, COUNT.pack(count), COUNT_POS)
    finally:
        os.close(fd)


def test_entries_beyond_the_count_after_a_crash_are_undone(tmp_path: Path) -> None:
    settings = KeyIndexSettings(slots_per_file=2, max_entries_per_file=50, max_keys_per_message=4)
    index = KeyIndex(tmp_path, settings)
    for n in range(5):
        index.put(["k", f"id{n}"], 100 + n, T0)
    index.close()
    # A crash after the last two messages' entries and slots, before their count.
    _set_count(tmp_path / f"{100:020d}", 6)
    index = KeyIndex(tmp_path, settings)
    assert index.last_commitlog_offset == 102
    assert index.query("k", 100) == [102, 101, 100]
    assert index.query("id4", 100) == []
    index.put(["k", "id4"], 104, T0)
    assert index.query("k", 100) == [104, 102, 101, 100]
    index.close()


def test_a_file_that_crashed_before_its_first_entry_counted_is_dropped(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["a", "b", "c", "d"], 100, T0)
    index.put(["e", "g", "h", "i"], 200, T0)
    index.put(["f"], 300, T0)  # the first file is full: a second one
    assert index.file_count == 2
    index.close()
    newest = sorted(tmp_path.iterdir())[-1]
    _set_count(newest, 0)
    (tmp_path / "00000000000000000999.tmp").write_bytes(b"half")
    index = KeyIndex(tmp_path, TINY)
    assert index.file_count == 1 and index.last_commitlog_offset == 200
    assert index.query("f", 10) == [] and not any(p.suffix for p in tmp_path.iterdir())
    index.close()


def test_a_bad_header_names_the_file(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["a"], 100, T0)
    index.close()
    path = tmp_path / f"{100:020d}"
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"XXXX", 0)
    os.close(fd)
    with pytest.raises(ConsumeQueueError, match=rf"{path.name}: bad magic"):
        KeyIndex(tmp_path, TINY)
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"LMKI", 0)
    os.close(fd)
    os.truncate(path, HEADER_SIZE + 3)
    with pytest.raises(ConsumeQueueError, match="does not match its header"):
        KeyIndex(tmp_path, TINY)


def test_a_slot_pointing_past_the_entries_is_corruption(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["a"], 100, T0)
    index.close()
    path = tmp_path / f"{100:020d}"
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, (7).to_bytes(4, "big"), HEADER_SIZE)  # slot 0 → entry 7, never written
    os.close(fd)
    with pytest.raises(ConsumeQueueError, match="points beyond"):
        KeyIndex(tmp_path, TINY)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_entries_per_file"):
        KeyIndexSettings(max_entries_per_file=3, max_keys_per_message=4)
    with pytest.raises(ValueError, match="slots_per_file"):
        KeyIndexSettings(slots_per_file=0)
