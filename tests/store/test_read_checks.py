"""Reads check what they return (issue 17: "a corrupted byte in a committed entry is served
unverified"): ``get`` and ``read_entry_at`` refuse a damaged copy with
``CorruptEntryError`` (naming the file, the byte and the entry) and serve every other
entry; a position that is only a guess (a client's message id) finds no entry where none
starts, even behind a header forged inside a body. The damage is made while the store is
open, through the file (the mapping sees it), as bit rot would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode
from dledger.store import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    CorruptEntryError,
    EntryMeta,
    FileStore,
    MemoryStore,
    StoreError,
    encode_entry,
)

from ..conftest import TINY


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    s = FileStore(tmp_path, TINY)
    yield s
    s.close()


def _fill(store: FileStore, n: int = 12) -> list[EntryMeta]:
    metas = list(store.append_as_leader(1, [bytes([65 + i]) * (40 + i) for i in range(n)]))
    store.update_committed(metas[-1].index)
    return metas


def _poke(path: Path, rel: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, rel)
    finally:
        os.close(fd)


def _flip(store: FileStore, pos: int) -> Path:
    """Flip the data byte at ``pos`` in place, through the file."""
    seg = pos - pos % TINY.data_file_size
    path = store.dir / "data" / f"{seg:020d}"
    _poke(path, pos - seg, bytes([store.read(pos, 1)[0] ^ 0x10]))
    return path


def test_a_damaged_body_is_refused_by_get_and_by_position_and_the_rest_reads(
    store: FileStore,
) -> None:
    metas = _fill(store)
    victim = metas[5]
    path = _flip(store, victim.pos + BODY_OFFSET + 3)
    with pytest.raises(CorruptEntryError) as e:
        store.get(victim.index)
    assert (e.value.index, e.value.pos, e.value.code) == (victim.index, victim.pos,
                                                          DLedgerCode.DISK_ERROR)  # fmt: skip
    assert str(path) in e.value.message and "CRC" in e.value.message
    for size in (None, victim.size - BODY_OFFSET):
        with pytest.raises(CorruptEntryError, match="body CRC mismatch"):
            store.read_entry_at(victim.pos, size)
    for m in metas[:5] + metas[6:]:
        raw = store.read_entry_at(m.pos, m.size - BODY_OFFSET)
        assert raw == store.read(m.pos, m.size) and store.get(m.index).pos == m.pos


def test_a_header_that_disagrees_with_its_index_unit_is_damage(store: FileStore) -> None:
    metas = _fill(store)
    victim = metas[3]
    _flip(store, victim.pos + 16)  # the term field: the body CRC does not cover it
    with pytest.raises(CorruptEntryError, match="disagrees with its index unit"):
        store.get(victim.index)
    with pytest.raises(CorruptEntryError, match="disagrees with its index unit"):
        store.read_entry_at(victim.pos)


def test_a_damaged_magic_is_damage_where_the_index_unit_names_the_entry(
    store: FileStore,
) -> None:
    metas = _fill(store)
    victim = metas[2]
    _flip(store, victim.pos)  # the magic
    for size in (None, victim.size - BODY_OFFSET):
        with pytest.raises(CorruptEntryError, match="disagrees with its index unit"):
            store.read_entry_at(victim.pos, size)


def test_a_header_damaged_beyond_recognition(store: FileStore) -> None:
    """A header that no longer names its own position: with the size a consume-queue
    unit gives, an entry must be there, so it is damage; without it (a client's guess)
    nothing says one was: not found."""
    metas = _fill(store)
    victim = metas[2]
    _flip(store, victim.pos + 31)  # the low byte of the pos field
    with pytest.raises(CorruptEntryError, match="no intact entry header"):
        store.read_entry_at(victim.pos, victim.size - BODY_OFFSET)
    with pytest.raises(StoreError) as e:
        store.read_entry_at(victim.pos)
    assert e.value.code is DLedgerCode.INDEX_OUT_OF_RANGE and not e.value.damaged


def test_a_guessed_position_finds_no_entry_where_none_starts(store: FileStore) -> None:
    """Even behind a well-formed header, naming its own position, forged inside a body:
    the index unit of the index it names points elsewhere."""
    first = store.append_as_leader(1, [b"a" * 40])[0]
    forged_at = first.pos + first.size + BODY_OFFSET + 8  # inside the next entry's body
    forged = encode_entry(first.index, 1, forged_at, b"z" * 8)
    body = b"\0" * 8 + forged + b"\0" * 8
    [carrier] = store.append_as_leader(1, [body])
    store.update_committed(carrier.index)
    for pos in (forged_at, carrier.pos + 1, carrier.pos + BODY_OFFSET, -5, 1 << 40):
        with pytest.raises(StoreError) as e:
            store.read_entry_at(pos)
        assert e.value.code is DLedgerCode.INDEX_OUT_OF_RANGE, pos
    assert store.read_entry_at(carrier.pos)[BODY_OFFSET:] == body


def test_a_size_other_than_the_entrys_is_damage(store: FileStore) -> None:
    m = _fill(store)[4]
    with pytest.raises(CorruptEntryError, match="where 7 are expected"):
        store.read_entry_at(m.pos, 7)


def test_an_entry_past_max_end_is_not_served(store: FileStore) -> None:
    metas = _fill(store)
    with pytest.raises(StoreError) as e:
        store.read_entry_at(metas[-1].pos, max_end=metas[-1].pos + 10)
    assert e.value.code is DLedgerCode.INDEX_OUT_OF_RANGE
    assert store.read_entry_at(metas[-1].pos, max_end=metas[-1].pos + metas[-1].size)


def test_an_index_unit_pointing_outside_the_data_is_damage(store: FileStore) -> None:
    """Found by fuzzing (store_recovery): ``get`` raised IndexError."""
    metas = _fill(store)
    victim = metas[7]
    unit_pos = victim.index * INDEX_UNIT_SIZE
    seg = unit_pos - unit_pos % TINY.index_file_size
    _poke(store.dir / "index" / f"{seg:020d}", unit_pos - seg + 12, (1 << 25).to_bytes(4, "big"))
    with pytest.raises(CorruptEntryError, match="points outside the data"):
        store.get(victim.index)


def test_the_memory_store_refuses_a_damaged_copy_alike() -> None:
    s = MemoryStore()
    [m] = s.append_as_leader(1, [b"hello"])
    raw = bytearray(s._entries[0])
    raw[-1] ^= 1
    s._entries[0] = bytes(raw)
    with pytest.raises(CorruptEntryError) as e:
        s.get(m.index)
    assert (e.value.index, e.value.pos) == (m.index, m.pos)


@pytest.mark.parametrize(
    ("where", "size_delta"),
    [(BODY_OFFSET + 3, 0), (16, 0), (0, 0), (31, 0), (None, -1)],
    ids=["body", "term", "magic", "pos", "size"],
)
def test_a_page_read_refuses_what_one_read_refuses(
    store: FileStore, where: int | None, size_delta: int
) -> None:
    """``read_entries_at`` (a pull's page, one hold of the lock, a single read of header
    and body where all is well) raises for a damaged entry in the page exactly what
    ``read_entry_at`` raises for it, and reads an intact page as the single reads do."""
    metas = _fill(store)
    spans = [(m.pos, m.size - BODY_OFFSET) for m in metas]
    assert store.read_entries_at(spans) == [store.read(m.pos, m.size) for m in metas]
    victim = metas[6]
    if where is not None:
        _flip(store, victim.pos + where)
    page = [*spans[4:6], (victim.pos, victim.size - BODY_OFFSET + size_delta), *spans[7:]]
    with pytest.raises(StoreError) as one:
        store.read_entry_at(*page[2])
    with pytest.raises(StoreError) as many:
        store.read_entries_at(page)
    assert type(many.value) is type(one.value)
    assert (many.value.code, many.value.message) == (one.value.code, one.value.message)


def test_a_page_read_past_max_end_is_not_served(store: FileStore) -> None:
    metas = _fill(store)
    spans = [(m.pos, m.size - BODY_OFFSET) for m in metas]
    with pytest.raises(StoreError) as e:
        store.read_entries_at(spans, max_end=metas[-1].pos + 10)
    assert e.value.code is DLedgerCode.INDEX_OUT_OF_RANGE
    assert len(store.read_entries_at(spans[:-1], max_end=metas[-1].pos)) == len(metas) - 1
