"""What the store makes the event loop wait for (issue 17, "the store lock is held across
the checkpoint's fsyncs; truncate zeroes synchronously"):

- a checkpoint (every ``checkpoint_interval_ms``, on the flush thread) writes and fsyncs
  without the store lock: appends and reads go on meanwhile;
- ``truncate`` (called on the loop when a leader cuts a follower's uncommitted tail)
  writes none of the bytes it drops: it punches their blocks out, so its cost does not
  grow with the tail; where holes cannot be punched it still zeroes them.
Either way what it dropped reads as zeros, recovery finds the same end, and the next
append makes the files byte for byte a replica's that never had the dropped entries.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreSettings
from dledger.store import mmapfile as mmapfile_module
from dledger.store.meta import Checkpoint

SETTINGS = StoreSettings(data_file_size=8 << 20, index_file_size=32 * 4096, flush="sync")
WAIT_S = 30.0  # generous: two cores shared with other test runs


def test_a_checkpoint_write_holds_no_store_lock_across_its_fsyncs(tmp_path: Path) -> None:
    """Before: ``_write_checkpoint`` wrote and fsynced under the store lock, so an append
    on the loop waited for two fsyncs of the flush thread."""
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        s.append_as_leader(1, [b"before"])
        in_save, release = threading.Event(), threading.Event()
        real_save = s._checkpoint.save

        def slow_save(cp: Checkpoint) -> None:
            in_save.set()
            assert release.wait(WAIT_S)
            real_save(cp)

        s._checkpoint.save = slow_save  # type: ignore[method-assign]
        writer = threading.Thread(target=s.flush, name="checkpoint")
        writer.start()
        try:
            assert in_save.wait(WAIT_S)
            done = threading.Event()

            def append_and_read() -> None:
                [m] = s.append_as_leader(1, [b"during the checkpoint"])
                assert s.get(m.index).body == b"during the checkpoint"
                done.set()

            t = threading.Thread(target=append_and_read)
            t.start()
            assert done.wait(WAIT_S), "the append waited for the checkpoint's fsyncs"
            t.join(WAIT_S)
        finally:
            release.set()
            writer.join(WAIT_S)
        s._checkpoint.save = real_save  # type: ignore[method-assign]


def _store_with_tail(root: Path) -> tuple[FileStore, int]:
    """20 committed entries, then 6 MiB of uncommitted ones; returns the first of those."""
    s = FileStore(root, SETTINGS, background=False)
    metas = s.append_as_leader(1, [bytes([i]) * 1000 for i in range(20)])
    s.update_committed(metas[-1].index)
    tail = s.append_as_leader(1, [os.urandom(1 << 16) for _ in range(96)])
    s.sync()
    return s, tail[0].index


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _twin(root: Path) -> FileStore:
    """The same log without the dropped entries, then the same next append."""
    s = FileStore(root, SETTINGS, background=False)
    metas = s.append_as_leader(1, [bytes([i]) * 1000 for i in range(20)])
    s.update_committed(metas[-1].index)
    return s


def test_truncate_writes_none_of_what_it_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 6 MiB of zeros written on the loop."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 8192)
    fd = os.open(probe, os.O_RDWR)
    try:
        if not mmapfile_module.punch_hole(fd, 0, 4096):
            pytest.skip("this file system cannot punch holes (the fallback is tested below)")
    finally:
        os.close(fd)
    s, first = _store_with_tail(tmp_path / "n0")
    segment = s.data_files()[0]
    allocated = _allocated(segment)
    written = [0]
    real_write = mmapfile_module.MmapFile.write

    def counting_write(self: mmapfile_module.MmapFile, rel: int, data: bytes) -> None:
        written[0] += len(data)
        real_write(self, rel, data)

    monkeypatch.setattr(mmapfile_module.MmapFile, "write", counting_write)
    s.truncate(first)
    monkeypatch.undo()
    assert written[0] == 0
    assert _allocated(segment) < allocated - (5 << 20)  # the blocks went back
    _same_as_a_twin(tmp_path, s)


def test_truncate_zeroes_where_holes_cannot_be_punched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, first = _store_with_tail(tmp_path / "n0")
    monkeypatch.setattr(mmapfile_module, "punch_hole", lambda fd, offset, length: False)
    s.truncate(first)
    monkeypatch.undo()
    _same_as_a_twin(tmp_path, s)


def _same_as_a_twin(tmp_path: Path, s: FileStore) -> None:
    end = s.ledger_end_pos
    assert s.read(end - 10, 10) and s._data.files[-1].mm[end : end + (6 << 20)].count(0) == (
        6 << 20
    )
    s.append_as_leader(2, [b"next"])
    s.close()
    twin = _twin(tmp_path / "twin")
    twin.append_as_leader(2, [b"next"])
    twin.close()
    for sub in ("data", "index"):
        ours = {p.name: p.read_bytes() for p in (tmp_path / "n0" / sub).iterdir()}
        theirs = {p.name: p.read_bytes() for p in (tmp_path / "twin" / sub).iterdir()}
        assert ours == theirs, sub
    with FileStore(tmp_path / "n0", SETTINGS, background=False) as r:
        assert r.ledger_end_index == 20 and r.get(20).body == b"next"
