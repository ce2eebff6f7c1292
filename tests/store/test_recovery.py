"""``dledger.store.recovery.recover_log`` alone, over segment lists a ``FileStore`` wrote
(docs/formats.md): the torn tail, a CRC failure inside and outside the committed prefix,
and the bounds the checkpoint sets on the scan. (The 500 seeded crash cases through the
whole store are ``test_crash_recovery``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreCorruptionError, StoreSettings
from dledger.store.entry import BODY_OFFSET, EntryMeta
from dledger.store.meta import Checkpoint, CheckpointFile
from dledger.store.mmapfile import MmapFileList, segment_name
from dledger.store.recovery import RecoveredLog, recover_log

SEG = 1024
INDEX_SEG = 32 * 8
SETTINGS = StoreSettings(data_file_size=SEG, index_file_size=INDEX_SEG, flush="sync")
N = 20  # entries: with 100-byte bodies, 7 per segment, so the log spans 3 segments


def _write(root: Path, *, committed: int) -> list[EntryMeta]:
    s = FileStore(root, SETTINGS, background=False)
    metas = list(s.append_as_leader(1, [bytes([i]) * 100 for i in range(N // 2)]))
    metas += s.append_as_leader(2, [bytes([i]) * 100 for i in range(N // 2, N)])
    if committed >= 0:
        s.update_committed(committed)
    s.close()  # syncs and writes the checkpoint
    return metas


@pytest.fixture
def lists(tmp_path: Path) -> Iterator[tuple[MmapFileList, MmapFileList]]:
    data = MmapFileList(tmp_path / "data", SEG)
    index = MmapFileList(tmp_path / "index", INDEX_SEG)
    yield data, index
    data.close()
    index.close()


def _recover(
    root: Path,
    lists: tuple[MmapFileList, MmapFileList],
    cp: Checkpoint | None,
    verify: str = "checkpoint",
) -> RecoveredLog:
    data, index = lists
    data.load()
    index.load()
    assert verify in ("checkpoint", "all")
    return recover_log(
        data,
        index,
        cp,
        segment_size=SEG,
        verify="all" if verify == "all" else "checkpoint",
    )


def _poke(root: Path, pos: int, value: int | None = None) -> None:
    """Change the data byte at ``pos`` (flip it, or set it to ``value``)."""
    path = root / "data" / segment_name(pos - pos % SEG)
    raw = bytearray(path.read_bytes())
    raw[pos % SEG] = raw[pos % SEG] ^ 0xFF if value is None else value
    path.write_bytes(raw)


def test_a_clean_log_is_found_whole_and_the_scan_starts_at_the_committed_entry(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    metas = _write(tmp_path, committed=12)
    cp = CheckpointFile(tmp_path / "checkpoint").load()
    r = _recover(tmp_path, lists, cp)
    assert (r.begin_index, r.end_index, r.end_term) == (0, N - 1, 2)
    assert (r.committed_index, r.committed_pos) == (12, metas[12].pos + metas[12].size)
    assert r.scanned_entries == N - 12  # the checkpoint bounds the scan from below
    assert r.rebuilt_index_from == -1
    assert lists[0].end == metas[-1].pos + metas[-1].size


def test_verify_all_scans_from_the_begin(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    _write(tmp_path, committed=12)
    r = _recover(tmp_path, lists, CheckpointFile(tmp_path / "checkpoint").load(), "all")
    assert (r.scanned_entries, r.end_index, r.committed_index) == (N, N - 1, 12)


def test_a_torn_tail_is_cut_and_zeroed(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    metas = _write(tmp_path, committed=12)
    torn = metas[17]
    _poke(tmp_path, torn.pos + BODY_OFFSET + 50)  # its body CRC no longer matches
    r = _recover(tmp_path, lists, CheckpointFile(tmp_path / "checkpoint").load())
    assert (r.end_index, r.end_term, r.committed_index) == (16, 2, 12)
    data, index = lists
    assert data.end == torn.pos  # the log ends where entry 16 ends
    seg = data.segment_for(torn.pos)
    assert seg is not None and seg.mm[torn.pos - seg.start : seg.size].count(0) == (
        seg.start + seg.size - torn.pos
    )  # nothing of the torn entry or after it can pass for data later
    assert index.end == 17 * 32  # the index units after it are cut too


def test_a_crc_failure_inside_the_committed_prefix_refuses_to_start(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    metas = _write(tmp_path, committed=12)
    _poke(tmp_path, metas[12].pos + BODY_OFFSET + 3)  # the committed entry itself
    with pytest.raises(StoreCorruptionError, match=r"at byte \d+ .*committed entry 12"):
        _recover(tmp_path, lists, CheckpointFile(tmp_path / "checkpoint").load())


def test_damage_below_the_checkpoint_start_is_seen_only_by_verify_all(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    metas = _write(tmp_path, committed=12)
    _poke(tmp_path, metas[3].pos + BODY_OFFSET + 1)
    cp = CheckpointFile(tmp_path / "checkpoint").load()
    r = _recover(tmp_path, lists, cp)  # trusts the prefix it verified when it wrote it
    assert r.end_index == N - 1
    lists[0].close()
    lists[1].close()
    with pytest.raises(StoreCorruptionError, match="committed entry 3"):
        _recover(tmp_path, lists, cp, "all")


def test_a_log_that_ends_before_the_checkpoint_refuses_to_start(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    metas = _write(tmp_path, committed=12)
    beyond = Checkpoint(
        committed_index=N + 5, committed_pos=metas[-1].pos + metas[-1].size, end_index=N + 5
    )
    with pytest.raises(StoreCorruptionError, match="ends at entry"):
        _recover(tmp_path, lists, beyond, "all")


def test_without_a_checkpoint_everything_is_scanned_and_nothing_counts_committed(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    _write(tmp_path, committed=12)
    r = _recover(tmp_path, lists, None)
    assert (r.begin_index, r.scanned_entries, r.end_index) == (0, N, N - 1)
    assert (r.committed_index, r.committed_pos) == (-1, 0)


def test_index_units_that_disagree_with_the_data_are_rebuilt_from_it(
    tmp_path: Path, lists: tuple[MmapFileList, MmapFileList]
) -> None:
    _write(tmp_path, committed=-1)
    unit = tmp_path / "index" / segment_name(0)
    raw = bytearray(unit.read_bytes())
    raw[5 * 32 + 8] ^= 0xFF  # entry 5's unit names another pos
    unit.write_bytes(raw)
    r = _recover(tmp_path, lists, CheckpointFile(tmp_path / "checkpoint").load())
    assert (r.rebuilt_index_from, r.end_index) == (5, N - 1)
    lists[0].close()
    lists[1].close()
    with FileStore(tmp_path, SETTINGS, background=False) as s:  # the repair is on disk
        assert [s.get(i).index for i in range(N)] == list(range(N))
