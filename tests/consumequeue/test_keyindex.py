"""KeyIndex: keys → candidate commitlog offsets; rolling, time ranges, truncation, process
crashes, power loss (any subset of the sectors written since a flush), damaged files."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest

from consumequeue import KeyIndex, KeyIndexSettings, key_hash
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


def test_a_damaged_file_is_dropped_with_every_newer_one_never_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = KeyIndex(tmp_path, TINY)
    for n in range(10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)  # files at 1000, 1004, 1008
    position = index.position()
    index.flush()
    index.close()
    middle = tmp_path / f"{1004:020d}"
    fd = os.open(middle, os.O_RDWR)
    os.pwrite(fd, bytes(HEADER_SIZE), 0)  # a header that never reached the disk
    os.close(fd)
    index = KeyIndex(tmp_path, TINY)
    assert f"{middle.name}: bad magic 0x0" in caplog.text
    assert index.dropped == [f"{1004:020d}", f"{1008:020d}"]
    assert names(tmp_path) == [f"{1000:020d}"] and index.last_commitlog_offset == 1003
    assert not index.restore(position)  # the recorded file is gone: index again from 1004
    for n in range(4, 10):
        index.put(["order", f"id{n}"], 1000 + n, T0 + n)
    assert index.query("order", 100) == [1000 + n for n in range(9, -1, -1)]
    index.close()
    os.truncate(tmp_path / f"{1000:020d}", HEADER_SIZE + 3)
    index = KeyIndex(tmp_path, TINY)
    assert "does not match its header" in caplog.text and index.file_count == 0
    index.close()


def test_a_slot_pointing_past_the_entries_is_recomputed(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, TINY)
    index.put(["a"], 100, T0)
    index.put(["b"], 200, T0)
    index.close()
    path = tmp_path / f"{100:020d}"
    slot = HEADER_SIZE + 4 * (key_hash("a") % TINY.slots_per_file)
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, (7).to_bytes(4, "big"), slot)  # → entry 7, never written
    os.close(fd)
    index = KeyIndex(tmp_path, TINY)
    assert index.query("a", 10) == [100] and index.query("b", 10) == [200]
    index.close()


SECTOR = 512


def _power_loss(rng: random.Random, synced: dict[str, bytes], directory: Path) -> None:
    """Every 512-byte sector written since the flush reached the disk or not; files
    created since then come back as a prefix of them (the newest ones may be lost)."""
    new = sorted(p.name for p in directory.iterdir() if p.name not in synced)
    for name in new[rng.randint(0, len(new)) :]:
        (directory / name).unlink()
    for p in sorted(directory.iterdir()):
        now = p.read_bytes()
        was = synced.get(p.name, b"").ljust(len(now), b"\0")
        out = bytearray(now)
        for at in range(0, len(now), SECTOR):
            if rng.random() < 0.5:
                out[at : at + SECTOR] = was[at : at + SECTOR]
        p.write_bytes(out)


def _image(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("seed", range(40))
def test_restore_after_a_power_loss_gives_the_files_of_the_flush(tmp_path: Path, seed: int) -> None:
    """Whatever subset of the sectors written after a flush survives, ``restore`` of the
    position recorded with the flush gives back exactly the flushed files, and indexing
    the same messages again gives the files an uncrashed index has."""
    rng = random.Random(seed)
    settings = KeyIndexSettings(slots_per_file=64, max_entries_per_file=120)
    messages = [
        ([f"k{rng.randint(0, 90)}" for _ in range(rng.randint(1, 3))], 48 + 100 * n, T0 + n)
        for n in range(rng.randint(60, 200))
    ]
    flushed_at = rng.randint(1, len(messages) - 1)
    live = KeyIndex(tmp_path / "live", settings)
    for m in messages:
        live.put(*m)
    live.flush()
    crashed_dir = tmp_path / "crashed"
    index = KeyIndex(crashed_dir, settings)
    for m in messages[:flushed_at]:
        index.put(*m)
    index.flush()
    position, synced = index.position(), _image(crashed_dir)
    for m in messages[flushed_at:]:
        index.put(*m)
    index.close()
    _power_loss(rng, synced, crashed_dir)
    index = KeyIndex(crashed_dir, settings)
    assert index.restore(position)
    index.flush()
    assert _image(crashed_dir) == synced
    for m in messages:
        index.put(*m)
    index.flush()
    assert _image(crashed_dir) == _image(tmp_path / "live")
    index.close()
    live.close()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_entries_per_file"):
        KeyIndexSettings(max_entries_per_file=3, max_keys_per_message=4)
    with pytest.raises(ValueError, match="slots_per_file"):
        KeyIndexSettings(slots_per_file=0)
