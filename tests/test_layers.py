"""The import rules of docs/architecture.md, checked on every file (relative imports
resolved), with no file excepted:

- ``dledger`` imports nothing of ours; ``consumequeue`` only ``dledger``; ``broker``
  only those two;
- ``api`` (the network fronts) imports the layers below it and ``ledgermq.client``
  (the client's wire contract: the Arrow schema), nothing else of ``ledgermq``;
- ``ledgermq.client`` imports nothing of ours; ``ledgermq.spark`` only the client;
- the rest of ``ledgermq`` (the CLI, the node process, local clusters, the demo) sits
  on top and may import anything; ``tools`` (generators run by hand) too;
- dispatch's appliers read no clock and no randomness (``broker/dispatch`` but its loop).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"dledger", "broker", "consumequeue", "api", "ledgermq", "tools"}
BELOW_API = {"dledger", "consumequeue", "broker"}
# Each unit (a package, or a subpackage with rules of its own) and the modules it may
# import: a name is allowed when it is one of these or lies under one.
ALLOWED = {
    "dledger": {"dledger"},
    "consumequeue": {"consumequeue", "dledger"},
    "broker": {"broker", "consumequeue", "dledger"},
    "api": {"api", "ledgermq.client", *BELOW_API},
    "ledgermq.client": {"ledgermq.client"},
    "ledgermq.spark": {"ledgermq.spark", "ledgermq.client"},
    "ledgermq": OURS,
    "tools": OURS,
}


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> set[str]:
    """The dotted names of ours that ``path`` imports (relative ones made absolute)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module(path) if path.name == "__init__.py" else _module(path)[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = [*base, *(node.module or "").split(".")] if node.module else base
            names.add(".".join(mod))
            if node.module is None:  # ``from . import x``: x may be a module
                names |= {".".join([*mod, a.name]) for a in node.names}
    return {n for n in names if n.split(".")[0] in OURS}


def _unit(path: Path) -> str:
    dotted = ".".join(_module(path))
    return max((u for u in ALLOWED if dotted == u or dotted.startswith(u + ".")), key=len)


def _allowed(name: str, unit: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ALLOWED[unit])


def _sources() -> list[Path]:
    return [p for top in sorted(OURS) for p in sorted((ROOT / top).rglob("*.py"))]


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_each_unit_imports_only_what_its_rule_allows(unit: str) -> None:
    files = [p for p in _sources() if _unit(p) == unit]
    assert files, f"no file of {unit}"
    bad = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in files
        for name in sorted(_imports(p))
        if not _allowed(name, unit)
    ]
    assert not bad, bad


def test_the_rules_see_relative_imports() -> None:
    """``from ..node import`` in ledgermq/cli/main.py is ledgermq.node: a relative import cannot
    slip past a rule."""
    assert "ledgermq.node" in _imports(ROOT / "ledgermq" / "cli" / "main.py")
    assert "ledgermq.client" in _imports(ROOT / "ledgermq" / "cli" / "client.py")
    assert _unit(ROOT / "ledgermq" / "spark" / "pull.py") == "ledgermq.spark"


# Issue 26: the broker role follows Raft's role changes and nothing else. A role set from
# anywhere else (a refused append, say) is not undone by any role change: a transfer that
# failed left a Raft leader whose broker stayed SLAVE for good.
ROLE_SETTERS = {ROOT / "broker" / "role.py"}


def test_only_the_role_change_handler_sets_the_broker_role() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _sources()
        if path not in ROLE_SETTERS
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "set_role"
    ]
    assert not found, f"the broker role is set outside the RoleChangeHandler: {found}"


# Dispatch's appliers are deterministic (docs/architecture.md, "Adding an applier"): time
# comes from the entries, which the master stamps, never from the node's clock, and
# nothing is random, or replicas would differ. Only the loop (``service.py``: its
# checkpoint and snapshot intervals, its log throttles) reads a clock.
DISPATCH = ROOT / "broker" / "dispatch"
CLOCKS_AND_CHANCE = {"time", "datetime", "random", "secrets", "uuid"}


def _top_level_imports(path: Path) -> set[str]:
    """The first part of every absolute module name ``path`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_dispatch_appliers_read_no_clock_or_randomness() -> None:
    # The replicated state's rules too: the POP state and its applier (time from the
    # entries); the POP service is the master's and stamps its entries with the clock.
    pop = [ROOT / "broker" / "pop" / "state.py", ROOT / "broker" / "pop" / "applier.py"]
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in [*sorted(DISPATCH.glob("*.py")), *pop]
        if path.name != "service.py"
        for name in sorted(_top_level_imports(path) & CLOCKS_AND_CHANCE)
    ]
    assert not found, found
    # the rule sees what it bans: the loop does read the clock
    assert "time" in _top_level_imports(DISPATCH / "service.py")
