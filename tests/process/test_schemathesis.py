"""schemathesis against the OpenAPI document of a real node process: no generated
request, valid or not, gets a 5xx, and every error answer has the docs/http.md body.

The cases come from schemathesis' hypothesis strategies per operation, driven here by
hypothesis directly (schemathesis' own pytest plugin does not run under pytest 9)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS

# Long polls are capped low so that generated wait_ms values keep the run short.
NODE_ARGS = (*CLUSTER_ARGS, "--max-wait-ms", "200", "--max-body-bytes", "65536")
EXAMPLES_PER_OPERATION = 30


@pytest.fixture(scope="module")
def node_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    c = LocalBrokerCluster(1, data_dir, extra_args=NODE_ARGS)
    c.start_all()
    try:
        c.wait_ready(timeout_s=60)
        yield c.urls["n0"]
        assert c.alive("n0"), "the node died under fuzzing:\n" + c.log_tail("n0")
    finally:
        c.stop_all()


def _cases() -> list[tuple[str, GenerationMode]]:
    """Every operation with valid input; those that take input with invalid input too."""
    from api.app import create_app  # noqa: PLC0415
    from broker.broker import Broker  # noqa: PLC0415
    from broker.settings import BrokerSettings  # noqa: PLC0415

    doc = create_app(BrokerSettings(), Broker(BrokerSettings())).openapi()
    out = []
    for path, ops in sorted(doc["paths"].items()):
        for method, spec in sorted(ops.items()):
            out.append((f"{method.upper()} {path}", GenerationMode.POSITIVE))
            if spec.get("parameters") or spec.get("requestBody"):
                out.append((f"{method.upper()} {path}", GenerationMode.NEGATIVE))
    return out


@pytest.mark.parametrize(("operation", "mode"), _cases())
def test_no_server_errors(node_url: str, operation: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(node_url + "/openapi.json")
    method, path = operation.split(" ", 1)
    op = schema[path][method]
    calls = 0

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,  # the same cases every run: a CI failure replays locally
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: schemathesis.Case) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=node_url, timeout=30)
        assert response.status_code < 500, (case.method, case.formatted_path, response.text)
        if response.status_code >= 400 and path != "/metrics":
            body = response.json()
            assert set(body) == {"error"}, body
            assert body["error"]["code"].isupper() and body["error"]["message"], body

    check()
    assert calls > 0
    print(f"{operation} {mode.value}: {calls} calls")
