"""Run one fuzz target with atheris (libFuzzer for Python).

    python -m tests.fuzz --list
    python -m tests.fuzz TARGET [-runs=N] [-max_total_time=S] [other libFuzzer flags]
    python -m tests.fuzz TARGET crash-file ...      # replay inputs (libFuzzer does)
    python -m tests.fuzz --replay TARGET PATH ...   # replay without atheris, with a traceback

Unless given, these flags are added: ``-timeout=10`` (seconds per input: a hang is a
finding), ``-rss_limit_mb=2048`` and ``-malloc_limit_mb=1024`` (unbounded memory is a
finding), the target's ``-max_len``, ``-print_final_stats=1`` (the figures the README
quotes) and an ``-artifact_prefix`` under the work directory. Without a corpus directory
among the arguments, the corpus is ``WORKDIR/corpus/TARGET``, kept between runs and
seeded with the target's seeds and its regression inputs (``regressions/TARGET``). The
work directory is ``--workdir``, else ``$LEDGERMQ_FUZZ_DIR``, else
``/tmp/ledgermq-fuzz``.

Only the product packages are instrumented for coverage (not the tests, not libraries;
the Python client, `ledgermq.client`, for its decoder of record pages).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import logging
import os
import sys
from pathlib import Path

from . import registry

REGRESSIONS = Path(__file__).parent / "regressions"
INSTRUMENTED = ["dledger", "broker", "consumequeue", "api", "ledgermq.client"]
DEFAULT_FLAGS = {
    "-timeout": "10",
    "-rss_limit_mb": "2048",
    "-malloc_limit_mb": "1024",
    "-print_final_stats": "1",
}


def regression_inputs(name: str) -> list[Path]:
    d = REGRESSIONS / name
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def seed_corpus(corpus: Path, t: registry.Target) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    inputs = [*t.seeds(), *(p.read_bytes() for p in regression_inputs(t.name))]
    for data in inputs:
        (corpus / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)


def _replay(t: registry.Target, paths: list[str]) -> int:
    files = []
    for p in map(Path, paths):
        files += sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p]
    for f in files:
        t.run(f.read_bytes())
    print(f"{len(files)} inputs of {t.name}: no finding")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--replay", action="store_true", help="run inputs without atheris")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("target", nargs="?")
    args, rest = ap.parse_known_args(argv)
    if args.list:
        for t in registry.load().values():
            print(f"{t.name:22} {t.doc}")
        return 0
    if args.target is None:
        ap.error("name a target (--list shows them)")
    registry.remove_stale_scratch()
    atexit.register(registry.remove_scratch_root)  # (only --replay and --list get here)
    # Damaged input is logged as a warning by design (a skipped metadata operation, a
    # dropped key index file): millions of inputs would print millions of lines.
    logging.disable(logging.WARNING)
    if args.replay:
        t = registry.load().get(args.target)
        if t is None:
            ap.error(f"no target {args.target}")
        return _replay(t, rest)
    import atheris  # noqa: PLC0415  # only fuzzing needs it

    with atheris.instrument_imports(include=INSTRUMENTED):
        targets = registry.load()
    t = targets.get(args.target)
    if t is None:
        ap.error(f"no target {args.target} (--list shows them)")
    workdir = args.workdir or Path(os.environ.get("LEDGERMQ_FUZZ_DIR", "/tmp/ledgermq-fuzz"))
    flags = [a for a in rest if a.startswith("-")]
    paths = [a for a in rest if not a.startswith("-")]
    given = {f.split("=", 1)[0] for f in flags}
    defaults = {**DEFAULT_FLAGS, "-max_len": str(t.max_len)}
    artifacts = workdir / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    defaults["-artifact_prefix"] = f"{artifacts}/{t.name}-"
    flags += [f"{k}={v}" for k, v in defaults.items() if k not in given]
    if not paths:
        corpus = workdir / "corpus" / t.name
        seed_corpus(corpus, t)
        paths = [str(corpus)]
    atheris.Setup([sys.argv[0], *flags, *paths], t.run)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
