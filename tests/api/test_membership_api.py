"""The membership routes of one node's group (issue 33, ``broker.membership``):
the configuration as it is, a learner added and removed through the log, what a
promotion of a learner that never answers says, and every refusal a clear error that
changes nothing."""

from __future__ import annotations

import pytest

from ledgermq.processes import free_ports
from tests.api.conftest import Node
from tests.api.test_app import error_of

pytestmark = pytest.mark.asyncio


async def _members(node: Node) -> dict[str, dict[str, object]]:
    r = await node.http.get("/v1/cluster/members")
    assert r.status_code == 200, r.text
    return {m["node_id"]: m for m in r.json()["members"]}


async def test_a_learner_is_added_and_removed_through_the_log(node: Node) -> None:
    members = await _members(node)
    assert list(members) == ["n0"] and members["n0"]["role"] == "voter"
    (port,) = free_ports(1)
    body = {"node_id": "n1", "raft_addr": f"127.0.0.1:{port}", "http_url": "http://127.0.0.1:1"}
    r = await node.http.post("/v1/cluster/members", json=body)
    assert r.status_code == 200, r.text
    added = r.json()["config_index"]
    assert added >= 0
    members = await _members(node)
    assert members["n1"]["role"] == "learner" and members["n1"]["raft_addr"] == body["raft_addr"]
    assert members["n1"]["http_url"] == "http://127.0.0.1:1"
    info = (await node.http.get("/v1/cluster")).json()
    assert {n["node_id"] for n in info["nodes"]} == {"n0", "n1"}
    # Nothing runs at n1: it never acknowledges, so it is never promoted.
    r = await node.http.post("/v1/cluster/members/n1/promote", params={"timeout_s": 0.5})
    assert r.status_code == 429, r.text
    assert error_of(r)["code"] == "BUSY" and error_of(r)["reason"] == "FALL_BEHIND_TOO_MUCH"
    assert (await _members(node))["n1"]["role"] == "learner"
    # A dead learner is removed all the same.
    r = await node.http.delete("/v1/cluster/members/n1")
    assert r.status_code == 200, r.text
    assert r.json()["config_index"] > added
    assert list(await _members(node)) == ["n0"]


async def test_refused_changes_say_why_and_change_nothing(node: Node) -> None:
    before = await _members(node)
    end = node.log_state()
    (port,) = free_ports(1)
    cases = [
        ("post", "/v1/cluster/members", {"node_id": "n0", "raft_addr": f"127.0.0.1:{port}"}),
        ("post", "/v1/cluster/members/n9/promote", None),
        ("delete", "/v1/cluster/members/n9", None),
        ("delete", "/v1/cluster/members/n0", None),  # the only voter
    ]
    for method, path, body in cases:
        r = await node.http.request(method, path, json=body)
        assert r.status_code == 409, (path, r.text)
        assert error_of(r)["code"] in ("MEMBERSHIP_REFUSED", "UNKNOWN_NODE"), r.text
    for body in (
        {"node_id": "bad id", "raft_addr": "127.0.0.1:1"},
        {"node_id": "n3", "raft_addr": "no port"},
        {"node_id": "n3", "raft_addr": "127.0.0.1:1", "http_url": "ftp://x"},
        {"node_id": "n3"},
    ):
        r = await node.http.post("/v1/cluster/members", json=body)
        assert r.status_code == 422 and error_of(r)["code"] == "INVALID_ARGUMENT", r.text
    r = await node.http.post("/v1/cluster/members/n1/promote", params={"timeout_s": -1})
    assert r.status_code == 422
    assert await _members(node) == before
    assert node.log_state() == end
