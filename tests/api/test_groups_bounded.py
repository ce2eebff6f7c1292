"""Consumer groups stay bounded and honest (issue 32): offsets are JSON integers within
the queue, queue ids ASCII digits, a group pull names each queue once, groups go with
their last topic and are capped; every refusal changes nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.api.conftest import TEST_LIMITS, Node, node_settings, running_node

pytestmark = pytest.mark.asyncio


async def _setup(node: Node, messages: int = 3) -> None:
    r = await node.http.post("/v1/topics", json={"name": "t", "queues": 2})
    assert r.status_code == 201, r.text
    r = await node.http.post(
        "/v1/topics/t/messages",
        json={"messages": [{"body": f"m{i}", "queue_id": 0} for i in range(messages)]},
    )
    assert r.status_code == 200, r.text


async def _commit(node: Node, offsets: Any, group: str = "g") -> tuple[int, dict[str, Any]]:
    r = await node.http.put(f"/v1/groups/{group}/offsets", json={"topic": "t", "offsets": offsets})
    return r.status_code, orjson.loads(r.content)


@pytest.mark.parametrize(
    "offsets",
    [
        {"²": 1},
        {"⁰": 1},
        {"①": 1},
        {"\u0661": 1},  # Arabic-Indic one: not read as queue 1
        {"0": True},
        {"0": 1e3},
        {"0": "1"},
        {"0": 4},  # past the queue's max offset (3)
        {"0": 2**62},
        {"99999": 1},
        {"1" * 5000: 1},
    ],
)
async def test_malformed_offsets_are_refused_and_change_nothing(
    node: Node, offsets: dict[str, Any]
) -> None:
    await _setup(node)
    before = node.log_state()
    status, body = await _commit(node, offsets)
    assert status == 422, body
    assert body["error"]["code"] == "INVALID_ARGUMENT"
    assert node.log_state() == before
    assert "g" not in node.broker.meta.offsets


async def test_an_offset_at_the_max_is_taken_and_lag_never_goes_negative(node: Node) -> None:
    await _setup(node)
    assert (await _commit(node, {"0": 3, "1": 0}))[0] == 200
    r = await node.http.get("/v1/groups/g/offsets", params={"topic": "t"})
    lags = [q["lag"] for q in orjson.loads(r.content)["offsets"]]
    assert lags == [0, 0]


@pytest.mark.parametrize("sequence", ["²", "\u0661", "1" * 5000, str(2**62 + 1)])
async def test_a_malformed_ndjson_sequence_is_refused(node: Node, sequence: str) -> None:
    await _setup(node)
    r = await node.http.post(
        "/v1/topics/t/messages",
        params={"producer_id": "p-1", "sequence": sequence},
        content=b'{"body": "a"}\n',
        headers={"content-type": "application/x-ndjson"},
    )
    assert r.status_code == 422, r.text


async def test_a_group_pull_names_each_queue_once(node: Node) -> None:
    await _setup(node)
    r = await node.http.post(
        "/v1/groups/g/pull", json={"topic": "t", "queue_ids": [0, 0, 0, 1, 0], "max_messages": 10}
    )
    assert r.status_code == 200, r.text
    assert [m["body"] for m in orjson.loads(r.content)["messages"]] == ["m0", "m1", "m2"]


async def test_a_group_goes_with_its_last_topic(node: Node) -> None:
    await _setup(node)
    await node.http.post("/v1/topics", json={"name": "u", "queues": 1})
    assert (await _commit(node, {"0": 1}))[0] == 200
    r = await node.http.put("/v1/groups/g/offsets", json={"topic": "u", "offsets": {"0": 0}})
    assert r.status_code == 200, r.text
    await node.http.delete("/v1/topics/t")
    assert list(node.broker.meta.offsets["g"]) == ["u"]
    await node.http.delete("/v1/topics/u")
    assert "g" not in node.broker.meta.offsets
    r = await node.http.get("/v1/groups")
    assert "g" not in orjson.loads(r.content)["groups"]


async def test_groups_are_capped(tmp_path: Path) -> None:
    limits = replace(TEST_LIMITS, max_groups=2)
    async with running_node(node_settings(tmp_path / "n0", limits=limits)) as node:
        await _setup(node)
        for g in ("a", "b"):
            assert (await _commit(node, {"0": 1}, g))[0] == 200
        status, body = await _commit(node, {"0": 1}, "c")
        assert status == 429 and body["error"]["code"] == "LIMIT_REACHED", body
        assert (await _commit(node, {"0": 2}, "a"))[0] == 200, "a known group goes on"
