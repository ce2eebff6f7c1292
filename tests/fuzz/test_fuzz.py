"""The fuzz targets in CI (issue 17, "Fuzzing"): every target's seeds and every input that
once crashed it (``regressions/``) run through it in this process, then each target runs
under atheris for a short, fixed number of inputs (``SHORT_RUNS``: about a second each,
~30 s in all) from its seeds, with the runner's per-input timeout and memory limits. The
long runs (a million inputs and more per target) are documented in the README."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import registry
from .__main__ import regression_inputs

ROOT = Path(__file__).resolve().parents[2]
TARGETS = sorted(registry.load())
DEFAULT_RUNS = 20_000
# Targets that write files or go through the app run fewer inputs in the same time.
SHORT_RUNS = {
    "currterm_file": 5_000,
    "checkpoint_file": 5_000,
    "dispatch_checkpoint": 5_000,
    "store_recovery": 2_000,
    "consume_queue_files": 3_000,
    "key_index_files": 3_000,
    "http_bodies": 5_000,
}


@pytest.fixture(scope="module", autouse=True)
def _no_scratch_left() -> Iterator[None]:
    """The fuzz processes cannot remove their scratch directories (see the registry)."""
    yield
    registry.remove_stale_scratch()
    registry.remove_scratch_root()


def test_every_decoder_the_issue_names_has_a_target() -> None:
    assert set(TARGETS) == {
        "wire_frame",
        "peer_handshake",
        "entry_codec",
        "follower_entries",
        "currterm_file",
        "checkpoint_file",
        "store_recovery",
        "message_codec",
        "record_produce",
        "metadata_snapshot",
        "metadata_op",
        "dispatch_checkpoint",
        "consume_queue_files",
        "key_index_files",
        "api_models",
        "http_bodies",
        "json_shape",
        "record_page",
        "record_answers",
    }


@pytest.mark.parametrize("name", TARGETS)
def test_seeds_and_past_crashes_yield_values_or_typed_errors(name: str) -> None:
    t = registry.TARGETS[name]
    inputs = [*t.seeds(), *(p.read_bytes() for p in regression_inputs(name))]
    assert inputs
    for data in inputs:
        assert len(data) <= t.max_len, "a seed the fuzzer would cut short"
        t.run(data)


@pytest.mark.parametrize("name", TARGETS)
def test_a_short_atheris_run_finds_nothing(name: str, tmp_path: Path) -> None:
    runs = SHORT_RUNS.get(name, DEFAULT_RUNS)
    cmd = [sys.executable, "-m", "tests.fuzz", "--workdir", str(tmp_path), name]
    proc = subprocess.run(
        [*cmd, f"-runs={runs}", "-seed=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} -runs={runs} -seed=1 found:\n{out[-6000:]}"
    assert f"stat::number_of_executed_units: {runs}" in out, out[-2000:]
