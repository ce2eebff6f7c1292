"""docs/architecture.md / STYLE: ``dledger/core`` is deterministic and free of I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "dledger" / "core"
BANNED = {
    "asyncio",
    "socket",
    "time",
    "random",
    "os",
    "mmap",
    "threading",
    "selectors",
    "subprocess",
    "datetime",
    "uuid",
    "secrets",
}
OUTSIDE_CORE_ALLOWED = {"codes", "store.entry"}  # pure codecs and enums


def _runtime_imports(path: Path) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, relative modules outside core) imported at run time;
    imports under ``if TYPE_CHECKING:`` are for annotations only and do not count."""
    tree = ast.parse(path.read_text(), str(path))
    guarded = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    absolute: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            absolute |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                absolute.add(node.module.split(".")[0])
            elif node.level >= 2 and node.module:
                outside.add(node.module)
    return absolute, outside


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_no_io_clock_or_randomness(path: Path) -> None:
    absolute, outside = _runtime_imports(path)
    assert not absolute & BANNED, f"{path.name} imports {sorted(absolute & BANNED)}"
    assert outside <= OUTSIDE_CORE_ALLOWED, f"{path.name} imports {sorted(outside)}"


def test_the_import_check_bites() -> None:
    absolute, _ = _runtime_imports(Path(__file__))
    assert "ast" in absolute
