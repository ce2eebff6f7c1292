"""The tiers' rules (``tests/tiers.py``) and their checks in ``tests/conftest.py``: a test
gets exactly one tier or the collection fails; a command line that starts LedgerMQ is
told from one that does not; a test of a tier that may not start nodes fails when it
starts one (the audit hook sees the real ``subprocess.Popen``); the markers registered
in pyproject.toml and the table of docs/development.md are the tiers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest, tiers
from tests.tiers import TierError, is_node_command, tier_of

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def test_a_test_takes_its_own_marker_else_its_fixtures_else_its_path() -> None:
    assert tier_of("tests/api/test_x.py", {"spark"}, []) == "spark"
    assert tier_of("tests/api/test_x.py", set(), []) == "unit"
    assert (
        tier_of("tests/api/test_x.py", set(), [("tests.process.test_schemathesis", "node_url")])
        == "process"
    )
    # The `node` fixture of tests/api/conftest.py runs in this process: only where is told.
    assert tier_of("tests/api/test_x.py", set(), [("tests.api.conftest", "node")]) == "unit"
    assert tier_of("tests/process/test_x.py", set(), []) == "process"


def test_the_longest_path_entry_wins_and_only_at_a_folder_boundary() -> None:
    assert tiers.path_tier("tests/chaos/test_chaos.py") == "chaos"
    assert tiers.path_tier("tests/chaos/test_checker.py") == "unit"
    assert tiers.path_tier("tests/sim/test_simulation.py") == "simulation"
    assert tiers.path_tier("tests/apiary/test_x.py") is None
    assert tiers.path_tier("tests/test_new.py") is None


def test_no_tier_two_tiers_or_a_node_fixture_in_a_tier_without_nodes_are_refused() -> None:
    with pytest.raises(TierError, match="no tier marker"):
        tier_of("tests/newfolder/test_x.py", set(), [])
    with pytest.raises(TierError, match="2 tier markers"):
        tier_of("tests/api/test_x.py", {"unit", "process"}, [])
    with pytest.raises(TierError, match="starts nodes"):
        tier_of("tests/api/test_x.py", {"unit"}, [("tests.process.test_schemathesis", "node_url")])
    assert tier_of(
        "tests/api/test_x.py", {"spark"}, [("tests.process.test_schemathesis", "node_url")]
    )


def test_every_collected_test_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    own = [m.name for m in request.node.iter_markers() if m.name in tiers.TIERS]
    assert own == ["unit"]
    assert request.node.stash[conftest.TIER] == "unit"


@pytest.mark.parametrize(
    "argv",
    [
        ["/repo/.venv/bin/ledgermq", "broker", "--http", "127.0.0.1:8080"],
        [PY, "-m", "ledgermq", "--node-id", "n0"],
        [PY, "-m", "dledger", "--id", "n0"],
        [PY, "-m", "ledgermq.node"],
        ["ip", "netns", "exec", "lab-a", "/repo/.venv/bin/ledgermq", "broker"],
        ["bash", "-e", "-o", "pipefail", "-c", "make setup\nledgermq cluster up &\n"],
        ["/bin/sh", "-c", "exec ledgermq demo --duration 5"],
    ],
)
def test_a_command_that_starts_ledgermq_is_seen(argv: list[str]) -> None:
    assert is_node_command(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [PY, "-c", "import ledgermq.spark.offsets"],
        [PY, "-m", "tests.fuzz", "--workdir", "/tmp/x", "wire_frame"],
        [PY, "-m", "ledgermq_other"],
        ["git", "ls-files"],
        ["/usr/bin/java", "-cp", "ledgermq.jar"],
        ["hadolint", "/tmp/ledgermq/Dockerfile"],
        [PY, "-m"],
        [],
    ],
)
def test_a_command_that_does_not_is_not(argv: list[str]) -> None:
    assert not is_node_command(argv)


def test_the_audit_hook_sees_a_real_popen_of_ledgermq() -> None:
    """Python's own ``-m`` here is only an argument of ``-c pass``: the child starts no
    node, but its command line has the shape of one, so the hook must record it."""
    n = len(conftest._node_starts)
    subprocess.run([PY, "-c", "pass", "-m", "ledgermq"], check=True, timeout=60)
    subprocess.run([PY, "-c", "pass"], check=True, timeout=60)
    seen = conftest._node_starts[n:]
    del conftest._node_starts[n:]  # what this test started is no node: it stays unit
    assert seen == [f"{PY} -c pass -m ledgermq"]


def test_a_unit_test_that_starts_a_node_fails(request: pytest.FixtureRequest) -> None:
    with pytest.raises(pytest.fail.Exception, match="unit test but its call started"):
        conftest._check_nodes(request.node, "call", ["ledgermq broker"])
    conftest._check_nodes(request.node, "call", [])  # and one that starts none passes


def test_a_unit_test_using_a_fixture_that_started_a_node_fails(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    key = next(k for k in conftest._fixture_keys(request.node) if k[1] == "tmp_path")
    conftest._node_fixtures.add(key)  # as if tmp_path had started a node earlier in the run
    try:
        with pytest.raises(pytest.fail.Exception, match="which started a LedgerMQ process"):
            conftest._check_nodes(request.node, "setup", [])
    finally:
        conftest._node_fixtures.discard(key)


def test_the_registered_markers_are_the_tiers_and_slow(pytestconfig: pytest.Config) -> None:
    names = [line.split(":", 1)[0] for line in pytestconfig.getini("markers")]
    assert set(names) >= {*tiers.TIERS, "slow"}
    ours = [n for n in names if n in tiers.TIERS or n == "slow"]
    assert ours == [*tiers.TIERS, "slow"]


def test_the_development_guide_has_a_row_and_a_command_per_tier() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| `(\w+)` \|", text, re.M)
    assert rows == list(tiers.TIERS)
    fast = " or ".join(tiers.FAST)
    assert f'-m "{fast}"' in (ROOT / "Makefile").read_text()
