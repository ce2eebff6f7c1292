"""Issue 33's reproduction, on 3 ``python -m ledgermq`` processes, up to what a node can
see: slave C paused while master M and slave A acknowledge messages; M and A killed, A's
data directory deleted and A restarted empty under its old id (the procedure issue 33
forbids), C resumed: A's vote elects C, whose log lacks the acknowledged messages. M,
back, holds committed entries its new leader contradicts. It refuses to drop them, as
before, and it is no longer quiet about it: an ERROR line, ``diverged`` in
``/v1/cluster``, ``/readyz`` 503 and ``ledgermq_raft_diverged 1``.

(Membership changes, issue 33's fix for the hole itself, are not in yet: the messages are
lost from the group's view here; this test pins that the loss is loud.)"""

from __future__ import annotations

import os
import shutil
import signal

import httpx

from dledger.store import node_dir
from dledger.store.meta import CheckpointFile
from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until


def test_a_node_whose_committed_entries_the_leader_lacks_says_so(
    fresh_cluster3: LocalBrokerCluster,
) -> None:
    c = fresh_cluster3
    with httpx.Client(timeout=10) as http:
        _reproduce(c, http)


def _reproduce(c: LocalBrokerCluster, http: httpx.Client) -> None:
    m = c.wait_ready()
    a, paused = (n for n in c.ids if n != m)
    r = http.post(c.urls[m] + "/v1/topics", json={"name": "dv", "queues": 1})
    assert r.status_code in (200, 201), r.text
    wait_until(lambda: all(c.ready(n) for n in c.ids), 30, "every node caught up")

    os.kill(c.procs[paused].pid, signal.SIGSTOP)
    try:
        # 64 MiB: more than the kernel's socket buffers between M and the paused C hold
        # (C, resumed, reads what they hold: M's pushes sent before it died)
        body = {"messages": [{"body": f"{i:05d}" + "x" * 10_235} for i in range(100)]}
        for _ in range(64):
            r = http.post(c.urls[m] + "/v1/topics/dv/messages", json=body)
            assert r.status_code == 200, r.text  # acknowledged by M and A
        info = c.cluster_info(m)
        assert info is not None
        committed = info["committed_index"]
        # M's checkpoint (written every 3 s) records that: what it knows after a restart
        checkpoint = CheckpointFile(node_dir(c.data_dir / m, c.group, m) / "checkpoint")

        def recorded() -> bool:
            cp = checkpoint.load()
            return cp is not None and cp.committed_index >= committed

        wait_until(recorded, 30, "M's checkpoint records the commit")
        c.kill(m)
        c.kill(a)
        shutil.rmtree(c.data_dir / a)  # A's disk is gone; A comes back empty
        c.start(a)
    finally:
        os.kill(c.procs[paused].pid, signal.SIGCONT)
    new = wait_until(
        lambda: c.master() if c.master() in (a, paused) else None, 60, "a master of A and C"
    )
    assert new == paused  # C's log beats A's empty one
    info_c = c.cluster_info(paused)
    assert info_c is not None and info_c["ledger_end_index"] < committed  # entries lost

    c.start(m)

    def diverged() -> dict[str, object] | None:
        info = c.cluster_info(m)
        return info if info is not None and info.get("diverged") else None

    info = wait_until(diverged, 60, "M reports the divergence")
    assert "committed" in str(info["diverged"]) and info["raft_role"] == "FOLLOWER"
    r = http.get(c.urls[m] + "/readyz")
    assert r.status_code == 503 and r.json()["reason"].startswith("diverged:"), r.text
    metrics = http.get(c.urls[m] + "/metrics").text
    assert "ledgermq_raft_diverged 1.0" in metrics
    log = (c.log_dir / f"{m}.log").read_text(errors="replace")
    assert any("ERROR" in line and "diverged" in line for line in log.splitlines())
    # The others are fine as far as they can tell: nothing of theirs contradicts a leader.
    for n in (a, paused):
        info_n = c.cluster_info(n)
        assert info_n is not None and info_n.get("diverged") is None
