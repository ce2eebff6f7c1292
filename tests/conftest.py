"""Shared fixtures: tiny segments so that roll-over happens constantly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from dledger.store import FileStore, StoreSettings

# A slow, noisy CI machine must not turn hypothesis' per-example deadline into flakes.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

# Background retention is off (an hour's interval) so tests that call clean() decide
# exactly when it runs; test_background_retention_runs_on_its_own turns it on.
TINY = StoreSettings(
    data_file_size=4096, index_file_size=32 * 16, flush_interval_ms=5, clean_interval_ms=3_600_000
)


@pytest.fixture
def tiny_settings() -> StoreSettings:
    return TINY


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    s = FileStore(tmp_path / "n0", TINY)
    yield s
    s.close()
