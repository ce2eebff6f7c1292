"""The fuzz targets' registry and what they share: a scratch directory per input.

A target is registered with ``@target(name, max_len=..., seeds=...)``; ``load()`` imports
the modules that define them (inside atheris' import hook when the runner fuzzes, so the
product modules they import are instrumented) and returns the registry.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TARGET_MODULES = (
    "tests.fuzz.targets_dledger",
    "tests.fuzz.targets_broker",
    "tests.fuzz.targets_consumequeue",
    "tests.fuzz.targets_api",
)


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    max_len: int  # libFuzzer's -max_len: inputs longer than this say nothing new
    doc: str


TARGETS: dict[str, Target] = {}


def target(
    name: str, *, max_len: int, seeds: Callable[[], list[bytes]]
) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    def register(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        assert name not in TARGETS, f"two fuzz targets named {name}"
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name
        TARGETS[name] = Target(name, fn, seeds, max_len, doc)
        return fn

    return register


def load() -> dict[str, Target]:
    for module in TARGET_MODULES:
        importlib.import_module(module)
    return TARGETS


_SCRATCH_ROOT: Path | None = None


def _scratch_root() -> Path:
    """One directory per process, in memory when /dev/shm exists (a fuzz run writes
    millions of small files); removed at exit by whoever made it (``scratch_session``)."""
    global _SCRATCH_ROOT  # noqa: PLW0603  # one per process, made lazily
    if _SCRATCH_ROOT is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _SCRATCH_ROOT = Path(tempfile.mkdtemp(prefix="ledgermq-fuzz-", dir=base))
    return _SCRATCH_ROOT


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A fresh empty directory for one input, removed afterwards whatever happens."""
    path = Path(tempfile.mkdtemp(dir=_scratch_root()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_scratch_root() -> None:
    global _SCRATCH_ROOT  # noqa: PLW0603
    if _SCRATCH_ROOT is not None:
        shutil.rmtree(_SCRATCH_ROOT, ignore_errors=True)
        _SCRATCH_ROOT = None
