"""docs/console.md shows every page of the console in a small PNG that
``python -m tools.screenshots`` writes (issue 34): each image it links is there, is a PNG
under the size cap, is one the tool makes, and no image lies unused."""

from __future__ import annotations

import re
from pathlib import Path

from tools.screenshots import MAX_PNG_BYTES, OUT

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "console.md"
SHOTS = ("cluster", "topics", "messages", "groups", "groups-pop", "rates", "cluster-failover")


def test_every_screenshot_is_linked_small_and_made_by_the_tool() -> None:
    linked = re.findall(r"!\[[^\]]*\]\((console/[^)]+\.png)\)", PAGE.read_text())
    assert sorted(linked) == sorted(f"console/{s}.png" for s in SHOTS)
    for rel in linked:
        data = (ROOT / "docs" / rel).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), rel
        assert len(data) < MAX_PNG_BYTES, (rel, len(data))
    assert sorted(p.name for p in OUT.iterdir()) == sorted(f"{s}.png" for s in SHOTS)
    tool = (ROOT / "tools" / "screenshots.py").read_text()
    for shot in SHOTS:
        assert f'"{shot}"' in tool, shot
