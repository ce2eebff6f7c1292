"""docs/architecture.md: ``api → broker → {consumequeue, dledger}``; dledger and consumequeue import
nothing of ours but (for consumequeue) dledger's file helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"dledger", "broker", "consumequeue", "api"}
ALLOWED = {
    "dledger": {"dledger"},
    "consumequeue": {"consumequeue", "dledger"},
    "broker": OURS - {"api"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & OURS


# ``python -m broker`` (docs/operations.md) starts a whole node, HTTP included: it is the program's
# entry point, the one place allowed to compose every layer.
ENTRY_POINTS = {ROOT / "broker" / "__main__.py"}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package: str) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        if path in ENTRY_POINTS:
            continue
        bad = _imports(path) - ALLOWED[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


# Issue 26: the broker role follows Raft's role changes and nothing else. A role set from
# anywhere else (a refused append, say) is not undone by any role change: a transfer that
# failed left a Raft leader whose broker stayed SLAVE for good.
ROLE_SETTERS = {ROOT / "broker" / "role.py"}


def test_only_the_role_change_handler_sets_the_broker_role() -> None:
    found = []
    for package in sorted(OURS):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "set_role"
                    and path not in ROLE_SETTERS
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"the broker role is set outside the RoleChangeHandler: {found}"
