"""FileStore rules, one test per behaviour (ST-xx, AP-xx and CV-xx name the checklist item)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode
from dledger.store import (
    BODY_OFFSET,
    MAGIC_NOOP,
    EntryMeta,
    FileStore,
    MemoryStore,
    StoreCorruptionError,
    StoreError,
    StoreSettings,
    TermVote,
    encode_entry,
)
from dledger.store.entry import MAGIC_BLANK, decode_header, peek_magic_size
from tests.waiting import wait_until

from ..conftest import TINY


def bodies(n: int, size: int = 100, tag: int = 0) -> list[bytes]:
    return [bytes([(tag + i) % 251]) * size for i in range(n)]


# ---- leader append -----------------------------------------------------------------------


def test_append_as_leader_assigns_contiguous_index_term_and_pos(store: FileStore) -> None:
    metas = store.append_as_leader(3, bodies(5))
    assert [m.index for m in metas] == [0, 1, 2, 3, 4]
    assert all(m.term == 3 for m in metas)
    assert [m.pos for m in metas] == [i * 148 for i in range(5)]
    assert store.ledger_end_index == 4 and store.ledger_end_term == 3
    assert store.ledger_end_pos == 5 * 148
    assert store.get(2).body == bodies(5)[2]


def test_empty_log_has_end_index_minus_one(store: FileStore) -> None:
    assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, -1, -1)
    assert store.committed_index == -1


def test_entries_never_straddle_segments(store: FileStore) -> None:
    metas = store.append_as_leader(1, [b"z" * (50 + 37 * i) for i in range(60)])
    for m in metas:
        assert m.pos // TINY.data_file_size == (m.pos + m.size - 1) // TINY.data_file_size
        # and the segment always keeps room for a blank record after an entry
        assert m.pos % TINY.data_file_size + m.size + 8 <= TINY.data_file_size
    assert len(store.data_files()) > 5


def test_segment_tail_is_a_blank_record(store: FileStore) -> None:
    metas = store.append_as_leader(1, bodies(40, size=500))
    rolled = next(m for a, m in itertools.pairwise(metas) if m.pos != a.pos + a.size)
    prev = metas[metas.index(rolled) - 1]
    tail = prev.pos + prev.size
    assert rolled.pos == tail - tail % TINY.data_file_size + TINY.data_file_size
    raw = store.data_files()[0].read_bytes()
    assert peek_magic_size(raw, tail % TINY.data_file_size) == (MAGIC_BLANK, rolled.pos - tail)


def test_noop_entries_have_magic_2_and_an_empty_body(store: FileStore) -> None:
    (m,) = store.append_as_leader(2, [b""], magic=MAGIC_NOOP)
    e = store.get(m.index)
    assert (e.magic, e.body, e.size) == (MAGIC_NOOP, b"", BODY_OFFSET)


def test_append_hook_sees_fixed_pos_before_bytes_are_written_ap10(store: FileStore) -> None:
    seen: list[tuple[EntryMeta, int, int]] = []

    def hook(meta: EntryMeta, buf: memoryview, body_offset: int) -> None:
        header = decode_header(bytes(buf[:BODY_OFFSET]))
        assert header.pos == meta.pos  # pos is in the bytes already
        assert store.ledger_end_pos <= meta.pos  # ...which are not on disk yet
        # What the broker does: write pos + 48 into the message's PHYSICALOFFSET field.
        struct.pack_into(">q", buf, body_offset + 28, meta.pos + body_offset)
        seen.append((meta, body_offset, len(buf)))

    store.add_append_hook(hook)
    metas = store.append_as_leader(1, [bytes(64)] * 3)
    assert [s[0] for s in seen] == metas and all(s[1] == 48 for s in seen)
    for m in metas:
        body = store.get(m.index).body  # get() verifies the CRC: it covers the rewrite
        assert struct.unpack_from(">q", body, 28)[0] == m.pos + 48
        assert store.read(m.pos + 48 + 28, 8) == (m.pos + 48).to_bytes(8, "big")


def test_a_failing_hook_leaves_the_log_unchanged(store: FileStore) -> None:
    store.append_as_leader(1, bodies(3))

    def hook(meta: EntryMeta, buf: memoryview, body_offset: int) -> None:
        if meta.index == 5:
            raise ValueError("refused")

    store.add_append_hook(hook)
    end = (store.ledger_end_index, store.ledger_end_pos)
    with pytest.raises(ValueError, match="refused"):
        store.append_as_leader(1, bodies(4))
    assert (store.ledger_end_index, store.ledger_end_pos) == end


def test_leader_refuses_empty_batches_and_oversized_bodies(tmp_path: Path) -> None:
    s = FileStore(
        tmp_path, StoreSettings(data_file_size=4096, index_file_size=512, max_body_bytes=200)
    )
    with pytest.raises(StoreError) as e:
        s.append_as_leader(1, [])
    assert e.value.code == DLedgerCode.REQUEST_WITH_EMPTY_BODYS
    with pytest.raises(StoreError) as e:
        s.append_as_leader(1, [b"x" * 10, b"y" * 201])
    assert e.value.code == DLedgerCode.UNEXPECTED_ARGUMENT
    assert s.ledger_end_index == -1
    s.close()


def test_leader_term_never_goes_back(store: FileStore) -> None:
    store.append_as_leader(5, bodies(1))
    with pytest.raises(StoreError) as e:
        store.append_as_leader(4, bodies(1))
    assert e.value.code == DLedgerCode.INCONSISTENT_TERM


# ---- follower append ---------------------------------------------------------------------


def test_follower_writes_the_leaders_bytes_at_the_leaders_pos_st15(tmp_path: Path) -> None:
    leader = FileStore(tmp_path / "a", TINY)
    follower = FileStore(tmp_path / "b", TINY)
    leader.append_as_leader(1, bodies(30, size=300))
    raw = leader.read_entries(0, 1 << 20, 1000)
    metas = follower.append_as_follower(raw)
    assert metas[-1].index == follower.ledger_end_index
    assert follower.get(metas[-1].index) == leader.get(metas[-1].index)
    leader.close()
    follower.close()


def _follower_refuses(store: FileStore, raw: bytes, code: DLedgerCode) -> None:
    before = (store.ledger_end_index, store.ledger_end_pos)
    with pytest.raises(StoreError) as e:
        store.append_as_follower(raw)
    assert e.value.code == code
    assert (store.ledger_end_index, store.ledger_end_pos) == before


def test_follower_refuses_a_gap_in_indexes(store: FileStore) -> None:
    _follower_refuses(store, encode_entry(1, 1, 0, b"x"), DLedgerCode.INCONSISTENT_INDEX)


def test_follower_refuses_an_entry_at_another_pos(store: FileStore) -> None:
    _follower_refuses(store, encode_entry(0, 1, 64, b"x"), DLedgerCode.INCONSISTENT_STATE)


def test_follower_refuses_a_corrupted_body_and_writes_nothing_of_the_batch(
    store: FileStore,
) -> None:
    good = encode_entry(0, 1, 0, b"first")
    bad = bytearray(
        encode_entry(1, 1, len(good), b"second", prev_chain=decode_header(good).chain_crc)
    )
    bad[-1] ^= 1
    _follower_refuses(store, good + bytes(bad), DLedgerCode.INCONSISTENT_STATE)


def test_follower_refuses_a_different_history_by_chain_crc(store: FileStore) -> None:
    store.append_as_follower(encode_entry(0, 1, 0, b"a"))
    # The right index, pos and term but chained on another history.
    other = encode_entry(1, 1, 49, b"b", prev_chain=999)
    _follower_refuses(store, other, DLedgerCode.INCONSISTENT_STATE)


def test_follower_refuses_garbage(store: FileStore) -> None:
    _follower_refuses(
        store, b"\x00\x00\x00\x01garbage-not-an-entry" * 3, DLedgerCode.INCONSISTENT_STATE
    )


# ---- reads -------------------------------------------------------------------------------


def test_read_by_pos_and_size_and_out_of_range(store: FileStore) -> None:
    (m,) = store.append_as_leader(1, [b"0123456789"])
    assert store.read(m.pos + BODY_OFFSET + 3, 4) == b"3456"
    with pytest.raises(StoreError) as e:
        store.read(m.pos, m.size + 1)
    assert e.value.code == DLedgerCode.INDEX_OUT_OF_RANGE
    with pytest.raises(StoreError):
        store.get(1)


def test_a_view_is_the_bytes_in_place_and_holds_the_segment(store: FileStore) -> None:
    metas = store.append_as_leader(1, bodies(10, size=200))
    pos = metas[2].pos
    with store.view(pos, 3 * metas[2].size) as v:
        assert bytes(v) == store.read(pos, 3 * metas[2].size)
        kept = bytes(v[:10])
    assert kept == store.read(pos, 10)
    with pytest.raises(ValueError, match="released"):
        v.tobytes()
    last = metas[-1].pos
    for bad in ((pos, -1), (last, metas[-1].size + 1), (0, TINY.data_file_size + 1)):
        with pytest.raises(StoreError) as e, store.view(*bad):
            pass
        assert e.value.code == DLedgerCode.INDEX_OUT_OF_RANGE
    with pytest.raises(StoreError), store.view(last, 100, limit_pos=last + 50):
        pass
    # A buffer made from the view (as numpy and pyarrow make them) and kept past it
    # makes the release fail, loudly.
    with pytest.raises(BufferError), store.view(pos, 10) as v:
        leaked = pickle.PickleBuffer(v)
    leaked.release()
    v.release()
    store.close()  # nothing is left mapped out


def test_read_entries_respects_bytes_count_and_segment_end(store: FileStore) -> None:
    metas = store.append_as_leader(1, bodies(40, size=200))
    assert len(store.read_entries(0, 10_000, 3)) == 3 * 248
    assert len(store.read_entries(0, 500, 100)) == 2 * 248
    assert len(store.read_entries(0, 1, 100)) == 248  # always at least one entry
    per_segment = sum(1 for m in metas if m.pos < TINY.data_file_size)
    assert len(store.read_entries(0, 1 << 20, 100)) == per_segment * 248


def test_first_index_of_term_walks_back_to_the_terms_first_entry_st18(store: FileStore) -> None:
    store.append_as_leader(1, bodies(3))
    store.append_as_leader(2, bodies(4))
    store.append_as_leader(4, bodies(2))
    assert store.first_index_of_term(2, store.ledger_end_index) == 3
    assert store.first_index_of_term(4, store.ledger_end_index) == 7
    assert store.first_index_of_term(3, store.ledger_end_index) == -1
    assert store.first_index_of_term(1, 1) == 0


# ---- truncate and reset ------------------------------------------------------------------


def test_truncate_cuts_the_index_list_not_only_the_data_list_cv30(store: FileStore) -> None:
    store.append_as_leader(1, bodies(50, size=120))
    store.truncate(20)
    assert store.ledger_end_index == 19
    with pytest.raises(StoreError):
        store.get_meta(20)
    index_bytes = b"".join(p.read_bytes() for p in store.index_files())
    assert index_bytes[20 * 32 :].count(0) == len(index_bytes) - 20 * 32
    # Appending again writes the index units from 20 on, at the right places.
    metas = store.append_as_leader(2, bodies(5, tag=9))
    assert metas[0].index == 20 and store.get(22).body == bodies(5, tag=9)[2]


def test_truncate_moves_the_ledger_end_term_cv32(store: FileStore) -> None:
    store.append_as_leader(1, bodies(3))
    store.append_as_leader(2, bodies(3))
    assert store.ledger_end_term == 2
    assert store.truncate(3) == 2
    assert store.ledger_end_term == 1  # DLedger leaves this stale
    assert store.truncate(0) == -1 and store.ledger_end_term == -1


def test_truncate_refuses_committed_entries(store: FileStore) -> None:
    store.append_as_leader(1, bodies(5))
    store.update_committed(3)
    with pytest.raises(StoreError):
        store.truncate(3)
    assert store.truncate(4) == 3


def test_truncate_survives_reopen(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(60, size=90))
    s.truncate(25)
    s.append_as_leader(2, bodies(3, tag=50))
    s.close()
    s = FileStore(tmp_path, TINY)
    assert s.ledger_end_index == 27 and s.ledger_end_term == 2
    assert s.get(26).body == bodies(3, tag=50)[1]
    s.close()


def test_reset_restarts_the_log_at_a_given_index_and_pos(tmp_path: Path) -> None:
    leader = FileStore(tmp_path / "a", TINY)
    leader.append_as_leader(1, bodies(100, size=150))
    follower = FileStore(tmp_path / "b", TINY)
    follower.append_as_leader(1, bodies(2))  # some stale history
    begin = 61
    m = leader.get_meta(begin)
    prev = leader.get(begin - 1)
    follower.reset(begin, m.pos, prev.term, prev.chain_crc)
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (begin, begin - 1)
    assert follower.committed_index == begin - 1
    follower.append_as_follower(leader.read_entries(begin, 1 << 20, 1000))
    follower.close()
    follower = FileStore(tmp_path / "b", TINY)
    assert follower.ledger_begin_index == begin
    assert follower.get(begin) == leader.get(begin)
    end = follower.ledger_end_index
    assert follower.get(end) == leader.get(end)
    leader.close()
    follower.close()


@pytest.mark.parametrize("reopen", [False, True])
def test_reset_at_an_entry_end_then_an_entry_that_opens_the_next_segment(
    tmp_path: Path, reopen: bool
) -> None:
    """INSTALL_SNAPSHOT may restart a follower's log right after entry i (mid-segment)
    when the leader's entry i + 1 did not fit there: the follower pads the segment as
    the leader did, and the bytes from the reset position on are the leader's."""
    leader = FileStore(tmp_path / "a", TINY)
    metas = leader.append_as_leader(1, bodies(40, size=150))
    k = next(i for i in range(1, 40) if metas[i].pos != metas[i - 1].pos + metas[i - 1].size)
    last = leader.get(metas[k - 1].index)  # the last entry of its segment
    after = last.pos + 48 + len(last.body)
    follower = FileStore(tmp_path / "b", TINY)
    follower.append_as_leader(1, bodies(3))  # stale history, dropped by the reset
    follower.reset(last.index + 1, after, last.term, last.chain_crc)
    if reopen:
        follower.close()
        follower = FileStore(tmp_path / "b", TINY)
    follower.append_as_follower(leader.read_entries(last.index + 1, 1 << 20, 1000))
    assert follower.get(last.index + 1) == leader.get(last.index + 1)
    follower.close()
    leader.close()
    a = b"".join(p.read_bytes() for p in sorted((tmp_path / "a" / "data").iterdir()))
    b = b"".join(p.read_bytes() for p in sorted((tmp_path / "b" / "data").iterdir()))
    seg = TINY.data_file_size
    skip = after - after % seg  # both lists start at a segment start; the follower's later
    assert b[after - skip :] == a[after : after + len(b) - (after - skip)]
    assert b[: after - skip] == bytes(after - skip)  # nothing of the follower's old log


def test_retention_deletes_a_head_segment_holding_only_padding_after_a_reset(
    tmp_path: Path,
) -> None:
    """After a reset right behind an entry near a segment's end, the next entry opens the
    next segment: the head segment holds no entry. Deleting it keeps the begin index and
    the before-begin term and chain (found by the simulator, seed 277)."""
    leader = MemoryStore(TINY)  # a leader whose log restarted at the same place
    leader.reset(10, 4096 - 60, 3, 77)  # 60 bytes left: a 150-byte body goes on
    leader.append_as_leader(3, bodies(30, size=150))
    s = FileStore(tmp_path, TINY)
    s.reset(10, 4096 - 60, 3, 77)
    i = 10
    while i <= leader.ledger_end_index:
        raw, n, _ = leader.read_batch(i, 1 << 20, 1000)
        s.append_as_follower(raw)
        i += n
    s.update_committed(s.ledger_end_index)
    assert len(s.data_files()) >= 3 and s.get_meta(10).pos == 4096
    s.set_retention_floor(4096)  # only the head segment
    assert s.clean(force=True) == 1
    assert (s.ledger_begin_index, s.ledger_before_begin_term) == (10, 3)
    assert s.ledger_before_begin_chain == 77 and s.ledger_begin_pos == 4096
    assert s.term_at(9) == 3
    s.close()
    s = FileStore(tmp_path, TINY)
    assert (s.ledger_begin_index, s.ledger_before_begin_term) == (10, 3)
    assert s.get(39) == leader.get(39)
    s.close()


def test_reset_then_reopen_with_an_empty_log(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.reset(1000, 3 * 4096 + 296, 7, 42)
    s.close()
    s = FileStore(tmp_path, TINY)
    assert (s.ledger_begin_index, s.ledger_end_index, s.ledger_end_term) == (1000, 999, 7)
    assert s.ledger_end_pos == 3 * 4096 + 296
    (m,) = s.append_as_leader(8, [b"x"])
    assert (m.index, m.pos) == (1000, 3 * 4096 + 296)
    s.close()


# ---- committed index, checkpoint, term/vote, flush ---------------------------------------


def test_committed_index_only_moves_forward_and_must_exist_st19(store: FileStore) -> None:
    store.append_as_leader(1, bodies(5))
    store.update_committed(3)
    store.update_committed(1)
    assert store.committed_index == 3
    assert store.committed_pos == store.get_meta(3).pos + store.get_meta(3).size
    with pytest.raises(StoreError):
        store.update_committed(5)


def test_checkpoint_persists_the_committed_index(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(10))
    s.update_committed(6)
    s.close()
    text = (tmp_path / "checkpoint").read_text()
    assert "committedIndex=6" in text
    s = FileStore(tmp_path, TINY)
    assert s.committed_index == 6 and s.ledger_end_index == 9
    s.close()


def test_term_and_vote_are_written_atomically(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    assert s.load_term_vote() == TermVote(0, None)
    s.save_term_vote(TermVote(7, "n2"))
    assert (tmp_path / "currterm").read_text() == "currTerm=7\nvoteLeader=n2\n"
    assert not list(tmp_path.glob("*.tmp"))
    s.close()
    with FileStore(tmp_path, TINY) as s:
        assert s.load_term_vote() == TermVote(7, "n2")


def test_sync_flush_makes_every_append_durable_before_it_returns(tmp_path: Path) -> None:
    s = FileStore(tmp_path, StoreSettings(data_file_size=4096, index_file_size=512, flush="sync"))
    for _ in range(5):
        s.append_as_leader(1, bodies(3))
        assert s.data_flushed_pos == s.ledger_end_pos
    s.close()


def test_async_flush_syncs_in_the_background(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(30))
    wait_until(lambda: s.durable_index == 29)
    s.close()


def test_checkpoint_never_claims_more_than_is_durable(tmp_path: Path) -> None:
    slow = StoreSettings(data_file_size=4096, index_file_size=512, flush_interval_ms=60_000)
    s = FileStore(tmp_path, slow)
    s.append_as_leader(1, bodies(10))
    s.update_committed(9)
    s._write_checkpoint()  # as the timer would, before the data was synced
    assert "committedIndex=-1" in (tmp_path / "checkpoint").read_text()
    s.flush()
    assert "committedIndex=9" in (tmp_path / "checkpoint").read_text()
    s.close()


def test_operations_on_a_closed_store_fail_cleanly(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.close()
    with pytest.raises(StoreError):
        s.append_as_leader(1, bodies(1))
    s.close()  # idempotent


# ---- recovery ----------------------------------------------------------------------------


def _flip_byte(root: Path, pos: int) -> Path:
    """Corrupt the data byte at ``pos`` in place; returns the segment file."""
    seg = pos - pos % TINY.data_file_size
    path = root / "data" / f"{seg:020d}"
    raw = bytearray(path.read_bytes())
    raw[pos - seg] ^= 0xFF
    path.write_bytes(raw)
    return path


def test_crc_failure_below_the_committed_index_stops_with_file_and_position(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    metas = s.append_as_leader(1, bodies(40))
    s.update_committed(39)
    s.close()
    victim = metas[30]
    path = _flip_byte(tmp_path, victim.pos + 60)
    with pytest.raises(StoreCorruptionError) as e:
        FileStore(tmp_path, dataclasses.replace(TINY, recovery_verify="all"))
    assert str(path) in str(e.value) and f"pos {victim.pos}" in str(e.value)


def test_recovery_from_the_checkpoint_detects_the_committed_entry_damaged(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    metas = s.append_as_leader(1, bodies(10))
    s.update_committed(9)
    s.close()
    _flip_byte(tmp_path, metas[9].pos + 50)
    with pytest.raises(StoreCorruptionError, match="committed entry 9"):
        FileStore(tmp_path, TINY)


def test_missing_index_files_are_rebuilt_from_the_data(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(80, size=77))
    expected = [p.read_bytes() for p in s.index_files()]
    s.close()
    for p in (tmp_path / "index").iterdir():
        p.unlink()
    s = FileStore(tmp_path, TINY)
    assert [p.read_bytes() for p in s.index_files()] == expected
    assert s.get(79).body == bodies(80, size=77)[79]
    s.close()


def test_lost_checkpoint_recovers_everything_from_the_data(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(50))
    s.close()
    (tmp_path / "checkpoint").unlink()
    s = FileStore(tmp_path, TINY)
    assert s.ledger_end_index == 49 and s.recovery_stats["scanned_entries"] == 50
    s.close()


# ---- retention and disk full -------------------------------------------------------------


def _age_all(store: FileStore, hours: float) -> None:
    old = time.time() - hours * 3600
    for p in store.data_files():
        os.utime(p, (old, old))


def test_retention_deletes_expired_head_segments_but_never_past_committed(tmp_path: Path) -> None:
    s = FileStore(tmp_path, dataclasses.replace(TINY, file_reserved_hours=1.0))
    s.append_as_leader(1, bodies(200, size=300))
    n_files = len(s.data_files())
    _age_all(s, 2)
    assert s.clean() == 0  # nothing committed yet
    s.update_committed(100)
    deleted = s.clean()
    assert deleted > 0
    assert s.ledger_begin_index > 0 and s.ledger_begin_index <= 101
    assert s.data_files()[0].name == f"{s.ledger_begin_pos:020d}"
    assert s.get(s.ledger_begin_index).index == s.ledger_begin_index
    assert len(s.data_files()) == n_files - deleted
    with pytest.raises(StoreError):
        s.get(s.ledger_begin_index - 1)
    begin = s.ledger_begin_index
    s.close()
    s = FileStore(tmp_path, TINY)
    assert s.ledger_begin_index == begin and s.ledger_end_index == 199
    s.close()


def test_background_retention_runs_on_its_own(tmp_path: Path) -> None:
    s = FileStore(tmp_path, dataclasses.replace(TINY, clean_interval_ms=10, file_reserved_hours=1))
    s.append_as_leader(1, bodies(100, size=300))
    _age_all(s, 2)
    s.update_committed(99)
    # The thread deletes a segment, then moves the log head: wait for both, not for the
    # first alone (reading the head right after the file count dropped raced with it).
    wait_until(lambda: len(s.data_files()) == 1 and s.ledger_begin_index > 0)
    s.close()


def test_a_second_process_cannot_open_the_same_store(tmp_path: Path) -> None:
    with FileStore(tmp_path, TINY):
        code = (
            "import sys; from dledger.store import FileStore;"
            "from dledger.store.mmapfile import StoreFileError\n"
            "try:\n FileStore(sys.argv[1])\nexcept StoreFileError as e:\n print(e); sys.exit(3)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 3, out.stderr
        assert "in use" in out.stdout


def test_retention_keeps_young_segments_and_the_active_one(tmp_path: Path) -> None:
    # The disk's usage is pinned below disk_clean_ratio: on a machine whose disk is
    # fuller than that, retention rightly deletes young segments too (CI saw 5 deleted).
    s = FileStore(tmp_path, TINY, disk_usage=lambda: 0.5)
    s.append_as_leader(1, bodies(60, size=300))
    s.update_committed(59)
    assert s.clean() == 0  # young
    n_files = len(s.data_files())
    assert n_files > 1
    assert s.clean(force=True) == n_files - 1
    assert len(s.data_files()) == 1  # the active segment stays
    s.close()


def test_retention_respects_the_callers_floor(tmp_path: Path) -> None:
    s = FileStore(tmp_path, TINY)
    s.append_as_leader(1, bodies(100, size=300))
    s.update_committed(99)
    s.set_retention_floor(2 * 4096)
    s.clean(force=True)
    assert s.ledger_begin_pos == 2 * 4096
    s.close()


def test_retention_by_disk_ratio(tmp_path: Path) -> None:
    usage = [0.5]
    s = FileStore(tmp_path, TINY, disk_usage=lambda: usage[0])
    s.append_as_leader(1, bodies(60, size=300))
    s.update_committed(59)
    assert s.clean() == 0
    usage[0] = 0.88  # above disk_clean_ratio 0.85
    assert s.clean() > 0
    s.close()


def test_appends_above_the_disk_full_ratio_fail_with_disk_full(tmp_path: Path) -> None:
    usage = [0.95]
    s = FileStore(tmp_path, TINY, disk_usage=lambda: usage[0])
    with pytest.raises(StoreError) as e:
        s.append_as_leader(1, bodies(1))
    assert e.value.code == DLedgerCode.DISK_FULL
    with pytest.raises(StoreError) as e:
        s.append_as_follower(encode_entry(0, 1, 0, b"x"))
    assert e.value.code == DLedgerCode.DISK_FULL
    assert s.ledger_end_index == -1
    s.close()


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        StoreSettings(index_file_size=100)
    with pytest.raises(ValueError, match="flush"):
        StoreSettings(flush="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratio"):
        StoreSettings(disk_clean_ratio=0.95, disk_full_ratio=0.9)
