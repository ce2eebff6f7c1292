"""The suite's tiers: every test carries exactly one tier marker, which says what it needs
to run (docs/development.md has the table and the commands).

A test's tier is, in this order (``tests/conftest.py`` applies it at collection):

1. the tier marker it carries itself: a module's ``pytestmark``, a class's or a
   function's decorator (``tests/spark``'s modules and the README tour say ``spark``);
2. ``process`` when it uses a fixture that starts node processes
   (``PROCESS_FIXTURES``);
3. the tier of its path's longest entry in ``BY_PATH``.

A test with no tier by these rules, or with two, fails the collection: a new test
directory gets a line in ``BY_PATH``.

While a test runs, every child process it starts is looked at: one that runs LedgerMQ
(``is_node_command``: the ``ledgermq`` command, ``python -m ledgermq``, ``python -m
dledger``: what ``node_process``, ``LocalBrokerCluster`` and ``LocalCluster`` start)
fails a test whose tier may not start nodes (``NODE_TIERS``), and so does a fixture that
started one earlier in the run when another test of such a tier uses it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from pathlib import PurePosixPath

# The tiers, cheapest first: what each needs (pyproject.toml registers the same names).
TIERS: dict[str, str] = {
    "unit": "this process: no LedgerMQ process, no JVM, no root",
    "docs": "the documentation against the code (tests/docs)",
    "simulation": "the deterministic simulator's seeds (tests/sim), in this process",
    "fuzz": "the atheris fuzz targets' seeds and short runs (tests/fuzz)",
    "process": "LedgerMQ node processes on 127.0.0.1",
    "spark": "a JVM (PySpark 4, Java 17) and a 3-node cluster of processes",
    "deploy": "root and network namespaces: the compose file and the Dockerfile",
    "chaos": "root, network namespaces and tmpfs mounts: nodes under a nemesis",
}

# `make test-fast`: no node process, no JVM, no root.
FAST = ("unit", "docs")

# The tiers whose tests may start LedgerMQ node processes.
NODE_TIERS = frozenset({"process", "spark", "deploy", "chaos"})

# A test's tier when it carries none: the longest entry that is its path or a folder of it.
BY_PATH: dict[str, str] = {
    "tests/api": "unit",
    "tests/bench": "unit",
    "tests/broker": "unit",
    # The checker, the nemesis, the stall watcher and the supervisor, on fakes.
    "tests/chaos": "unit",
    "tests/chaos/test_chaos.py": "chaos",
    "tests/consumequeue": "unit",
    "tests/core": "unit",
    "tests/deploy": "deploy",
    "tests/docs": "docs",
    "tests/fuzz": "fuzz",
    "tests/process": "process",
    "tests/rocketmq": "unit",
    # The official RocketMQ 5 clients against a cluster of node processes.
    "tests/rocketmq/test_official_auth.py": "process",
    "tests/rocketmq/test_official_client.py": "process",
    "tests/rocketmq/test_official_tls.py": "process",
    "tests/rocketmq/test_official_transactions.py": "process",
    "tests/runtime": "unit",
    "tests/sim": "simulation",
    "tests/spark": "spark",
    "tests/store": "unit",
    "tests/test_import_cycles.py": "unit",
    "tests/test_layers.py": "unit",
    # The network namespaces that tests/chaos (and tests/deploy) run on: root.
    "tests/test_netns.py": "chaos",
    "tests/test_tiers.py": "unit",
}

# Fixtures that start node processes, as (module, name): the tests that use them are
# ``process`` tests wherever they live, and a marker of a tier without nodes is refused.
PROCESS_FIXTURES: frozenset[tuple[str, str]] = frozenset(
    {("tests.process.test_schemathesis", "node_url")}
)

# What a test may start only in a tier of NODE_TIERS: the command, and `python -m` of these.
NODE_COMMAND = "ledgermq"
NODE_MODULES = frozenset({"ledgermq", "dledger"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh"})


class TierError(Exception):
    """A test whose tier cannot be told, or that has two."""


def path_tier(path: str) -> str | None:
    """The tier of ``path`` (relative to the repository, with /) by ``BY_PATH``."""
    best: str | None = None
    for prefix in BY_PATH:
        if (path == prefix or path.startswith(prefix + "/")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return None if best is None else BY_PATH[best]


def tier_of(path: str, own: Collection[str], fixtures: Iterable[tuple[str, str]]) -> str:
    """The one tier of a test at ``path`` that carries the tier markers ``own`` and uses
    the fixtures ``fixtures`` ((module, name) of each); ``TierError`` says why not."""
    if len(own) > 1:
        raise TierError(f"has {len(own)} tier markers ({', '.join(sorted(own))}): keep one")
    uses = sorted(f"{m}::{n}" for m, n in set(fixtures) & PROCESS_FIXTURES)
    if own:
        (tier,) = own
        if uses and tier not in NODE_TIERS:
            raise TierError(f"is marked {tier} but uses {', '.join(uses)}, which starts nodes")
        return tier
    if uses:
        return "process"
    tier = path_tier(path)
    if tier is None:
        raise TierError(
            "has no tier marker: give it one (pytestmark = pytest.mark.<tier>) or map its "
            "folder in tests/tiers.py BY_PATH; tiers: " + ", ".join(TIERS)
        )
    return tier


def is_node_command(argv: Sequence[str]) -> bool:
    """Does this command line start LedgerMQ (a node, a local cluster, the demo, a
    client command)? The ``ledgermq`` command anywhere in it (also behind ``ip netns
    exec`` or in a shell's ``-c`` script), or ``-m`` of a module of ``NODE_MODULES``."""
    words = list(argv)
    if words and PurePosixPath(words[0]).name in SHELLS and "-c" in words[:-1]:
        words += words[words.index("-c") + 1].split()
    for i, word in enumerate(words):
        if PurePosixPath(word).name == NODE_COMMAND:
            return True
        if word == "-m" and words[i + 1 : i + 2] and words[i + 1].split(".")[0] in NODE_MODULES:
            return True
    return False
