"""CRC-32 throughput: ``zlib.crc32`` against crcmod's predefined ``crc-32``.

Run from the repository root::

    python bench/crc_bench.py [--sizes 64,1024,65536] [--inputs 64] [--mib 64] [--repeat 5]

For each input size it generates ``--inputs`` random buffers, checks that both functions
agree on every one of them (and on the standard check string ``123456789``), then times
calls over the buffers in turn: each timing loop hashes about ``--mib`` MiB (at least
1,000 calls) and the best of ``--repeat`` loops counts. It prints ns per call and MB/s
(10^6 bytes/s) for each function and the ratio crcmod time / zlib time, then one ``JSON:``
line. The figures include the cost of a Python call in a ``for`` loop, which the table
shows separately as "loop overhead" (an empty loop over the same inputs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import crcmod.crcmod
import crcmod.predefined
from tqdm import tqdm

MiB = 1 << 20
MB = 1_000_000
CHECK_INPUT = b"123456789"
CHECK_VALUE = 0xCBF43926  # CRC-32 of "123456789" (the catalogue's check value)

CrcFn = Callable[[bytes], int]


def zlib_crc32(data: bytes) -> int:
    """Reference wrapper, used only for the agreement checks (not timed)."""
    return zlib.crc32(data) & 0xFFFFFFFF


def check_agreement(crcmod_fn: CrcFn, inputs: Sequence[bytes]) -> None:
    """Both implementations must give the same unsigned CRC on every input."""
    for name, fn in (("zlib.crc32", zlib_crc32), ("crcmod crc-32", crcmod_fn)):
        if fn(CHECK_INPUT) != CHECK_VALUE:
            raise SystemExit(f"{name}: wrong check value {fn(CHECK_INPUT):#010x}")
    for k, data in enumerate(inputs):
        a, b = zlib_crc32(data), crcmod_fn(data)
        if a != b:
            raise SystemExit(f"input {k} ({len(data)} bytes): zlib {a:#010x} != crcmod {b:#010x}")


def time_calls(fn: CrcFn | None, seq: Sequence[bytes]) -> float:
    """Seconds to call ``fn`` on every element of ``seq`` (an empty loop if ``fn`` is None)."""
    if fn is None:
        t0 = time.perf_counter()
        for _ in seq:
            pass
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    for data in seq:
        fn(data)
    return time.perf_counter() - t0


def bench_size(
    size: int, n_inputs: int, target_bytes: int, repeat: int, crcmod_fn: CrcFn, bar: tqdm
) -> dict[str, Any]:
    inputs = [os.urandom(size) for _ in range(n_inputs)]
    check_agreement(crcmod_fn, inputs)
    calls = max(1_000, target_bytes // max(size, 1))
    seq = [inputs[i % n_inputs] for i in range(calls)]
    candidates: list[tuple[str, CrcFn | None]] = [
        ("loop", None),
        ("zlib", zlib.crc32),
        ("crcmod", crcmod_fn),
    ]
    best = {name: float("inf") for name, _ in candidates}
    for _ in range(repeat):  # interleaved, so drift hits every function alike
        for name, fn in candidates:
            best[name] = min(best[name], time_calls(fn, seq))
            bar.update(1)
    row: dict[str, Any] = {"size": size, "calls": calls, "inputs_checked": n_inputs + 1}
    for name in ("loop", "zlib", "crcmod"):
        row[f"{name}_ns_per_call"] = best[name] / calls * 1e9
    for name in ("zlib", "crcmod"):
        row[f"{name}_mb_per_s"] = size * calls / best[name] / MB
    row["crcmod_over_zlib"] = best["crcmod"] / best["zlib"]
    return row


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def fmt_size(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} B"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--sizes", default="64,1024,65536", help="input sizes in bytes, comma-separated")
    p.add_argument("--inputs", type=int, default=64, help="random inputs per size")
    p.add_argument("--mib", type=float, default=64.0, help="MiB hashed per timing loop")
    p.add_argument("--repeat", type=int, default=5, help="timing loops per function; best wins")
    args = p.parse_args(argv)
    try:
        args.size_list = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 0:
        p.error("--sizes needs at least one size >= 0")
    if args.inputs < 1 or args.repeat < 1 or args.mib <= 0:
        p.error("--inputs and --repeat must be >= 1, --mib > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    crcmod_fn: CrcFn = crcmod.predefined.mkCrcFun("crc-32")
    using_ext = bool(getattr(crcmod.crcmod, "_usingExtension", False))
    target = int(args.mib * MiB)
    rows: list[dict[str, Any]] = []
    steps = len(args.size_list) * args.repeat * 3
    with tqdm(total=steps, desc="crc timing loops", unit="loop", leave=False) as bar:
        for size in args.size_list:
            rows.append(bench_size(size, args.inputs, target, args.repeat, crcmod_fn, bar))

    print(
        f"CRC-32 on random inputs: zlib {zlib.ZLIB_RUNTIME_VERSION} vs crcmod predefined"
        f" 'crc-32' ({'C extension' if using_ext else 'pure Python'});"
        f" best of {args.repeat} loops"
    )
    headers = [
        "input",
        "calls/loop",
        "zlib ns/call",
        "zlib MB/s",
        "crcmod ns/call",
        "crcmod MB/s",
        "crcmod/zlib",
        "loop overhead ns",
    ]
    body = [
        [
            fmt_size(r["size"]),
            f"{r['calls']:,}",
            f"{r['zlib_ns_per_call']:,.1f}",
            f"{r['zlib_mb_per_s']:,.0f}",
            f"{r['crcmod_ns_per_call']:,.1f}",
            f"{r['crcmod_mb_per_s']:,.0f}",
            f"{r['crcmod_over_zlib']:.2f}x",
            f"{r['loop_ns_per_call']:.1f}",
        ]
        for r in rows
    ]
    print(table(headers, body))
    checked = sum(r["inputs_checked"] for r in rows)
    print(f"agreement: zlib and crcmod equal on all {checked} checked inputs")
    figures = {
        "zlib_version": zlib.ZLIB_RUNTIME_VERSION,
        "crcmod_extension": using_ext,
        "repeat": args.repeat,
        "rows": rows,
    }
    print("JSON: " + json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
