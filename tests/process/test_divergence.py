"""Issue 33's reproduction, on 3 ``python -m ledgermq`` processes: slave C paused while
master M and slave A acknowledge messages; M and A killed, A's data directory deleted
and A restarted empty under its old id (the procedure issue 33 forbids), C resumed.

Before node identity, A's vote elected C, whose log lacks the acknowledged messages, and
M, back, held committed entries its new leader contradicted (a divergence, which the
node now reports loudly: ``tests/api/test_divergence_report.py``). Now every data
directory has an incarnation and the group's configuration names each voter's: A's vote
is not A-the-member's, so C gets no majority, no master is elected from {A, C}; M, back,
leads with everything acknowledged, and A, reading its member named with another
incarnation, says what to do (``cluster replace``).
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx

from dledger.store import node_dir
from dledger.store.meta import CheckpointFile
from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until


def test_a_node_back_with_an_empty_disk_under_its_old_id_elects_no_one(
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

    def sealed_everywhere() -> bool:
        """Every node holds the configuration that names every voter's incarnation:
        what lets the survivors tell A's empty directory from A (a node cut off before
        the first leader sealed it could not; CI saw C paused that early)."""
        for n in c.ids:
            r = http.get(c.urls[n] + "/v1/cluster/members")
            if r.status_code != 200 or not all(m["incarnation"] for m in r.json()["members"]):
                return False
        return True

    wait_until(sealed_everywhere, 30, "every node has the members' incarnations")

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
    # C asks A and M for votes: M is down, A's vote is not its member's. No master.
    for _ in range(50):  # 5 s of looking, bounded: the absence of a master
        assert c.master() not in (a, paused), "a master without the acknowledged entries"
        time.sleep(0.1)
    info_c = c.cluster_info(paused)
    assert info_c is not None and info_c["ledger_end_index"] < committed  # C lacks them

    c.start(m)
    new = wait_until(c.master, 60, "a master once M is back")
    assert new in (m, paused)
    info = c.cluster_info(new)
    assert info is not None and info["committed_index"] >= committed  # nothing lost
    r = http.get(c.urls[new] + "/v1/topics/dv")
    assert r.status_code == 200, r.text
    assert sum(q["max_offset"] for q in r.json()["queues"]) == 6400  # every message
    for n in (m, paused):
        info_n = c.cluster_info(n)
        assert info_n is not None and info_n.get("diverged") is None
    # A, on M's log, reads that its member is another data directory's, and says so.
    wait_until(lambda: "stale_identity" in c.log_tail(a), 60, "A says what to do")
    assert "cluster replace" in c.log_tail(a)
