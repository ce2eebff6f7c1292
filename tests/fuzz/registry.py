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
_SCRATCH_PREFIX = "ledgermq-fuzz-"


def _scratch_base() -> Path:
    """In memory when /dev/shm exists: a fuzz run writes millions of small files."""
    return Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())


def _scratch_root() -> Path:
    """One directory per process, named by its pid (``remove_stale_scratch``)."""
    global _SCRATCH_ROOT  # noqa: PLW0603  # one per process, made lazily
    if _SCRATCH_ROOT is None:
        prefix = f"{_SCRATCH_PREFIX}{os.getpid()}-"
        _SCRATCH_ROOT = Path(tempfile.mkdtemp(prefix=prefix, dir=_scratch_base()))
    return _SCRATCH_ROOT


def remove_stale_scratch() -> None:
    """Remove the scratch directories of fuzzing processes that are gone: libFuzzer ends
    a process with C's ``exit``, which runs no Python ``atexit`` handler, so a fuzz run
    cannot remove its own (the inputs' directories inside are removed as it goes)."""
    for d in _scratch_base().glob(f"{_SCRATCH_PREFIX}*-*"):
        pid = d.name.removeprefix(_SCRATCH_PREFIX).split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


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
