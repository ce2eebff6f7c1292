"""Membership changes on real ``python -m ledgermq`` processes (issue 33), driven by the
CLI as an operator would: the group grows from 3 to 5 voters and shrinks back to 3 while
a producer writes, with the master killed (-9) in between, and nothing acknowledged is
lost; a node whose data directory was deleted is replaced with ``ledgermq cluster
replace``, and, until then, its votes and acks count for nothing.

Each change's figures (how long a learner took to catch up and be promoted, the longest
gap between two acknowledged sends around it) are printed: ``pytest -s`` shows them."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from ledgermq.client import Admin, Producer
from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until

TOPIC = "mb"
QUEUES = 4
PRODUCE_FOR_AT_MOST_S = 240.0  # the producer's bound; the test stops it long before


def _cli(c: LocalBrokerCluster, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ledgermq.cli.main", "cluster", *args, "--brokers", c.brokers],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, f"cluster {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def _status(c: LocalBrokerCluster) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ledgermq.cli.main", "status", "--brokers", c.brokers],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _members(c: LocalBrokerCluster) -> dict[str, str]:
    with Admin(c.brokers) as admin:
        return {m["node_id"]: m["role"] for m in admin.members()["members"]}


class _Load:
    """A producer in a thread: batches of 5 with numbered bodies, the acknowledged ones
    and when each acknowledgement came (a send whose outcome is unknown is retried under
    the client's producer session, so it is stored once)."""

    def __init__(self, brokers: str) -> None:
        self.brokers = brokers
        self.acked: set[str] = set()
        self.ack_times: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + PRODUCE_FOR_AT_MOST_S
        with Producer(self.brokers, timeout_s=5, deadline_s=60) as p:
            k = 0
            while not self.stop.is_set() and time.monotonic() < deadline:
                bodies = [f"m-{k + i:06d}" for i in range(5)]
                try:
                    p.send(TOPIC, bodies)
                except Exception as e:  # the client gave up (its deadline): count it
                    self.errors.append(repr(e))
                    continue
                self.acked.update(bodies)
                self.ack_times.append(time.monotonic())
                k += 5
                time.sleep(0.01)

    def gap_around(self, t0: float, t1: float) -> float:
        """The longest time without an acknowledgement in [t0, t1]."""
        marks = [t0] + [t for t in self.ack_times if t0 <= t <= t1] + [t1]
        return max(b - a for a, b in itertools.pairwise(marks))


def _all_bodies(c: LocalBrokerCluster) -> set[str]:
    found: set[str] = set()
    with Admin(c.brokers) as admin:
        for q in admin.describe_topic(TOPIC).queues:
            offset = q.min_offset
            for _ in range(100_000):  # bounded
                if offset >= q.max_offset:
                    break
                page = admin.pull(TOPIC, q.queue_id, offset, max_messages=500)
                found.update(m.body.decode() for m in page.messages)
                offset = page.next_offset
    return found


def test_grow_to_five_and_shrink_to_three_under_load_with_the_master_killed(
    fresh_cluster3: LocalBrokerCluster,
) -> None:
    c = fresh_cluster3
    c.wait_ready()
    with Admin(c.brokers) as admin:
        admin.create_topic(TOPIC, QUEUES)
    load = _Load(c.brokers)
    load.thread.start()
    figures: list[str] = []
    try:
        wait_until(lambda: len(load.acked) >= 200, 60, "the producer is running")
        for nid in ("n3", "n4"):  # grow: each joins as a learner, then votes
            c.add_node(nid)
            c.start(nid)
            t0 = time.monotonic()
            _cli(c, "add", nid, "--raft-addr", c.raft_addrs[nid], "--http-url", c.urls[nid])
            t1 = time.monotonic()
            row = next(line for line in _status(c).splitlines() if line.startswith(nid))
            assert "(learner)" in row, row
            _cli(c, "promote", nid)
            t2 = time.monotonic()
            figures.append(
                f"{nid}: added in {t1 - t0:.2f} s, caught up and promoted in {t2 - t1:.2f} s,"
                f" longest ack gap {load.gap_around(t0, t2):.2f} s"
            )
        assert _members(c) == dict.fromkeys(("n0", "n1", "n2", "n3", "n4"), "voter")

        old = c.master()
        assert old is not None
        before = len(load.acked)
        t0 = time.monotonic()
        c.kill(old)  # -9
        new = wait_until(lambda: c.master() if c.master() not in (None, old) else None, 60)
        wait_until(lambda: len(load.acked) > before + 50, 60, "writes go on after the kill")
        figures.append(f"kill -9 of {old}: ack gap {load.gap_around(t0, time.monotonic()):.2f} s")

        # shrink: the dead old master, then one live original node
        gone = [old, next(n for n in ("n0", "n1", "n2") if n not in (old, new))]
        for nid in gone:
            t0 = time.monotonic()
            _cli(c, "remove", nid)
            figures.append(
                f"remove {nid}: {time.monotonic() - t0:.2f} s,"
                f" ack gap {load.gap_around(t0, time.monotonic()):.2f} s"
            )
        c.stop(gone[1])
        left = sorted(n for n in c.ids if n not in gone)
        assert _members(c) == dict.fromkeys(left, "voter")
        wait_until(lambda: len(load.acked) > before + 200, 60, "writes go on after the shrink")
    finally:
        load.stop.set()
        load.thread.join(timeout=90)
    assert not load.thread.is_alive()
    stored = _all_bodies(c)
    missing = load.acked - stored
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    figures.append(
        f"{len(load.acked)} acknowledged, {len(stored)} stored, {len(load.errors)} given up"
    )
    print("\n" + "\n".join(figures))


def test_a_node_whose_disk_was_lost_is_replaced_with_one_command(
    fresh_cluster3: LocalBrokerCluster,
) -> None:
    """The issue's reproduction up to the lost disk: a slave's data directory is deleted
    and it comes back empty under its old id. The master tells it from its member (its
    votes and acks count for nothing, a warning says what to do); ``cluster replace``
    adds the new node, waits for it, promotes it and removes the old member."""
    c = fresh_cluster3
    m = c.wait_ready()
    with Admin(c.brokers) as admin:
        admin.create_topic(TOPIC, 1)
    with Producer(c.brokers) as p:
        for k in range(50):
            p.send(TOPIC, [f"before-{k}"])
    lost = next(n for n in c.ids if n != m)
    wait_until(lambda: c.ready(lost), 30, f"{lost} caught up")
    c.kill(lost)
    shutil.rmtree(c.data_dir / lost)
    c.start(lost)  # empty, under its old id: the procedure issue 33 forbids

    def warned() -> bool:
        return "stranger_incarnation" in c.log_tail(c.master() or m)

    wait_until(warned, 60, "the master says the node is not its member")
    info: Any = c.cluster_info(c.master() or m)
    assert info is not None
    with Producer(c.brokers) as p:  # two voters of three: writes go on
        p.send(TOPIC, ["while-lost"])

    c.kill(lost)  # the operator stops it and replaces it
    c.add_node("n3")
    c.start("n3")
    t0 = time.monotonic()
    out = _cli(
        c, "replace", lost, "n3", "--raft-addr", c.raft_addrs["n3"], "--http-url", c.urls["n3"]
    )
    took = time.monotonic() - t0
    assert f"{lost} removed" in out, out
    members = _members(c)
    assert lost not in members and members.get("n3") == "voter", members
    with Producer(c.brokers) as p:
        p.send(TOPIC, ["after-replace"])
    bodies = _all_bodies(c)
    assert {f"before-{k}" for k in range(50)} | {"while-lost", "after-replace"} <= bodies
    with httpx.Client(timeout=5) as http:
        assert http.get(c.urls["n3"] + "/readyz").status_code in (200, 503)
    print(f"\nreplace {lost} by n3: {took:.2f} s")

    # Removing the master itself: it hands leadership over, the new master removes it.
    master = c.master()
    assert master is not None
    _cli(c, "remove", master)
    members = _members(c)
    assert master not in members and len(members) == 2, members
    new = wait_until(lambda: c.master() if c.master() not in (None, master) else None, 60)
    assert new in members
    with Producer(c.brokers) as p:
        p.send(TOPIC, ["after-the-master-left"])
