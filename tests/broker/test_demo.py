"""``ledgermq demo`` (the main job of ``make demo``) runs end to end, small."""

from __future__ import annotations

import pytest

from api.cli import main


def test_failover_demo_runs_and_checks_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--messages", "300", "--batch", "50", "--body-bytes", "64"]) == 0
    out = capsys.readouterr().out
    assert "new master:" in out
    assert "all 603 messages in 4 queues are contiguous and identical on 3 nodes" in out
