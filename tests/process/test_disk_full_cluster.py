"""A full disk in a 3-process cluster, each node on a small file system of its own
(issue 17): on the master, writes are refused with 507 ``DISK_FULL`` and ``Retry-After``
before the derived files could run out of room, every acknowledged message is readable
on every node, and writes resume by themselves when space returns; on one follower, the
other two go on committing, the full one refuses the leader's pushes (nothing written,
nothing crashed) and catches up when space returns. Each full node says so on /metrics
(``ledgermq_disk_full`` 1, what the LedgerMQDiskFull alert reads: a slave answers no
write, so it counts no 507), and 0 again once space returns.

Before: a node acknowledged messages whose consume-queue units it could no longer write
(its dispatcher had died on ENOSPC), so no consumer could ever read them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until

from ..smallfs import Ballast, MiB, small_fs

FS_BYTES = 96 * MiB
RESERVE_MB = 24
BODY = "x" * 1000


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[tuple[LocalBrokerCluster, dict[str, Path]]]:
    root = tmp_path / "cluster"
    with contextlib.ExitStack() as stack:
        fs = {n: stack.enter_context(small_fs(root / n, FS_BYTES)) for n in ("n0", "n1", "n2")}
        c = LocalBrokerCluster(
            3,
            root,
            extra_args=["--data-file-mb", "8", "--disk-reserve-mb", str(RESERVE_MB)],
            log_dir=tmp_path,
        )
        stack.callback(c.stop_all)
        c.start_all()
        c.wait_ready(timeout_s=90)
        yield c, fs


def _drain(http: httpx.Client, url: str, queues: int) -> list[str]:
    """Every message body of topic ``t`` on the node at ``url``, queue by queue."""
    out: list[str] = []
    for q in range(queues):
        offset = 0
        for _ in range(1000):
            r = http.get(
                f"{url}/v1/topics/t/queues/{q}/messages",
                params={"offset": offset, "max_messages": 1000},
            )
            assert r.status_code == 200, r.text
            page = r.json()
            out += [m["body"] for m in page["messages"]]
            if page["next_offset"] == offset:
                break
            offset = page["next_offset"]
    return sorted(out)


def _produce(
    http: httpx.Client, c: LocalBrokerCluster, tag: str, seq: int
) -> tuple[httpx.Response, list[str]]:
    master = c.master()
    assert master is not None
    bodies = [f"{tag}-{seq}-{i}-{BODY}" for i in range(50)]
    r = http.post(
        c.urls[master] + "/v1/topics/t/messages",
        json={
            "messages": [{"body": b} for b in bodies],
            "producer_id": f"disk-{tag}",
            "sequence": seq,
        },
    )
    return r, bodies


def _status(http: httpx.Client, url: str) -> dict[str, Any]:
    r = http.get(url + "/v1/cluster")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def _disk_full(http: httpx.Client, url: str) -> float:
    """The node's ``ledgermq_disk_full`` gauge, from its /metrics."""
    r = http.get(url + "/metrics")
    assert r.status_code == 200, r.text
    found = re.findall(r"^ledgermq_disk_full (\S+)$", r.text, re.MULTILINE)
    assert len(found) == 1, r.text
    return float(found[0])


def test_a_full_disk_refuses_writes_loses_nothing_and_recovers_by_itself(
    small_cluster: tuple[LocalBrokerCluster, dict[str, Path]],
) -> None:
    c, fs = small_cluster
    http = httpx.Client(timeout=30)
    acked: list[str] = []
    try:
        master = c.wait_ready()
        assert http.post(c.urls[master] + "/v1/topics", json={"name": "t", "queues": 2}).is_success
        r, bodies = _produce(http, c, "warm", 0)  # allocates the key index and the queues
        assert r.status_code == 200, r.text
        acked += bodies

        # ---- the master's disk fills -------------------------------------------------
        ballast = Ballast(fs[master])
        ballast.leave_free((RESERVE_MB + 6) * MiB)
        refused = None
        for seq in range(1, 2000):
            r, bodies = _produce(http, c, "m", seq)
            if r.status_code != 200:
                refused = r
                break
            acked += bodies
        assert refused is not None, "the master never refused a write"
        assert refused.status_code == 507, refused.text
        assert refused.json()["error"]["code"] == "DISK_FULL"
        assert int(refused.headers["Retry-After"]) >= 1
        wait_until(lambda: _disk_full(http, c.urls[master]) == 1.0, what="the master says full")
        for node in c.ids:  # nothing acknowledged is lost, on any node; all alive
            assert c.alive(node)
            wait_until(lambda n=node: _drain(http, c.urls[n], 2) == sorted(acked), what=node)
            assert http.get(c.urls[node] + "/healthz").status_code == 200
        ballast.remove()
        r = wait_until(
            lambda: (resp := _produce(http, c, "back", 0)[0]).status_code == 200 and resp,
            timeout_s=30,
            what="writes resume once space returns",
        )
        wait_until(lambda: _disk_full(http, c.urls[master]) == 0.0, what="the master has room")
        acked += [f"back-0-{i}-{BODY}" for i in range(50)]

        # ---- one follower's disk fills ------------------------------------------------
        master = c.wait_ready()
        full = next(n for n in c.ids if n != master)
        ballast = Ballast(fs[full])
        ballast.leave_free(1 * MiB)
        end_before = _status(http, c.urls[full])["ledger_end_index"]
        for seq in range(1, 60):  # the other two are a quorum: every one commits
            r, bodies = _produce(http, c, "f", seq)
            assert r.status_code == 200, r.text
            acked += bodies
        leader_end = _status(http, c.urls[master])["committed_index"]
        assert _status(http, c.urls[full])["ledger_end_index"] < leader_end
        assert end_before <= _status(http, c.urls[full])["ledger_end_index"]
        assert c.alive(full)
        assert http.get(c.urls[full] + "/healthz").status_code == 200
        wait_until(lambda: _disk_full(http, c.urls[full]) == 1.0, what="the slave says full")
        assert _status(http, c.urls[full])["broker_role"] == "SLAVE"
        ballast.remove()
        wait_until(lambda: _disk_full(http, c.urls[full]) == 0.0, what="the slave has room")
        wait_until(
            lambda: _status(http, c.urls[full])["dispatched_index"] >= leader_end,
            timeout_s=60,
            what="the follower catches up once space returns",
        )
        for node in c.ids:
            wait_until(lambda n=node: _drain(http, c.urls[n], 2) == sorted(acked), what=node)
    finally:
        http.close()
