"""FileStore append throughput against a raw-file baseline, and recovery time.

Run from the repository root::

    python bench/store_bench.py [--entries N] [--body-bytes 1024] [--batch 100] [--dir DIR]
                                [--recovery-gib 1.0] [--skip-recovery] [--json PATH]

What it measures (see bench/README.md):

- raw baselines: the same encoded entry bytes (48-byte header + body) written one
  ``write`` per entry to a buffered ``open(..., "wb")`` file; without fsync, with
  ``os.fdatasync`` after every batch and with ``os.fdatasync`` after every entry;
- ``FileStore.append_as_leader`` one entry at a time and in batches, with ``flush="async"``
  and ``flush="sync"``; each is compared with the raw baseline of the same durability and
  granularity;
- recovery time of a ~1 GiB log: with the checkpoint, verifying every entry
  (``recovery_verify="all"``) and with the checkpoint file deleted.

Progress bars go to stderr; the summary tables go to stdout, followed by one ``JSON:`` line
(or the JSON goes to ``--json PATH``). Everything the benchmark writes lives in one fresh
directory that is deleted at the end, even on error.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from dledger.store import BODY_OFFSET, FileStore, StoreSettings, encode_entry

MiB = 1 << 20
GiB = 1 << 30
MB = 1_000_000  # throughput is reported in decimal MB/s

FlushMode = Literal["async", "sync"]
StepFn = Callable[[int, int], None]

log = logging.getLogger("store_bench")


# ---- results -------------------------------------------------------------------------


@dataclass(slots=True)
class AppendResult:
    """One measured write loop: a raw baseline or a FileStore configuration."""

    name: str
    kind: Literal["raw", "store"]
    durability: str  # "none", "fdatasync/entry", "fdatasync/batch", "async", "sync"
    batch: int  # entries per append call (store) or per fdatasync (raw); 1 for single
    entries: int
    entry_bytes: int
    seconds: float
    baseline: str | None = None
    ratio_to_raw: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else math.inf

    @property
    def mb_per_s(self) -> float:
        return self.entry_bytes / self.seconds / MB if self.seconds > 0 else math.inf

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries_per_s"] = self.entries_per_s
        d["mb_per_s"] = self.mb_per_s
        return d


@dataclass(slots=True)
class RecoveryResult:
    """One timed reopen of the recovery log."""

    name: str
    recovery_verify: str
    checkpoint: bool
    open_seconds: float  # wall time of the FileStore constructor
    recovery_seconds: float  # store.recovery_stats["seconds"]
    scanned_entries: int
    rebuilt_index_from: int
    end_index: int
    committed_index: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class WarningCounter(logging.Handler):
    """Keeps every warning or error a store logs during the run, for the summary."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


# ---- inputs --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    """Pre-generated bodies, encoded entries and batch lists, cycled by every loop."""

    bodies: list[bytes]
    encoded: list[bytes]  # header + body, the bytes the raw baselines write
    entry_size: int

    @property
    def pool(self) -> int:
        return len(self.bodies)

    def batches(self, size: int) -> list[list[bytes]]:
        """``pool`` ready-made lists of ``size`` bodies (cycled by the append loops)."""
        n = self.pool
        return [[self.bodies[(b * size + j) % n] for j in range(size)] for b in range(n)]


def make_inputs(body_bytes: int, pool: int) -> Inputs:
    bodies = [os.urandom(body_bytes) for _ in range(pool)]
    encoded = [encode_entry(i, 1, i * (BODY_OFFSET + body_bytes), b) for i, b in enumerate(bodies)]
    return Inputs(bodies, encoded, BODY_OFFSET + body_bytes)


# ---- timing helpers ------------------------------------------------------------------


def timed_loop(
    desc: str,
    total: int,
    step_entries: int,
    step: StepFn,
    finish: Callable[[], None] | None = None,
) -> float:
    """Run ``step(start, count)`` over ``total`` entries in chunks of ``step_entries``
    (then ``finish``), with a progress bar updated once per chunk; return the seconds."""
    with tqdm(total=total, desc=desc, unit="entry", unit_scale=True, leave=False) as bar:
        done = 0
        t0 = time.perf_counter()
        while done < total:
            k = min(step_entries, total - done)
            step(done, k)
            done += k
            bar.update(k)
        if finish is not None:
            finish()
        return time.perf_counter() - t0


def slug(name: str) -> str:
    """``name`` as a file name: letters and digits kept, anything else becomes ``-``."""
    return "".join(c if c.isalnum() else "-" for c in name)


def chunk_for(batch: int, target: int) -> int:
    """A progress chunk of about ``target`` entries that is a whole number of batches."""
    return batch * max(1, target // batch)


# ---- raw baselines -------------------------------------------------------------------


def run_raw(
    workdir: Path, inputs: Inputs, entries: int, sync_every: int | None, name: str
) -> AppendResult:
    """Write ``entries`` encoded entries, one ``write`` each, to a buffered file; with
    ``sync_every`` set, flush and ``fdatasync`` after every ``sync_every`` entries."""
    path = workdir / f"raw-{slug(name)}.bin"
    encoded = inputs.encoded
    pool = inputs.pool
    try:
        with open(path, "wb") as f:
            write = f.write
            fd = f.fileno()

            if sync_every is None:

                def step(start: int, count: int) -> None:
                    for i in range(start, start + count):
                        write(encoded[i % pool])

                seconds = timed_loop(f"raw {name}", entries, 4096, step, f.flush)
                durability = "none"
                batch = 1
            else:
                every = sync_every
                flush = f.flush

                def step(start: int, count: int) -> None:
                    i, end = start, start + count
                    while i < end:
                        j = min(i + every, end)
                        for x in range(i, j):
                            write(encoded[x % pool])
                        flush()
                        os.fdatasync(fd)
                        i = j

                seconds = timed_loop(f"raw {name}", entries, chunk_for(every, 1000), step)
                durability = "fdatasync/entry" if every == 1 else "fdatasync/batch"
                batch = every
    finally:
        path.unlink(missing_ok=True)
    return AppendResult(
        name=f"raw {name}",
        kind="raw",
        durability=durability,
        batch=batch,
        entries=entries,
        entry_bytes=entries * inputs.entry_size,
        seconds=seconds,
    )


# ---- FileStore appends ---------------------------------------------------------------


def store_settings(
    args: argparse.Namespace,
    flush: FlushMode,
    recovery_verify: Literal["checkpoint", "all"] = "checkpoint",
) -> StoreSettings:
    return StoreSettings(
        data_file_size=args.data_file_mib * MiB,
        index_file_size=args.index_file_mib * MiB,
        flush=flush,
        recovery_verify=recovery_verify,
    )


def run_store(
    workdir: Path,
    args: argparse.Namespace,
    inputs: Inputs,
    entries: int,
    batch: int,
    flush: FlushMode,
    name: str,
) -> AppendResult:
    """``append_as_leader(1, bodies)`` with ``batch`` bodies per call into a fresh store."""
    directory = workdir / f"store-{slug(name)}"
    batches = inputs.batches(batch)
    pool = inputs.pool
    store = FileStore(directory, store_settings(args, flush))
    try:
        step = batch_stepper(store, batches, batch, pool)

        target = 100 if flush == "sync" and batch == 1 else 2000
        seconds = timed_loop(f"store {name}", entries, chunk_for(batch, target), step)
        end_index = store.ledger_end_index
        segments = len(store.data_files()), len(store.index_files())
        t0 = time.perf_counter()
        store.close()
        close_seconds = time.perf_counter() - t0
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    if end_index != entries - 1:
        log.error("store %s: ledger end index %d, expected %d", name, end_index, entries - 1)
    return AppendResult(
        name=f"store {name}",
        kind="store",
        durability=flush,
        batch=batch,
        entries=entries,
        entry_bytes=entries * inputs.entry_size,
        seconds=seconds,
        extra={
            "close_seconds": close_seconds,
            "data_segments": segments[0],
            "index_segments": segments[1],
        },
    )


def batch_stepper(
    store: FileStore, batches: list[list[bytes]], batch: int, pool: int
) -> Callable[[int, int], None]:
    """A ``timed_loop`` step appending entries ``[start, start + count)`` in batches."""
    append = store.append_as_leader

    def step(start: int, count: int) -> None:
        i, end = start, start + count
        while i < end:
            j = min(i + batch, end)
            bodies = batches[(i // batch) % pool]
            append(1, bodies if j - i == batch else bodies[: j - i])
            i = j

    return step


# ---- recovery ------------------------------------------------------------------------


def build_recovery_log(
    directory: Path, args: argparse.Namespace, inputs: Inputs
) -> tuple[int, AppendResult]:
    """Fill a store with ~``--recovery-gib`` of batched appends, commit all, close."""
    entries = max(1, round(args.recovery_gib * GiB / inputs.entry_size))
    batch = args.batch
    batches = inputs.batches(batch)
    pool = inputs.pool
    store = FileStore(directory, store_settings(args, "async"))
    try:
        step = batch_stepper(store, batches, batch, pool)

        seconds = timed_loop(
            f"build {args.recovery_gib:g} GiB log", entries, chunk_for(batch, 5000), step
        )
        store.update_committed(store.ledger_end_index)
    finally:
        store.close()  # syncs everything and writes the checkpoint
    build = AppendResult(
        name=f"store build async batch {batch}",
        kind="store",
        durability="async",
        batch=batch,
        entries=entries,
        entry_bytes=entries * inputs.entry_size,
        seconds=seconds,
    )
    return entries, build


def reopen(
    directory: Path,
    args: argparse.Namespace,
    name: str,
    recovery_verify: Literal["checkpoint", "all"],
) -> RecoveryResult:
    checkpoint = (directory / "checkpoint").exists()
    tqdm.write(f"reopening: {name} ...", file=sys.stderr)
    t0 = time.perf_counter()
    store = FileStore(directory, store_settings(args, "async", recovery_verify))
    open_seconds = time.perf_counter() - t0
    try:
        stats = dict(store.recovery_stats)
        result = RecoveryResult(
            name=name,
            recovery_verify=recovery_verify,
            checkpoint=checkpoint,
            open_seconds=open_seconds,
            recovery_seconds=float(stats.get("seconds", math.nan)),
            scanned_entries=int(stats.get("scanned_entries", -1)),
            rebuilt_index_from=int(stats.get("rebuilt_index_from", -1)),
            end_index=store.ledger_end_index,
            committed_index=store.committed_index,
        )
    finally:
        store.close()
    return result


def run_recovery(
    workdir: Path, args: argparse.Namespace, inputs: Inputs
) -> tuple[AppendResult, list[RecoveryResult], dict[str, float]]:
    directory = workdir / "store-recovery"
    try:
        entries, build = build_recovery_log(directory, args, inputs)
        data_bytes = sum(p.stat().st_size for p in (directory / "data").iterdir())
        results = [
            reopen(directory, args, "checkpoint", "checkpoint"),
            reopen(directory, args, "verify all", "all"),
        ]
        (directory / "checkpoint").unlink()
        results.append(reopen(directory, args, "no checkpoint", "checkpoint"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    for r in results:
        if r.end_index != entries - 1:
            log.error("recovery %s: end index %d, expected %d", r.name, r.end_index, entries - 1)
    info = {"entries": entries, "data_file_bytes": data_bytes}
    return build, results, info


# ---- output --------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Plain text with aligned columns: the first ``left`` columns left-aligned."""
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if k < left else c.rjust(w)
            for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def append_table(results: Sequence[AppendResult]) -> str:
    headers = ["run", "durability", "batch", "entries", "seconds", "entries/s", "MB/s", "vs raw"]
    rows = [
        [
            r.name,
            r.durability,
            str(r.batch),
            f"{r.entries:,}",
            f"{r.seconds:.3f}",
            f"{r.entries_per_s:,.0f}",
            f"{r.mb_per_s:,.1f}",
            "-" if r.ratio_to_raw is None else f"{r.ratio_to_raw:.3f}",
        ]
        for r in results
    ]
    return table(headers, rows, left=2)


def recovery_table(results: Sequence[RecoveryResult]) -> str:
    headers = [
        "reopen",
        "verify",
        "checkpoint",
        "open s",
        "recovery s",
        "scanned",
        "end index",
        "committed",
    ]
    rows = [
        [
            r.name,
            r.recovery_verify,
            "yes" if r.checkpoint else "deleted",
            f"{r.open_seconds:.3f}",
            f"{r.recovery_seconds:.3f}",
            f"{r.scanned_entries:,}",
            f"{r.end_index:,}",
            f"{r.committed_index:,}",
        ]
        for r in results
    ]
    return table(headers, rows, left=3)


# ---- main ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--entries", type=int, default=500_000, help="entries per async run")
    p.add_argument("--sync-entries", type=int, default=200_000, help="entries per batched sync run")
    p.add_argument(
        "--sync-single-entries",
        type=int,
        default=5_000,
        help="entries per one-at-a-time sync run (an fsync each: keep it small)",
    )
    p.add_argument("--body-bytes", type=int, default=1024)
    p.add_argument("--batch", type=int, default=100, help="entries per batched append/fsync")
    p.add_argument("--pool", type=int, default=256, help="distinct pre-generated bodies")
    p.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    p.add_argument("--data-file-mib", type=int, default=64, help="data segment size")
    p.add_argument("--index-file-mib", type=int, default=8, help="index segment size")
    p.add_argument("--recovery-gib", type=float, default=1.0, help="size of the recovery log")
    p.add_argument("--skip-recovery", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="write the JSON figures here")
    args = p.parse_args(argv)
    for name in ("entries", "sync_entries", "sync_single_entries", "batch", "pool"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.body_bytes < 0 or args.recovery_gib <= 0:
        p.error("--body-bytes must be >= 0 and --recovery-gib > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    counter = WarningCounter()
    logging.getLogger().addHandler(counter)

    wall0 = time.perf_counter()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="store_bench-", dir=args.dir))
    inputs = make_inputs(args.body_bytes, args.pool)
    b = args.batch
    print(
        f"store_bench: {inputs.entry_size}-byte entries ({args.body_bytes} B body + 48 B"
        f" header), batch {b}, data segments {args.data_file_mib} MiB, index segments"
        f" {args.index_file_mib} MiB, scratch {workdir}",
        flush=True,
    )
    appends: list[AppendResult] = []
    recovery: list[RecoveryResult] = []
    recovery_info: dict[str, float] = {}
    try:
        raw_none = run_raw(workdir, inputs, args.entries, None, "no fsync")
        raw_batch = run_raw(workdir, inputs, args.sync_entries, b, f"fdatasync/{b}")
        raw_single = run_raw(workdir, inputs, args.sync_single_entries, 1, "fdatasync/1")
        plan: list[tuple[AppendResult, int, int, FlushMode, str]] = [
            (raw_none, args.entries, 1, "async", "async single"),
            (raw_none, args.entries, b, "async", f"async batch {b}"),
            (raw_single, args.sync_single_entries, 1, "sync", "sync single"),
            (raw_batch, args.sync_entries, b, "sync", f"sync batch {b}"),
        ]
        stores: list[AppendResult] = []
        for raw, entries, batch, flush, name in plan:
            r = run_store(workdir, args, inputs, entries, batch, flush, name)
            r.baseline = raw.name
            r.ratio_to_raw = r.entries_per_s / raw.entries_per_s
            stores.append(r)
        appends = [raw_none, raw_batch, raw_single, *stores]
        if not args.skip_recovery:
            build, recovery, recovery_info = run_recovery(workdir, args, inputs)
            build.baseline = raw_none.name
            build.ratio_to_raw = build.entries_per_s / raw_none.entries_per_s
            appends.append(build)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - wall0

    print()
    print("Appends (MB = 10^6 bytes of encoded entries; 'vs raw' = store entries/s divided")
    print("by the raw baseline's: async vs raw no fsync, sync vs raw fdatasync at the same")
    print("granularity)")
    print(append_table(appends))
    if recovery:
        gib = recovery_info["data_file_bytes"] / GiB
        print()
        print(
            f"Recovery of {int(recovery_info['entries']):,} entries"
            f" ({gib:.2f} GiB of data segments, warm page cache)"
        )
        print(recovery_table(recovery))
    print()
    if counter.messages:
        print(f"{len(counter.messages)} warning(s)/error(s) logged:")
        for m in counter.messages[:20]:
            print(f"  {m}")
    else:
        print("no warnings or errors logged")
    print(f"total wall time {wall:.1f} s")

    figures = {
        "config": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"
        }
        | {"entry_size": inputs.entry_size},
        "appends": [r.as_json() for r in appends],
        "recovery": [r.as_json() for r in recovery],
        "recovery_log": recovery_info,
        "warnings": counter.messages,
        "wall_seconds": wall,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {args.json}")
    else:
        print("JSON: " + json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
