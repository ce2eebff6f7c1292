"""The store's state files when they are wrong, or when a crash cut an operation on them
short (issue 17: "a parseable but wrong beginPos in the checkpoint deletes head segments
before any check; a deleted currterm silently restarts at term 0 (a double vote).
Validate first, destroy never on a guess").

- A checkpoint whose begin the data contradicts: refused, and nothing deleted for it.
- Retention writes the new begin before it deletes a segment: a crash at any point of
  it restarts (before: a crash after the delete, before the checkpoint, refused to start).
- A reset (a snapshot installed) says it is pending until its old segments are gone: a
  crash part-way is finished by recovery (before: an assertion, or the old log kept).
- ``currterm`` missing on a node with a past: refused, saying how to recover; a new
  node writes its own at once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreCorruptionError, StoreSettings, TermVote
from dledger.store.meta import CheckpointFile, MetaFileError, TermVoteFile

SEG = 1024
SETTINGS = StoreSettings(
    data_file_size=SEG, index_file_size=32 * 8, flush="sync", clean_interval_ms=3_600_000
)


class CrashError(Exception):
    """The process dies here (a test stops the operation and abandons the store)."""


def _log(root: Path, n: int = 30) -> list[bytes]:
    """A committed log over several segments (6 entries of 100 bytes a segment)."""
    bodies = [bytes([i]) * 100 for i in range(n)]
    with FileStore(root, SETTINGS, background=False) as s:
        s.save_term_vote(TermVote(3, "n1"))
        metas = s.append_as_leader(1, bodies)
        s.update_committed(metas[-1].index)
    return bodies


def _files(root: Path) -> dict[str, bytes]:
    return {
        f"{d}/{p.name}": p.read_bytes()
        for d in ("data", "index")
        for p in sorted((root / d).iterdir())
    }


def _reopened_reads(root: Path, bodies: list[bytes]) -> FileStore:
    s = FileStore(root, SETTINGS, background=False)
    for i in range(s.ledger_begin_index, s.ledger_end_index + 1):
        assert s.get(i).body == bodies[i]
    assert s.ledger_end_index == len(bodies) - 1
    return s


# ---- the checkpoint's begin -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("begin_pos", 3 * SEG, "entry 18 is there"),  # a segment start, another entry's
        ("begin_pos", 3 * SEG + 5, "no entry is there"),  # inside an entry
        ("begin_pos", 1 << 40, "no segment holds that position"),  # far past the data
        ("begin_index", 9, "no entry is there"),  # (pos 0 is entry 0): see below
    ],
)
def test_a_begin_the_data_contradicts_deletes_nothing_and_refuses_to_start(
    tmp_path: Path, field: str, value: int, problem: str
) -> None:
    """Before: every segment wholly below the checkpoint's beginPos was deleted first,
    then recovery failed (or started without the log's head)."""
    _log(tmp_path)
    cpf = CheckpointFile(tmp_path / "checkpoint")
    cp = cpf.load()
    assert cp is not None
    if field == "begin_index":  # a begin past the first segment, with the wrong index
        cp = dataclasses.replace(cp, begin_pos=2 * SEG, begin_index=value)
        problem = "entry 12 is there"
    else:
        cp = dataclasses.replace(cp, begin_pos=value)
    cpf.save(cp)
    before = _files(tmp_path)
    with pytest.raises(StoreCorruptionError) as e:
        FileStore(tmp_path, SETTINGS, background=False)
    assert str(tmp_path / "checkpoint") in str(e.value) and problem in str(e.value)
    assert "deleting none" in str(e.value) and "move it away" in str(e.value)
    assert _files(tmp_path) == before
    # the way out the message gives: without the checkpoint the log is all there
    (tmp_path / "checkpoint").unlink()
    _reopened_reads(tmp_path, [bytes([i]) * 100 for i in range(30)]).close()


def test_a_begin_inside_the_first_segment_the_data_contradicts_is_refused(
    tmp_path: Path,
) -> None:
    """Nothing to delete, but committed entries after the begin: found by fuzzing
    (store_recovery), the store started with its begin inside entry 0, and refused to
    read the entries it held."""
    _log(tmp_path)
    cpf = CheckpointFile(tmp_path / "checkpoint")
    cp = cpf.load()
    assert cp is not None
    cpf.save(dataclasses.replace(cp, begin_pos=4))
    with pytest.raises(StoreCorruptionError, match=r"no entry is there\. Refusing to start\. If"):
        FileStore(tmp_path, SETTINGS, background=False)


@pytest.mark.parametrize("crash_in", ["delete", "adopt"])
def test_a_crash_in_the_middle_of_retention_restarts_at_the_new_head(
    tmp_path: Path, crash_in: str
) -> None:
    """``delete``: after the new begin is durable, before the segment goes (recovery
    deletes it); ``adopt``: after it went (before: the checkpoint still named it and the
    node refused to start)."""
    bodies = _log(tmp_path)
    s = FileStore(tmp_path, SETTINGS, background=False)

    def crash(*args: object) -> None:
        raise CrashError

    if crash_in == "delete":
        s._data.delete_head = crash  # type: ignore[method-assign]
    else:
        s._adopt_head = crash  # type: ignore[method-assign]
    with pytest.raises(CrashError):
        s.clean(force=True)
    s.abandon()
    r = _reopened_reads(tmp_path, bodies)
    try:
        assert (r.ledger_begin_index, r.ledger_begin_pos) == (6, SEG)  # the second segment's
        assert not (tmp_path / "data" / f"{0:020d}").exists()
    finally:
        r.close()


def test_a_reset_that_crashed_part_way_is_finished_by_recovery(tmp_path: Path) -> None:
    """The snapshot says the log goes on at entry 40, byte 9 * SEG + 100: past every old
    segment. Before: the old segments below were deleted but the last, and recovery
    asserted on a begin beyond it."""
    _log(tmp_path)
    s = FileStore(tmp_path, SETTINGS, background=False)

    def crash(pos: int) -> None:
        raise CrashError

    s._data.reset = crash  # type: ignore[method-assign]
    with pytest.raises(CrashError):
        s.reset(40, 9 * SEG + 100, 2, 77)
    s.abandon()
    assert "pendingReset=1" in (tmp_path / "checkpoint").read_text()
    r = FileStore(tmp_path, SETTINGS, background=False)
    try:
        assert (r.ledger_begin_index, r.ledger_end_index, r.ledger_begin_pos) == (
            40,
            39,
            9 * SEG + 100,
        )
        assert (r.ledger_before_begin_term, r.ledger_before_begin_chain) == (2, 77)
        assert _files(tmp_path) == {}
        assert "pendingReset" not in (tmp_path / "checkpoint").read_text()
        [m] = r.append_as_leader(3, [b"after the snapshot"])
        assert (m.index, m.pos) == (40, 9 * SEG + 100)
    finally:
        r.close()


def test_a_finished_reset_keeps_what_was_written_after_it(tmp_path: Path) -> None:
    _log(tmp_path)
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        s.reset(40, 9 * SEG + 100, 2, 0)
        assert "pendingReset" not in (tmp_path / "checkpoint").read_text()
        s.append_as_follower(_entry(40, 9 * SEG + 100))
    with FileStore(tmp_path, SETTINGS, background=False) as r:
        assert (r.ledger_begin_index, r.ledger_end_index) == (40, 40)


def _entry(index: int, pos: int) -> bytes:
    from dledger.store import encode_entry  # noqa: PLC0415

    return encode_entry(index, 3, pos, b"x" * 10)


def test_out_of_range_checkpoint_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    for line in ("beginPos=99999999999999999999999", "beforeBeginChain=-1", "pendingReset=2"):
        path.write_text(line + "\n")
        with pytest.raises(MetaFileError, match="outside"):
            CheckpointFile(path).load()
    path.write_bytes(b"beginPos=\xff\n")
    with pytest.raises(MetaFileError, match="not UTF-8"):
        CheckpointFile(path).load()


# ---- currterm ---------------------------------------------------------------------------------


def test_a_lost_currterm_refuses_to_start_and_says_how_to_recover(tmp_path: Path) -> None:
    """Before: the node started at term 0 with no vote, free to vote again in a term it
    had voted in (here n1 in term 3)."""
    _log(tmp_path)
    (tmp_path / "currterm").unlink()
    with (
        FileStore(tmp_path, SETTINGS, background=False) as s,
        pytest.raises(StoreCorruptionError) as e,
    ):
        s.load_term_vote()
    msg = str(e.value)
    assert str(tmp_path / "currterm") in msg and "vote twice" in msg
    assert "currTerm=<the highest of them + 1>" in msg and "voteLeader=" in msg
    # the recovery the message gives
    TermVoteFile(tmp_path / "currterm").save(TermVote(8, None))
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        assert s.load_term_vote() == TermVote(8, None)


def test_a_node_that_only_ran_before_is_refused_too(tmp_path: Path) -> None:
    """No entries yet, but it ran (its checkpoint): it may have voted."""
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        assert s.load_term_vote() == TermVote()
        s.save_term_vote(TermVote(2, "n2"))
    (tmp_path / "currterm").unlink()
    with (
        FileStore(tmp_path, SETTINGS, background=False) as s,
        pytest.raises(StoreCorruptionError, match="currterm is missing"),
    ):
        s.load_term_vote()


def test_a_new_node_writes_its_currterm_at_once(tmp_path: Path) -> None:
    with FileStore(tmp_path, SETTINGS, background=False) as s:
        assert not (tmp_path / "currterm").exists()
        assert s.load_term_vote() == TermVote()
        assert (tmp_path / "currterm").read_text() == "currTerm=0\nvoteLeader=\n"
        assert os.stat(tmp_path / "currterm").st_size > 0


def test_a_lost_index_head_segment_is_rebuilt_from_the_data(tmp_path: Path) -> None:
    """Found by fuzzing (store_recovery): recovery scanned from the checkpoint's
    committed entry only, so the units below it stayed missing and every read of those
    entries failed with IndexError."""
    bodies = _log(tmp_path)
    (tmp_path / "index" / f"{0:020d}").unlink()
    r = _reopened_reads(tmp_path, bodies)
    try:
        assert r.recovery_stats["rebuilt_index_from"] == 0
    finally:
        r.close()
