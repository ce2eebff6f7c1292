"""Shared fixtures (tiny segments so that roll-over happens constantly), and the tiers:
every test gets its tier marker here, and a test outside the tiers that may start nodes
fails if it starts a LedgerMQ process (tests/tiers.py says how)."""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from dledger.store import FileStore, StoreSettings
from tests import tiers

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


# ---- tiers (tests/tiers.py, docs/development.md) ---------------------------------------------

TIER: pytest.StashKey[str] = pytest.StashKey()
_node_starts: list[str] = []  # LedgerMQ command lines started by this process, in order
_node_fixtures: set[tuple[str, str]] = set()  # fixtures seen starting one: (module, name)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Every ``subprocess.Popen`` of this process (asyncio's too), as CPython reports it."""
    if event != "subprocess.Popen":
        return
    try:  # an audit hook that raised would make the Popen itself fail
        argv = args[1]
        words = [argv] if isinstance(argv, str | bytes | os.PathLike) else list(argv)
        command = [os.fsdecode(w) for w in words]
        if tiers.is_node_command(command):
            _node_starts.append(" ".join(command)[:300])
    except Exception:  # a command line we cannot read starts no node
        pass


sys.addaudithook(_audit)


def _fixture_keys(item: pytest.Item) -> set[tuple[str, str]]:
    """(module, name) of the fixture each of ``item``'s fixture names resolves to."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = set()
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs:
            keys.add((getattr(defs[-1].func, "__module__", "?"), name))
    return keys


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    root = config.rootpath
    for item in items:
        path = (
            item.path.relative_to(root) if item.path.is_relative_to(root) else item.path
        ).as_posix()
        own = {m.name for m in item.iter_markers() if m.name in tiers.TIERS}
        try:
            tier = tiers.tier_of(path, own, _fixture_keys(item))
        except tiers.TierError as e:
            problems.append(f"{item.nodeid} {e}")
            continue
        if not own:
            item.add_marker(getattr(pytest.mark, tier))
        item.stash[TIER] = tier
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise pytest.UsageError(f"tests without one tier (tests/tiers.py):\n  {shown}{more}")


def _check_nodes(item: pytest.Item, phase: str, started: list[str]) -> None:
    tier = item.stash.get(TIER, "?")
    if tier in tiers.NODE_TIERS:
        return
    if started:
        pytest.fail(
            f"{item.nodeid} is a {tier} test but its {phase} started a LedgerMQ process: "
            f"{started[0]}\nMark it process (or move it to tests/process).",
            pytrace=False,
        )
    used = sorted(f"{m}::{n}" for m, n in _fixture_keys(item) & _node_fixtures)
    if used:
        pytest.fail(
            f"{item.nodeid} is a {tier} test but uses {', '.join(used)}, which started a "
            "LedgerMQ process in this run.\nMark it process (or move it to tests/process).",
            pytrace=False,
        )


def _watch(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    before = len(_node_starts)
    result = yield
    _check_nodes(item, phase, _node_starts[before:])
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watch(item, "teardown"))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    before = len(_node_starts)
    try:
        return (yield)
    finally:
        if len(_node_starts) > before:
            _node_fixtures.add((getattr(fixturedef.func, "__module__", "?"), fixturedef.argname))
