"""Small file systems of a test's own: a size-limited tmpfs mounted on a test directory,
so a full disk is a real ``ENOSPC`` from the kernel, and a ballast file that takes the
space away and gives it back.

Mounting needs root (CI runs as root); elsewhere the tests that need it are skipped with
that reason. Every mount is undone when the context ends, even after a failure
(``umount -l`` if a process still holds a file there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1 << 20


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def small_fs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``path`` (created) for the context."""
    if not can_mount():
        pytest.skip("needs root to mount a small file system of its own (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


class Ballast:
    """A file that fills a file system to a given free space, and leaves on request."""

    def __init__(self, fs: Path, name: str = "ballast") -> None:
        self.path = fs / name

    def leave_free(self, free: int) -> int:
        """Grow (or shrink) the ballast so that about ``free`` bytes stay free; returns
        the free bytes after. Allocated for real (posix_fallocate), not sparse."""
        have = self.path.stat().st_size if self.path.exists() else 0
        target = max(0, have + free_bytes(self.path.parent) - free)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 0)
            if target:
                os.posix_fallocate(fd, 0, target)
        finally:
            os.close(fd)
        return free_bytes(self.path.parent)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
