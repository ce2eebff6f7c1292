"""The store demonstration (``ledgermq demo`` until the failover demo replaces it).

Appends entries as leader in batches with a progress bar, closes the store, reopens it
(recovery), reads back and verifies every entry, and prints the figures.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from .base import MiB, StoreSettings
from .file_store import FileStore, node_dir


def _body(i: int, size: int) -> bytes:
    seed = hashlib.blake2b(i.to_bytes(8, "big"), digest_size=16).digest()
    return (seed * (size // len(seed) + 1))[:size]


def run_demo(
    data_dir: Path | None = None,
    entries: int = 200_000,
    body_bytes: int = 1024,
    batch: int = 100,
    segment_mib: int = 64,
) -> dict[str, float]:
    """Run the demonstration; returns the figures it printed."""
    own_dir = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="ledgermq-demo-")) if data_dir is None else data_dir
    directory = node_dir(root, "g0", "n0")
    if directory.exists():
        shutil.rmtree(directory)
    settings = StoreSettings(data_file_size=segment_mib * MiB, index_file_size=8 * MiB)
    figures: dict[str, float] = {}
    try:
        print(f"LedgerMQ store demo: {entries:,} entries of {body_bytes} B, batches of {batch},")
        print(f"  {segment_mib} MiB data segments, in {directory}")
        store = FileStore(directory, settings)
        t0 = time.perf_counter()
        with tqdm(total=entries, unit="entry", unit_scale=True, desc="append") as bar:
            for start in range(0, entries, batch):
                n = min(batch, entries - start)
                store.append_as_leader(1, [_body(start + k, body_bytes) for k in range(n)])
                bar.update(n)
        store.update_committed(store.ledger_end_index)
        t_append = time.perf_counter() - t0
        store.close()
        figures["append_entries_per_s"] = entries / t_append
        figures["append_mb_per_s"] = entries * body_bytes / t_append / 1e6

        t0 = time.perf_counter()
        store = FileStore(directory, settings)
        figures["reopen_s"] = time.perf_counter() - t0
        assert store.ledger_end_index == entries - 1, store.ledger_end_index
        t0 = time.perf_counter()
        with tqdm(total=entries, unit="entry", unit_scale=True, desc="verify") as bar:
            for i in range(entries):
                e = store.get(i)  # checks the body CRC
                if e.body != _body(i, body_bytes):
                    raise AssertionError(f"entry {i} differs after reopen")
                if i % 10_000 == 9_999:
                    bar.update(10_000)
            bar.update(entries % 10_000)
        figures["verify_entries_per_s"] = entries / (time.perf_counter() - t0)
        figures["data_segments"] = len(store.data_files())
        store.close()
        print(
            f"appended {entries:,} entries: {figures['append_entries_per_s']:,.0f} entries/s,"
            f" {figures['append_mb_per_s']:,.1f} MB/s of bodies"
        )
        print(
            f"reopened (recovery) in {figures['reopen_s'] * 1000:.1f} ms;"
            f" verified every entry at {figures['verify_entries_per_s']:,.0f} entries/s;"
            f" {figures['data_segments']:.0f} data segments"
        )
        print("OK: every entry read back intact after reopening.")
        return figures
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
