"""A failing disk under the file store (issue 17, "The disk"): a write that fails part-way
leaves the store exactly as it was, a full disk is a clean ``DISK_FULL`` the store
recovers from by itself, and a failed fsync fails the store for good (crash-only, the
fsyncgate lesson) until a restart re-verifies the log.

The full disk is a real one: a tmpfs of the test's own (``tests.smallfs``). ``EIO`` cannot
be had from a healthy disk, so those tests make one ``pwrite``/``fdatasync`` of the
store's files fail, at the system-call boundary.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.codes import DLedgerCode
from dledger.store import FileStore, StoreError, StoreFailedError
from dledger.store import mmapfile as mmapfile_module
from tests.waiting import wait_until

from ..conftest import TINY
from ..smallfs import Ballast, MiB, small_fs


def _bodies(n: int, size: int, tag: int) -> list[bytes]:
    return [bytes([(tag * 7 + i) % 251]) * size for i in range(n)]


def _dir_state(root: Path) -> dict[str, str]:
    """Every file under ``root`` (but the ballast) with a digest of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.blake2b(p.read_bytes(), digest_size=16).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "ballast" and p.name != "lock"
    }


def _ends(store: FileStore) -> tuple[int, int, int, int]:
    return (
        store.ledger_end_index,
        store.ledger_end_term,
        store.ledger_end_pos,
        store.ledger_end_chain,
    )


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with small_fs(tmp_path / "fs", 1 * MiB) as fs:
        yield fs


def test_a_full_disk_fails_the_append_whole_and_the_store_recovers_by_itself(
    tiny_fs: Path,
) -> None:
    """Real ENOSPC: every append up to the failing one lands, the failing one changes no
    byte and no ledger field; with space back, appends go on where they were, and a
    restart finds exactly the appended entries (no orphan adopted)."""
    settings = dataclasses.replace(TINY, disk_full_ratio=1.0)  # the kernel says when
    store = FileStore(tiny_fs / "n0", settings)
    ballast = Ballast(tiny_fs)
    ballast.leave_free(48 * 1024)
    appended: list[bytes] = []
    try:
        for i in range(2000):
            before, ends = _dir_state(tiny_fs), _ends(store)
            batch = _bodies(3, 700, i)  # spans segments (4 KiB) and index segments
            try:
                store.append_as_leader(1, batch)
            except StoreError as e:
                assert e.code is DLedgerCode.DISK_FULL, e
                assert "nothing was written" in e.message
                assert _ends(store) == ends
                assert _dir_state(tiny_fs) == before
                break
            appended += batch
        else:
            pytest.fail("the disk never filled")
        assert appended, "nothing fit before the disk was full"
        # Reads go on while the disk is full.
        assert store.get(store.ledger_end_index).body == appended[-1]
        ballast.remove()
        more = _bodies(5, 700, 9999)
        store.append_as_leader(1, more)
        appended += more
        store.update_committed(store.ledger_end_index)
    finally:
        store.close()
    reopened = FileStore(tiny_fs / "n0", settings)
    try:
        assert reopened.ledger_end_index == len(appended) - 1
        assert [reopened.get(i).body for i in range(len(appended))] == appended
    finally:
        reopened.close()


def _failing_syscall(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    *,
    after: int,
    times: int = 1 << 30,
    err: int = errno.EIO,
) -> list[int]:
    """Make ``times`` calls of ``os.<name>`` fail with ``err``, from the one after the
    first ``after`` on. Returns the counter of calls seen."""
    real: Callable[..., Any] = getattr(os, name)
    seen = [0]

    def fake(fd: int, *args: Any) -> Any:
        seen[0] += 1
        if after < seen[0] <= after + times:
            raise OSError(err, os.strerror(err))
        return real(fd, *args)

    monkeypatch.setattr(mmapfile_module.os, name, fake)
    return seen


def test_an_eio_part_way_through_a_batch_leaves_the_store_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch spans three data segments; its second run fails with EIO after the
    first run is written: the first run is undone, the new segments deleted, and the
    next append lands where the failed one would have (followers' positions agree)."""
    store = FileStore(tmp_path / "n0", TINY)
    try:
        store.append_as_leader(1, _bodies(2, 1000, 1))
        before, ends = _dir_state(tmp_path), _ends(store)
        _failing_syscall(monkeypatch, "pwrite", after=1, times=1)
        with pytest.raises(StoreError) as info:
            store.append_as_leader(1, _bodies(8, 1000, 2))
        assert info.value.code is DLedgerCode.DISK_ERROR
        monkeypatch.undo()
        assert _ends(store) == ends
        assert _dir_state(tmp_path) == before
        metas = store.append_as_leader(1, _bodies(8, 1000, 2))
        store.update_committed(metas[-1].index)
    finally:
        store.close()
    twin = FileStore(tmp_path / "twin", TINY)
    try:
        twin.append_as_leader(1, _bodies(2, 1000, 1))
        assert [m.pos for m in twin.append_as_leader(1, _bodies(8, 1000, 2))] == [
            m.pos for m in metas
        ]
    finally:
        twin.close()


def test_a_failed_undo_fails_the_store_and_a_restart_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "n0", TINY)
    store.append_as_leader(1, _bodies(3, 500, 1))
    store.update_committed(2)
    store.flush()
    _failing_syscall(monkeypatch, "pwrite", after=1)  # the write fails, and so does the undo:

    def punch_fails(fd: int, offset: int, length: int) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(mmapfile_module, "punch_hole", punch_fails)  # (its hole punching)
    with pytest.raises(StoreFailedError, match="undoing a failed write"):
        store.append_as_leader(1, _bodies(8, 1000, 2))
    monkeypatch.undo()
    assert store.failed is not None
    with pytest.raises(StoreFailedError):
        store.append_as_leader(1, _bodies(1, 10, 3))  # every later call: the same failure
    store.close()  # lets go without a sync or a checkpoint
    reopened = FileStore(tmp_path / "n0", TINY)
    try:
        assert reopened.committed_index == 2
        assert [reopened.get(i).body for i in range(3)] == _bodies(3, 500, 1)
        # Past the committed prefix recovery keeps what verifies: whole entries of the
        # failed batch's written part (uncommitted; Raft keeps or cuts them like any
        # uncommitted tail), never a torn one.
        tail = [reopened.get(i).body for i in range(3, reopened.ledger_end_index + 1)]
        assert tail == _bodies(8, 1000, 2)[: len(tail)]
    finally:
        reopened.close()


def test_a_failed_fsync_fails_the_store_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsyncgate: after one failed fdatasync the kernel may have dropped the dirty pages
    and a retry "succeeds" over them. The store fails instead, every later call says so
    (even with fdatasync healthy again), and no checkpoint moves past the failure."""
    settings = dataclasses.replace(TINY, flush="sync")
    store = FileStore(tmp_path / "n0", settings)
    store.append_as_leader(1, _bodies(2, 100, 1))
    store.update_committed(1)
    store.flush()
    checkpoint = (tmp_path / "n0" / "checkpoint").read_bytes()
    _failing_syscall(monkeypatch, "fdatasync", after=0)
    with pytest.raises(StoreFailedError, match="fsync"):
        store.append_as_leader(1, _bodies(2, 100, 2))  # sync mode: synced before return
    monkeypatch.undo()
    for call in (store.sync, store.flush, lambda: store.append_as_leader(1, [b"x"])):
        with pytest.raises(StoreFailedError):
            call()
    store.close()
    assert (tmp_path / "n0" / "checkpoint").read_bytes() == checkpoint
    reopened = FileStore(tmp_path / "n0", settings)
    try:
        assert reopened.committed_index == 1
        assert [reopened.get(i).body for i in range(2)] == _bodies(2, 100, 1)
    finally:
        reopened.close()


def test_the_background_flush_stops_on_a_failed_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async mode: the flusher thread's failed fdatasync fails the store too; it does
    not log and retry every 5 ms."""
    store = FileStore(tmp_path / "n0", TINY)  # async flush every 5 ms
    try:
        _failing_syscall(monkeypatch, "fdatasync", after=0)
        store.append_as_leader(1, _bodies(2, 100, 1))
        wait_until(lambda: store.failed is not None)
        assert "fsync" in str(store.failed)
    finally:
        monkeypatch.undo()
        store.close()
