"""Leadership transfers to a slave that dies, stops or has just restarted, on three
``python -m ledgermq`` processes with a producer running (issue 26): each transfer answers
what happened (200, or 409 ``TRANSFER_FAILED`` with its reason; never a 500 or no answer)
and a produce is acknowledged within a few seconds after it. The trials are
``bench/transfer_bench.py``'s, which measures the write pauses over many of them."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledgermq.local_cluster import LocalBrokerCluster

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # bench/ is scripts, not a package

import transfer_bench as tb  # noqa: E402

# A produce must be acknowledged this soon after the transfer's answer (the trial's own
# bound, ACK_BOUND_S, only keeps a broken run from hanging).
ACK_WITHIN_MS = 5000
REASONS = {"NETWORK_ERROR", "TAKE_LEADERSHIP_FAILED", "TIMEOUT", "FALL_BEHIND_TOO_MUCH"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    root = tmp_path_factory.mktemp("transfers")
    with LocalBrokerCluster(3, root, extra_args=("--log-level", "INFO")) as c:
        c.start_all()
        master = c.wait_ready(timeout_s=tb.READY_BOUND_S)
        r = httpx.post(c.urls[master] + "/v1/topics", json={"name": tb.TOPIC, "queues": 2})
        assert r.status_code in (200, 201), r.text
        yield c


@pytest.mark.slow
@pytest.mark.parametrize("kind", tb.KINDS)
def test_a_transfer_is_followed_by_an_acknowledged_produce(
    cluster: LocalBrokerCluster, kind: str
) -> None:
    rng = random.Random(f"issue-26-{kind}")
    with tb.Writer(cluster.brokers) as w:
        trials = [tb.run_trial(cluster, w, kind, rng) for _ in range(2)]
    for t in trials:
        assert t.status in (200, 409), t
        if t.status == 409:
            assert t.reason in REASONS, t
        assert t.ack_ms - t.answer_ms < ACK_WITHIN_MS, t
    if kind == "healthy":
        assert all(t.status == 200 for t in trials), trials
    if kind == "killed":  # its process is gone: it can never answer SUCCESS
        assert all(t.status == 409 or t.leader_after != t.target for t in trials), trials
    assert not w.errors, w.errors
