"""No import circle inside a package: a module that imports a module importing it back
(even for annotations only, under ``TYPE_CHECKING``) hides which of the two is the
collaborator. The Raft core's elector and dispatchers reach the node through the narrow
hosts of ``dledger.core.host`` instead of importing ``node``; this keeps it that way.

Packages with a known circle that someone is taking apart are listed in ``NOT_YET`` with
why; remove a package from it once its circle is gone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dledger", "consumequeue", "broker", "api", "ledgermq", "tools")
NOT_YET: set[str] = set()  # none now


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, annotations-only imports included.
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def import_graph(package: str) -> dict[str, set[str]]:
    paths = sorted((ROOT / package).rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imported_modules(p, known) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as [a, b, ..., a], or None. Iterative depth-first
    search, each module entered once: bounded by the graph's size."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                left = path.pop()
                on_path.discard(left)
                done.add(left)
                continue
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in NOT_YET])
def test_package_has_no_import_circle(package: str) -> None:
    cycle = find_cycle(import_graph(package))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_core_collaborators_do_not_import_the_node() -> None:
    graph = import_graph("dledger")
    for module in ("elector", "dispatcher", "handler", "quorum", "host"):
        assert "dledger.core.node" not in graph[f"dledger.core.{module}"], module


def test_the_circle_check_bites() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    # the circle the core had before its hosts: node imports elector, elector node
    graph = import_graph("dledger")
    graph["dledger.core.elector"].add("dledger.core.node")
    assert find_cycle(graph) is not None


def test_every_module_imports_first() -> None:
    """Each module imports in a process where nothing of ours is loaded yet: a package
    whose ``__init__`` imports a module that imports back through it (``broker.recovery``
    → ``broker.dispatch`` → ``broker.dispatch.service`` → ``broker.recovery``) fails only
    when the circle is entered at the wrong module, which the AST check above misses."""
    ours = ("dledger", "consumequeue", "broker", "api")
    modules = sorted(_module_name(p) for package in ours for p in (ROOT / package).rglob("*.py"))
    script = (
        "import importlib, sys\n"
        f"ours = {ours!r}\n"
        "failed = []\n"
        "for m in sys.argv[1:]:\n"
        "    for loaded in [k for k in sys.modules if k.split('.')[0] in ours]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        failed.append(f'{m}: {e!r}')\n"
        "print('\\n'.join(failed))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert not out.stdout.strip(), out.stdout
