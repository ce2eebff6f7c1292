"""Segment files: naming, roll-over with blank padding, loading checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.store.entry import MAGIC_BLANK, peek_magic_size
from dledger.store.mmapfile import MmapFileList, StoreFileError, first_zero_record, segment_name


def test_segment_names_are_20_digit_start_positions() -> None:
    assert segment_name(0) == "0" * 20
    assert segment_name(1 << 30) == "00000000001073741824"


def test_roll_over_pads_the_old_segment_with_a_blank_record(tmp_path: Path) -> None:
    fl = MmapFileList(tmp_path, 64)
    fl.new_segment()
    fl.write_at_end(b"a" * 40)
    fl.pad_to_limit()
    fl.new_segment()
    fl.write_at_end(b"b" * 10)
    assert [f.path.name for f in fl] == [segment_name(0), segment_name(64)]
    assert peek_magic_size(fl.files[0].mm, 40) == (MAGIC_BLANK, 24)
    assert fl.read(40 + 8, 16) == bytes(16)
    assert fl.read(64, 10) == b"b" * 10
    assert fl.end == 74
    fl.close()


def test_truncate_deletes_later_segments_and_zeroes_the_rest(tmp_path: Path) -> None:
    fl = MmapFileList(tmp_path, 64)
    for _ in range(3):
        fl.new_segment()
        fl.write_at_end(b"x" * 64)
    fl.truncate(70)
    assert len(fl.files) == 2 and fl.end == 70
    assert fl.files[1].mm[6:64] == bytes(58)
    assert not (tmp_path / segment_name(128)).exists()
    fl.close()


def test_load_refuses_non_contiguous_segments(tmp_path: Path) -> None:
    for start in (0, 128):
        (tmp_path / segment_name(start)).write_bytes(bytes(64))
    with pytest.raises(StoreFileError, match="not contiguous"):
        MmapFileList(tmp_path, 64).load()


def test_load_refuses_a_segment_larger_than_the_setting(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(128))
    with pytest.raises(StoreFileError, match="larger than the configured segment size"):
        MmapFileList(tmp_path, 64).load()


def test_load_refuses_unexpected_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(StoreFileError, match="unexpected file"):
        MmapFileList(tmp_path, 64).load()


def test_load_extends_a_segment_cut_short(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(b"abc")
    fl = MmapFileList(tmp_path, 64)
    fl.load()
    assert os.path.getsize(tmp_path / segment_name(0)) == 64
    assert fl.files[0].mm[:4] == b"abc\0"
    fl.close()


@given(
    st.lists(st.booleans(), max_size=40),
    st.integers(min_value=1, max_value=24),
    st.integers(min_value=0, max_value=30),
    st.data(),
)
def test_first_zero_record_is_the_first_aligned_all_zero_record(
    zero_records: list[bool], size: int, lead: int, data: st.DataObject
) -> None:
    """Against the obvious oracle: look at every record from ``lo`` in turn. Written
    records are random non-zero bytes, often with zero runs that straddle records."""
    body = b"".join(
        bytes(size) if z else data.draw(st.binary(min_size=size, max_size=size).filter(any))
        for z in zero_records
    )
    buf = os.urandom(lead) + body + os.urandom(data.draw(st.integers(0, size)))
    lo, hi = lead, lead + len(body)
    want = next((lo + i * size for i, z in enumerate(zero_records) if z), None)
    assert first_zero_record(buf, lo, hi, size) == want
