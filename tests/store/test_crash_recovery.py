"""Crash recovery over 500 seeded cases (docs/formats.md).

Each case writes entries in random batches to tiny segments, closes the store, then
damages the data files the way a crash or a bad disk does: cuts the log at a random byte
(the segment file truncated and later ones gone), zeroes a random tail range, or flips
random bytes in a tail range. On reopen, every entry wholly before the first changed
byte must be there and intact, nothing at or after it may be, and appending continues.
Some cases also commit an index below the damage, so recovery starts at the checkpoint.

Replay one case: ``pytest tests/store/test_crash_recovery.py -k 'seed_123]'``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreSettings
from dledger.store.mmapfile import segment_name

SEG = 2048
SETTINGS = StoreSettings(data_file_size=SEG, index_file_size=32 * 8, flush_interval_ms=50)
CASES = 500


def _write_log(store: FileStore, rng: random.Random) -> list[tuple[int, int, bytes]]:
    """Append random batches; returns (pos, size, body) per index."""
    written: list[tuple[int, int, bytes]] = []
    term = 1
    for _ in range(rng.randint(1, 8)):
        term += rng.random() < 0.3
        batch = [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 12))]
        for meta, body in zip(store.append_as_leader(term, batch), batch, strict=True):
            written.append((meta.pos, meta.size, body))
    return written


def _damage(root: Path, rng: random.Random, end_pos: int) -> tuple[str, int]:
    """Damage the data files; returns (kind, first changed pos) — or end_pos if nothing
    that mattered changed."""
    data = root / "data"
    at = rng.randrange(0, end_pos)
    seg_start = at - at % SEG
    path = data / segment_name(seg_start)
    kind = rng.choice(["cut", "zero", "corrupt"])
    raw = bytearray(path.read_bytes())
    rel = at - seg_start
    if kind == "cut":
        path.write_bytes(raw[:rel])
        for p in data.iterdir():
            if int(p.name) > seg_start:
                p.unlink()
        # The cut turns the rest of the segment into zeros and drops later segments: the
        # first changed byte is the first non-zero one at or after the cut, else the
        # start of the next segment.
        nonzero = next((k for k in range(rel, SEG) if raw[k]), None)
        first = seg_start + nonzero if nonzero is not None else seg_start + SEG
        return kind, min(first, end_pos)
    length = rng.randint(1, 400)
    end_rel = min(SEG, rel + length)
    old = bytes(raw[rel:end_rel])
    if kind == "zero":
        raw[rel:end_rel] = bytes(end_rel - rel)
    else:
        for k in range(rel, end_rel):
            raw[k] ^= rng.randint(1, 255)
    path.write_bytes(raw)
    changed = [k for k in range(end_rel - rel) if old[k] != raw[rel + k]]
    return kind, (seg_start + rel + changed[0]) if changed else end_pos


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed_{s}") for s in range(CASES)])
def test_torn_tail_is_truncated_and_everything_before_it_survives(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    store = FileStore(tmp_path, SETTINGS)
    written = _write_log(store, rng)
    end_pos = store.ledger_end_pos
    kind, damage_pos = _damage_after_commit(store, tmp_path, rng, written, end_pos)
    intact = [i for i, (pos, size, _) in enumerate(written) if pos + size <= damage_pos]
    expect_end = len(intact) - 1
    assert intact == list(range(len(intact))), "entries wholly before the damage form a prefix"

    store = FileStore(tmp_path, SETTINGS)
    try:
        assert store.ledger_end_index == expect_end, (
            f"{kind} at pos {damage_pos}: end {store.ledger_end_index}, expected {expect_end}"
        )
        for i in intact:
            e = store.get(i)
            assert (e.pos, e.size, e.body) == written[i]
        # the log ends where its last intact entry ends (no blank padding after it)
        last_end = written[expect_end][0] + written[expect_end][1] if intact else 0
        assert store.ledger_end_pos == last_end
        # appending continues right after the last intact entry
        (m,) = store.append_as_leader(99, [b"after-recovery"])
        assert m.index == expect_end + 1
        store.close()
        store = FileStore(tmp_path, SETTINGS)
        assert store.get(m.index).body == b"after-recovery"
        assert store.ledger_end_index == m.index
    finally:
        store.close()


def _damage_after_commit(
    store: FileStore,
    root: Path,
    rng: random.Random,
    written: list[tuple[int, int, bytes]],
    end_pos: int,
) -> tuple[str, int]:
    """Close the store (maybe with a committed index), then damage it. The committed
    index, when set, lies wholly before the damage: damage there is a different test."""
    commit_before = rng.random() < 0.5
    # Choose the damage first on a copy of the positions, commit below it, then apply.
    state = rng.getstate()
    probe = random.Random()
    probe.setstate(state)
    at = probe.randrange(0, end_pos)
    if commit_before:
        below = [i for i, (pos, size, _) in enumerate(written) if pos + size <= at]
        if below:
            store.update_committed(rng.choice(below))
            rng.setstate(state)
    store.close()
    return _damage(root, rng, end_pos)
