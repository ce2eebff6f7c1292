"""A node that holds committed entries its leader contradicts says so (issue 33): the
Raft core's divergence mark (``DLedgerCore.diverged``, tested in ``tests/core``) reaches
``/v1/cluster``, ``/readyz`` (503) and ``ledgermq_raft_diverged``. Node identity keeps
the reproduction that led there from happening (``tests/process/test_divergence.py``),
so the mark is set here as the core sets it."""

from __future__ import annotations

import asyncio

import pytest

from tests.api.conftest import Node

pytestmark = pytest.mark.asyncio


async def test_a_divergence_fails_readiness_and_shows_in_status_and_metrics(node: Node) -> None:
    assert (await node.http.get("/readyz")).status_code == 200
    assert "ledgermq_raft_diverged 0.0" in (await node.http.get("/metrics")).text
    core = node.broker.server.core
    assert core is not None
    core.diverged("the leader truncates committed entries", 41, 7)
    info = (await node.http.get("/v1/cluster")).json()
    assert "committed" in str(info["diverged"])
    r = await node.http.get("/readyz")
    assert r.status_code == 503 and r.json()["reason"].startswith("diverged:"), r.text
    for _ in range(200):  # the scrape is cached briefly (issue 32): bounded wait
        if "ledgermq_raft_diverged 1.0" in (await node.http.get("/metrics")).text:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("ledgermq_raft_diverged never became 1")
