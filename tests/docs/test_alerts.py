"""The example Prometheus alert rules of docs/operations.md load: the file is a valid rule
file, every expression parses as PromQL (promql-parser, the Rust parser's Python
binding), every series it names is one a live node exports on /metrics, and each rule's
``metrics`` annotation links to exactly the metric families it uses, in the metrics
reference (docs/reference/metrics.md)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import pytest_asyncio
import yaml

from api.app import create_app
from broker.broker import Broker
from tests.api.conftest import node_settings
from tests.waiting import until
from tools import docgen

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus" / "ledgermq-alerts.yml"
SERIES = docgen._SERIES  # the node's series: ledgermq_*, process_* (not up)
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


@pytest_asyncio.fixture
async def exposition(tmp_path: Path) -> AsyncIterator[str]:
    settings = node_settings(tmp_path / "n0")
    broker = Broker(settings)
    await broker.start()
    try:
        await until(lambda: broker.is_master, what="the single node becomes MASTER")
        transport = httpx.ASGITransport(app=create_app(settings, broker))
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            yield (await http.get("/metrics")).text
    finally:
        await broker.stop()


def exported_series(text: str) -> set[str]:
    """Every series name the exposition can carry, from its ``# TYPE`` lines (a labelled
    family with no child yet has no sample, but has its TYPE line)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


def test_the_rule_file_is_well_formed() -> None:
    seen = set()
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"].startswith("LedgerMQ") and rule["alert"] not in seen
        seen.add(rule["alert"])
        assert rule["labels"]["severity"] in {"page", "ticket"}
        assert rule["annotations"]["summary"] and rule["annotations"]["action"]
        promql_parser.parse(rule["expr"])  # raises ValueError on a bad expression
    assert len(seen) >= 10


def test_a_bad_expression_would_be_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("rate(ledgermq_raft_term[5m]")


@pytest.mark.asyncio
async def test_every_series_of_the_rules_is_exported(exposition: str) -> None:
    exported = exported_series(exposition)
    named = {name for rule in rules() for name in SERIES.findall(rule["expr"])}
    assert named, "the rules name no LedgerMQ series"
    assert named <= exported, f"not exported: {sorted(named - exported)}"


def test_every_rule_links_to_the_metrics_it_uses() -> None:
    families = asyncio.run(docgen._node_families())
    reference = (docgen.DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    for rule in rules():
        want = [
            f"docs/reference/metrics.md#{n}" for n in docgen.families_of(rule["expr"], families)
        ]
        # Only a rule on Prometheus's own `up` alone (a node down, no target) uses none.
        assert want or re.fullmatch(r"(absent\()?up\{[^}]*\}\)?( == 0)?", rule["expr"]), rule
        assert rule["annotations"].get("metrics", "").split() == want, rule["alert"]
        for link in want:
            assert f'<a id="{link.split("#")[1]}"></a>' in reference, link


def test_the_operators_table_lists_every_rule_and_only_those() -> None:
    text = (RULES.parents[1] / "operations.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(LedgerMQ\w+)` \| .* \| (page|ticket) \|$", text, re.MULTILINE)
    assert sorted(listed) == sorted((r["alert"], r["labels"]["severity"]) for r in rules())
