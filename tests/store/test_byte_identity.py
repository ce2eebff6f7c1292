"""Replicas are byte-identical (docs/formats.md): a store fed entries as leader and another fed
the same bytes as follower end with identical data and index files, through roll-overs,
term changes, hooks and truncations; and the memory store places every entry at the
same pos with the same bytes as the file store."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from dledger.store import (
    BODY_OFFSET,
    EntryMeta,
    FileStore,
    MemoryStore,
    StoreSettings,
)

SETTINGS = StoreSettings(data_file_size=3000, index_file_size=32 * 10, flush_interval_ms=20)


def _physical_offset_hook(meta: EntryMeta, buf: memoryview, body_offset: int) -> None:
    if len(buf) - body_offset >= 36:
        struct.pack_into(">q", buf, body_offset + 28, meta.pos + body_offset)


def _files(root: Path) -> dict[str, bytes]:
    return {
        f"{sub}/{p.name}": p.read_bytes()
        for sub in ("data", "index")
        for p in sorted((root / sub).iterdir())
    }


def _replicate(
    leader: FileStore | MemoryStore, follower: FileStore | MemoryStore, rng: random.Random
) -> None:
    """Ship everything the follower lacks in randomly sized raw batches."""
    nxt = follower.ledger_end_index + 1
    while nxt <= leader.ledger_end_index:
        raw = leader.read_entries(nxt, rng.randint(1, 4000), rng.randint(1, 20))
        nxt = follower.append_as_follower(raw)[-1].index + 1


@pytest.mark.parametrize("seed", range(40))
def test_leader_and_follower_files_are_byte_identical(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    leader = FileStore(tmp_path / "leader", SETTINGS)
    leader.add_append_hook(_physical_offset_hook)
    follower = FileStore(tmp_path / "follower", SETTINGS)
    term = 1
    for _ in range(rng.randint(3, 12)):
        if rng.random() < 0.3:
            term += 1
        batch = [rng.randbytes(rng.randint(0, 700)) for _ in range(rng.randint(1, 15))]
        leader.append_as_leader(term, batch)
        if rng.random() < 0.5:
            _replicate(leader, follower, rng)
        if rng.random() < 0.25 and leader.ledger_end_index > 0:
            # an uncommitted suffix is dropped on both (a new leader overwrote it)
            cut = rng.randint(0, leader.ledger_end_index)
            leader.truncate(cut)
            follower.truncate(cut)
    _replicate(leader, follower, rng)
    leader.update_committed(leader.ledger_end_index)
    follower.update_committed(follower.ledger_end_index)
    leader.close()
    follower.close()
    a, b = _files(tmp_path / "leader"), _files(tmp_path / "follower")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], f"{name} differs (seed {seed})"


@pytest.mark.parametrize("seed", range(20))
def test_memory_store_places_entries_exactly_like_the_file_store(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    fs = FileStore(tmp_path, SETTINGS)
    ms = MemoryStore(SETTINGS)
    for store in (fs, ms):
        store.add_append_hook(_physical_offset_hook)
    term = 1
    for _ in range(rng.randint(3, 10)):
        term += rng.random() < 0.3
        batch = [rng.randbytes(rng.randint(0, 700)) for _ in range(rng.randint(1, 10))]
        assert fs.append_as_leader(term, batch) == ms.append_as_leader(term, batch)
        if rng.random() < 0.2 and fs.ledger_end_index > 0:
            cut = rng.randint(0, fs.ledger_end_index)
            assert fs.truncate(cut) == ms.truncate(cut)
        assert fs.ledger_end_chain == ms.ledger_end_chain
    for i in range(fs.ledger_end_index + 1):
        assert fs.get(i) == ms.get(i)
        assert fs.read_entries(i, 2000, 5) == ms.read_entries(i, 2000, 5)
        m = fs.get_meta(i)
        assert fs.read(m.pos + BODY_OFFSET, m.size - BODY_OFFSET) == ms.read(
            m.pos + BODY_OFFSET, m.size - BODY_OFFSET
        )
        assert fs.first_index_of_term(fs.term_at(i), i) == ms.first_index_of_term(ms.term_at(i), i)
    fs.close()


def test_memory_store_follower_reset_and_retention() -> None:
    leader, follower = MemoryStore(SETTINGS), MemoryStore(SETTINGS)
    leader.append_as_leader(1, [bytes([i]) * 200 for i in range(40)])
    leader.update_committed(39)
    leader.delete_before(20)
    assert leader.ledger_begin_index == 20
    prev_term, prev_chain = leader.ledger_before_begin_term, leader.ledger_before_begin_chain
    follower.reset(20, leader.get_meta(20).pos, prev_term, prev_chain)
    _replicate(leader, follower, random.Random(0))
    assert follower.ledger_end_index == 39
    assert follower.get(30) == leader.get(30)
