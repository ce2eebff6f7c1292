"""The alert rules (docs/prometheus/ledgermq-alerts.yml) do what they say, checked by
Prometheus's own ``promtool`` (issue 32): ``promtool check rules`` on the file, and
``promtool test rules`` on synthetic series (tests/docs/alert_rules_test.yml) where every
rule fires on series that should page or open a ticket, and not on series that should
not: two clusters with one master each, three replicas each exporting the same lag, a
node whose series vanish after it failed, a slave with a full disk.

promtool is Debian's (the ``prometheus`` package): ``make .tools/promtool`` (a
prerequisite of ``make test``) takes it out of the package without installing it. The
tests look for it at ``.tools/promtool``, then on ``PATH``; a missing one fails them,
saying how to get it, never skips them.

promtool compares each expected alert's annotations exactly; the test file leaves them
out and ``expanded_tests`` writes them from the rule's own (its ``{{ $labels.x }}``
filled from the expected labels), so a template naming a label the alert does not
carry fails here.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs.test_alerts import RULES, rules

ROOT = Path(__file__).resolve().parents[2]
UNIT_TESTS = Path(__file__).resolve().parent / "alert_rules_test.yml"
PROMTOOL_TIMEOUT_S = 120
_LABEL = re.compile(r"\{\{ \$labels\.(\w+) \}\}")


def promtool() -> str:
    """``.tools/promtool`` (``make .tools/promtool``), else ``promtool`` on ``PATH``."""
    local = ROOT / ".tools" / "promtool"
    if local.is_file():
        return str(local)
    found = shutil.which("promtool")
    assert found, (
        "promtool is missing: the alert rules' tests need it. Run `make .tools/promtool`"
        " (it takes usr/bin/promtool out of Debian's prometheus package with apt-get"
        " download, installing nothing), or put a promtool on PATH"
    )
    return found


def run_promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        cwd=cwd,
        check=False,
    )


def shown(p: subprocess.CompletedProcess[str]) -> str:
    return f"promtool exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


def render(template: str, labels: dict[str, str]) -> str:
    """A rule annotation as Prometheus renders it for an alert with ``labels`` (the
    rules use ``{{ $labels.x }}`` and nothing else: ``test_the_templates_are_simple``)."""
    return _LABEL.sub(lambda m: labels[m[1]], template)


def unit_tests() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    return doc


def expanded_tests(doc: dict[str, Any], rules_file: Path = RULES) -> dict[str, Any]:
    """``doc`` with ``rules_file`` as its rule file and every expected alert's
    annotations written in (promtool compares them exactly)."""
    by_name = {r["alert"]: r for r in rules()}
    out = copy.deepcopy(doc)
    out["rule_files"] = [str(rules_file)]
    for case in out["tests"]:
        for check in case.get("alert_rule_test", []):
            annotations = by_name[check["alertname"]]["annotations"]
            for alert in check.get("exp_alerts") or []:
                labels = {str(k): str(v) for k, v in alert["exp_labels"].items()}
                alert["exp_annotations"] = {k: render(v, labels) for k, v in annotations.items()}
    return out


def promtool_test(doc: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "alert_rules_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return run_promtool("test", "rules", str(path))


def test_the_templates_are_simple() -> None:
    for rule in rules():
        for text in rule["annotations"].values():
            assert "{{" not in _LABEL.sub("", text), (rule["alert"], text)


def test_promtool_checks_the_rule_file() -> None:
    p = run_promtool("check", "rules", str(RULES))
    assert p.returncode == 0, shown(p)
    assert f"SUCCESS: {len(rules())} rules found" in p.stdout, shown(p)


def test_every_rule_passes_its_unit_tests(tmp_path: Path) -> None:
    p = promtool_test(expanded_tests(unit_tests()), tmp_path)
    assert p.returncode == 0, shown(p)
    assert "SUCCESS" in p.stdout, shown(p)


def _names(series: str) -> set[str]:
    """The job, instance and group values of an input series (``name{k="v", ...}``)."""
    return set(re.findall(r'\b(?:job|instance|group)="([^"]*)"', series))


def test_every_rule_is_tested_firing_and_not_firing() -> None:
    """Each rule has a case where it fires, and one where series that should not alert
    are there and do not: an empty expectation, or a job, instance or group of the input
    that no expected alert carries."""
    fires: set[str] = set()
    holds: set[str] = set()
    for case in unit_tests()["tests"]:
        present = set().union(*(_names(s["series"]) for s in case["input_series"]))
        for check in case.get("alert_rule_test", []):
            name, expected = check["alertname"], check.get("exp_alerts") or []
            if expected:
                fires.add(name)
            alerted = {str(v) for a in expected for v in a["exp_labels"].values()}
            if not expected or present - alerted:
                holds.add(name)
    every = {r["alert"] for r in rules()}
    assert fires == every, f"never seen firing: {sorted(every - fires)}"
    assert holds == every, f"never seen holding back: {sorted(every - holds)}"


# Every aggregation keeps clusters apart: `by` a list with `job`, never without one; a
# vector match is `on` a list with `job`; `scalar` (one number for every cluster) is out.
_AGGREGATION = re.compile(
    r"\b(sum|max|min|avg|count|stddev|topk|bottomk|quantile)\s*(?:by\s*\(([^)]*)\))?\s*\("
)
_MATCHING = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")


def test_every_rule_keeps_clusters_apart() -> None:
    for rule in rules():
        expr = rule["expr"]
        assert "scalar(" not in expr and "without" not in expr, rule["alert"]
        for op, by in _AGGREGATION.findall(expr):
            assert "job" in re.split(r"\s*,\s*", by.strip()), (rule["alert"], op, by)
        for kind, labels in _MATCHING.findall(expr):
            assert kind == "on" and "job" in re.split(r"\s*,\s*", labels), (rule["alert"], kind)


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: one expected alert's labels changed, promtool says no."""
    doc = expanded_tests(unit_tests())
    check = next(
        c
        for case in doc["tests"]
        for c in case["alert_rule_test"]
        if c["alertname"] == "LedgerMQTwoMasters"
    )
    check["exp_alerts"][0]["exp_labels"]["job"] = "ledgermq-a"
    p = promtool_test(doc, tmp_path)
    assert p.returncode != 0, shown(p)
    assert "LedgerMQTwoMasters" in p.stdout + p.stderr, shown(p)


# The rules as they were before issue 32's fixes (and one half-fix): each fails the unit
# tests.
OLD_EXPRESSIONS = [
    ("LedgerMQTwoMasters", "sum(ledgermq_broker_master) > 1"),
    ("LedgerMQNodeFailed", "ledgermq_node_failed == 1"),
    # only looking back at the gauge misses a failure between two scrapes
    ("LedgerMQNodeFailed", "max_over_time(ledgermq_node_failed[10m]) == 1"),
    ("LedgerMQDiskFull", 'increase(ledgermq_http_errors_total{code="DISK_FULL"}[5m]) > 0'),
    ("LedgerMQConsumerLag", "sum by (group, topic) (ledgermq_consumer_lag) > 100000"),
    (
        "LedgerMQReplicaBehind",
        "scalar(max(ledgermq_committed_index)) - ledgermq_committed_index > 100000",
    ),
]


@pytest.mark.parametrize(("alert", "expr"), OLD_EXPRESSIONS)
def test_the_old_rule_fails_the_unit_tests(alert: str, expr: str, tmp_path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["expr"] = expr
    old = tmp_path / "old-alerts.yml"
    old.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    p = promtool_test(expanded_tests(unit_tests(), old), tmp_path)
    assert p.returncode != 0, shown(p)
    assert alert in p.stdout + p.stderr, shown(p)
