"""Shared fixtures: tiny segments so that roll-over happens constantly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.store import FileStore, StoreSettings

TINY = StoreSettings(data_file_size=4096, index_file_size=32 * 16, flush_interval_ms=5)


@pytest.fixture
def tiny_settings() -> StoreSettings:
    return TINY


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    s = FileStore(tmp_path / "n0", TINY)
    yield s
    s.close()
