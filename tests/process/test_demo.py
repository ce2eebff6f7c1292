"""``ledgermq demo`` end to end through its real entry point: three broker processes,
the master killed with SIGKILL twice under a producer and a consumer group, the old
nodes restarted and caught up, the books balanced and every replica identical;
``--keep-running`` leaves the cluster up until Ctrl-C, which stops every node.
``--brokers`` with ``--duration`` against a running cluster, twice: the second run
finds the topic of the first and counts only its own messages."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from ledgermq.client import Admin
from ledgermq.local_cluster import LocalBrokerCluster
from tests.lines import Lines

LEDGERMQ = str(Path(sys.executable).with_name("ledgermq"))
NUMBER = r"([\d,]+)"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def test_demo_kills_the_master_twice_and_balances_the_books(tmp_path: Path) -> None:
    args = ["--plain", "--kills", "2", "--phase", "1", "--keep-running", "--rate", "1000"]
    p = subprocess.Popen(
        [LEDGERMQ, "demo", *args, "--data-dir", str(tmp_path / "demo")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    out = Lines(p)
    try:
        out.wait_for(r"cluster ready \(n0 pid \d+, n1 pid \d+, n2 pid \d+\); n\d is MASTER", 90)
        for k in (1, 2):
            kill = out.wait_for(rf"kill {k} of 2: kill -9 (n\d) \(pid (\d+)\), the MASTER", 120)
            victim, pid = kill.group(1), int(kill.group(2))
            try:
                os.kill(pid, 0)
                raise AssertionError(f"{victim} (pid {pid}) still runs after kill -9")
            except ProcessLookupError:
                pass
            new = out.wait_for(r"new MASTER (n\d), seen " + NUMBER + " ms after the kill", 60)
            assert new.group(1) != victim
            window = out.wait_for(r"writes unavailable for " + NUMBER + " ms", 60)
            assert 0 < _int(window.group(1)) < 60_000
            out.wait_for(rf"{victim} is back as SLAVE", 120)
            out.wait_for(rf"{victim} caught up with index", 120)

        books = out.wait_for(
            rf"acknowledged {NUMBER}, consumed {NUMBER}, lost (\d+), duplicated (\d+)", 180
        )
        acknowledged, consumed = _int(books.group(1)), _int(books.group(2))
        assert acknowledged == consumed > 0, books.group(0)
        assert (books.group(3), books.group(4)) == ("0", "0"), books.group(0)
        out.wait_for(r"misplaced 0, unexpected 0", 5)
        out.wait_for(r"unavailability window .*: p50 [\d,]+ ms, max [\d,]+ ms over 2", 5)
        out.wait_for(
            rf"replicas: queues over HTTP: 4 queues x 3 nodes, identical \({acknowledged:,} ", 5
        )
        out.wait_for(r"replicas: commitlog files: identical on 3 nodes", 5)
        out.wait_for(r"replicas: consume queues files: identical on 3 nodes", 5)
        out.wait_for(r"^result: CLEAN$", 5)

        brokers = out.wait_for(r"cluster left running: --brokers (\S+);", 30).group(1)
        with Admin(brokers) as admin:
            views = admin.cluster_all()
        roles = sorted(v.status.broker_role for v in views if v.status is not None)
        assert roles == ["MASTER", "SLAVE", "SLAVE"], views

        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0, out.text
        for url in brokers.split(","):
            try:
                httpx.get(url + "/healthz", timeout=2)
                raise AssertionError(f"{url} still answers after the demo stopped")
            except httpx.TransportError:
                pass
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    assert not re.search(r"PROBLEM|Traceback", out.text), out.text


def test_demo_against_a_running_cluster_runs_for_its_duration_twice(
    cluster3: LocalBrokerCluster,
) -> None:
    for run in (1, 2):
        args = ["--duration", "2", "--plain", "--rate", "500", "--topic", "demo-duration"]
        r = subprocess.run(
            [LEDGERMQ, "demo", "--brokers", cluster3.brokers, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, f"run {run}:\n{r.stdout}\n{r.stderr}"
        assert re.search(r"n\d is MASTER\. To see a failover, kill it", r.stdout), r.stdout
        books = re.search(
            rf"acknowledged {NUMBER}, consumed {NUMBER}, lost 0, duplicated 0\n", r.stdout
        )
        assert books and books.group(1) == books.group(2) and _int(books.group(1)) > 0, r.stdout
        assert "no failover during the run" in r.stdout
        assert "other producers' messages" not in r.stdout, "the group starts at the run's start"
        assert re.search(r"queues over HTTP: 4 queues x 3 nodes, identical", r.stdout)
        assert r.stdout.rstrip().endswith("result: CLEAN"), r.stdout
