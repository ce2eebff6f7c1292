"""Transactions across a kill -9 of the master, on 3 ``python -m ledgermq`` processes
(docs/guarantees.md §5d): a producer begins transactions and commits a third at once,
rolls back a third and leaves a third to the broker's checks, which a checker thread of
the producer group answers (some only at the second check); the master is killed while
commits and checks are in flight, a new one takes over and the killed node comes back.

Then: every committed message is in its topic exactly once, the same on every replica;
no rolled-back one ever was, and no message was visible (pulls from every node during
the run) before its commit was asked for; nothing is pending and the counters agree on
every node; a transaction nobody answers (its producer group has no checker) is rolled
back once, after ``MAX_CHECKS`` checks in all: its check count goes on across the
failover, it does not start again."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgermq.client import TransactionCheck, TransactionProducer, TransactionResolvedError
from ledgermq.client.transacting import Resolution
from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS
from tests.process.conftest import start_cluster
from tests.process.test_cluster_contract import caught_up
from tests.waiting import wait_until

TOPIC, QUEUES = "txfo", 4
GROUP, SILENT_GROUP = "pg", "nobody"
TXS = 120
KILL_AFTER = 60  # transactions begun before the kill (it comes a few after that)
FIRST_CHECK_MS, CHECK_INTERVAL_MS, MAX_CHECKS = 300, 300, 5
NODE_ARGS = (
    *CLUSTER_ARGS,
    "--tx-first-check-ms",
    str(FIRST_CHECK_MS),
    "--tx-check-interval-ms",
    str(CHECK_INTERVAL_MS),
    "--tx-max-checks",
    str(MAX_CHECKS),
)
DEADLINE_S = 30.0  # every thread's loop ends by then
SILENT = "silent"  # the body of the transaction nobody answers


def plan(i: int) -> tuple[str, Resolution]:
    """Transaction ``i``: who resolves it (the producer at once, or the checker when the
    broker checks it) and how. A check of any of them is answered the same way."""
    kind = i % 3
    if kind == 0:
        return "producer", "commit"
    if kind == 1:
        return "producer", "rollback"
    return "checker", "commit" if (i // 3) % 2 == 0 else "rollback"


def bodies(i: int) -> list[str]:
    return [f"t{i}.{j}" for j in range(1 + (i // 3) % 3)]  # 1 to 3 messages


def index_of(body: str) -> int | None:
    head = body.partition(".")[0]
    return int(head[1:]) if head.startswith("t") and head[1:].isdigit() else None


class Run:
    """What the threads share: the transactions' ids, when each commit was first asked
    for, what was seen where, and what went wrong."""

    def __init__(self, c: LocalBrokerCluster) -> None:
        self.c = c
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.go = threading.Event()  # the producer's second half (the kill comes in it)
        self.committing = threading.Event()  # set while the producer's commit is in flight
        self.deadline = time.monotonic() + DEADLINE_S
        self.begun = 0
        self.ids: dict[int, str] = {}
        self.asked: dict[int, float] = {}  # transaction → first commit request (monotonic)
        self.calls: list[tuple[float, float, str]] = []  # (start, seconds, what)
        self.checks: list[tuple[int, int]] = []  # (transaction, check_count) the checker got
        self.lives = dict.fromkeys(c.ids, 0)  # incarnation of each node's process
        # (node, life, time, check_count; None: not pending) of the silent transaction
        self.silent: list[tuple[str, int, float, int | None]] = []
        self.visible: dict[str, set[str]] = {n: set() for n in c.ids}
        self.errors: list[str] = []
        self.violations: list[str] = []

    def ask(self, i: int) -> None:
        with self.lock:
            self.asked.setdefault(i, time.monotonic())

    def timed(self, start: float, what: str) -> None:
        with self.lock:
            self.calls.append((start, time.monotonic() - start, what))

    def saw(self, node: str, body: str, at: float) -> None:
        """``body`` was pulled from ``node``'s topic, the answer read at ``at``."""
        i = index_of(body)
        with self.lock:
            self.visible[node].add(body)
            asked = None if i is None else self.asked.get(i)
        if i is None or plan(i)[1] != "commit":
            self.violations.append(f"{body}, never committed, is in the topic on {node}")
        elif asked is None or asked > at:
            self.violations.append(f"{body} was visible on {node} before its commit")

    def guarded(self, name: str, fn: Callable[[Run], None]) -> threading.Thread:
        def body() -> None:
            try:
                fn(self)
            except Exception as e:  # reported by the test
                self.errors.append(f"{name}: {e!r}")

        return threading.Thread(target=body, name=name)


def produce(run: Run) -> None:
    """Begin every transaction; commit or roll back those the producer resolves, at once."""
    with TransactionProducer(run.c.brokers, GROUP) as p:
        for i in range(TXS):
            if i == KILL_AFTER:
                assert run.go.wait(DEADLINE_S), "no go for the second half"
            start = time.monotonic()
            tid = p.begin(TOPIC, bodies(i)).transaction_id
            run.timed(start, "begin")
            with run.lock:
                run.ids[i] = tid
            who, how = plan(i)
            if who == "producer":
                start = time.monotonic()
                if how == "commit":
                    run.ask(i)
                    run.committing.set()
                    state = p.commit(tid)
                    run.committing.clear()
                else:
                    state = p.rollback(tid)
                run.timed(start, how)
                assert state == ("committed" if how == "commit" else "rolled_back"), (i, state)
            with run.lock:
                run.begun = i + 1


def answer(run: Run) -> None:
    """The producer group's checker: answers by the plan, the checker's own transactions
    every other six only from their second check."""

    def checker(c: TransactionCheck) -> Resolution | None:
        i = index_of(c.messages[0].body.decode())
        assert i is not None, c
        with run.lock:
            run.checks.append((i, c.check_count))
        who, how = plan(i)
        if who == "checker" and c.check_count == 1 and (i // 6) % 2:
            return None  # not known yet: asked again
        if how == "commit":
            run.ask(i)
        return how

    with TransactionProducer(run.c.brokers, GROUP) as p:
        while not run.stop.is_set() and time.monotonic() < run.deadline:
            p.answer_checks(checker, wait_ms=200)


def watch(run: Run) -> None:
    """Pull the topic from every node over and over: what is there, and since when."""
    c = run.c
    nxt = {(n, q): 0 for n in c.ids for q in range(QUEUES)}
    with httpx.Client(timeout=2) as http:
        while not run.stop.is_set() and time.monotonic() < run.deadline:
            for (node, q), offset in list(nxt.items()):
                if not c.alive(node):
                    continue
                try:
                    r = http.get(
                        c.urls[node] + f"/v1/topics/{TOPIC}/queues/{q}/messages",
                        params={"offset": offset, "max_messages": 100},
                    )
                except httpx.HTTPError:
                    continue
                if r.status_code != 200:
                    continue  # (a node coming back, not ready yet)
                at = time.monotonic()
                page = r.json()
                for m in page["messages"]:
                    run.saw(node, m["body"], at)
                nxt[node, q] = page["next_offset"]


def sample(run: Run) -> None:
    """The silent transaction's check count as each node's process shows it, every few
    milliseconds (each count lasts a check interval at least)."""
    c = run.c
    with httpx.Client(timeout=2) as http:
        while not run.stop.wait(0.005) and time.monotonic() < run.deadline:
            for node in c.ids:
                life = run.lives[node]
                if not c.alive(node):
                    continue
                try:
                    r = http.get(
                        c.urls[node] + "/v1/transactions", params={"producer_group": SILENT_GROUP}
                    )
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    pending = r.json()["transactions"]
                    count = pending[0]["check_count"] if pending else None
                    with run.lock:
                        run.silent.append((node, life, time.monotonic(), count))


def silent_checks(run: Run) -> int:
    with run.lock:
        return max((n for *_, n in run.silent if n is not None), default=0)


def read_all(http: httpx.Client, url: str) -> list[dict[str, Any]]:
    """Every message of the topic on one node, queue by queue."""
    out: list[dict[str, Any]] = []
    for q in range(QUEUES):
        offset = 0
        for _ in range(100):  # pages (bounded)
            r = http.get(
                url + f"/v1/topics/{TOPIC}/queues/{q}/messages",
                params={"offset": offset, "max_messages": 100},
            )
            assert r.status_code == 200, r.text
            page = r.json()
            out += page["messages"]
            if page["next_offset"] >= page["max_offset"]:
                break
            offset = page["next_offset"]
    return out


def tx_counters(http: httpx.Client, url: str) -> dict[str, float]:
    """The node's transaction counters and pending gauge, from ``/metrics``."""
    out = {}
    for line in http.get(url + "/metrics").text.splitlines():
        if line.startswith("ledgermq_transactions_total{event="):
            name, value = line.removeprefix("ledgermq_transactions_total{event=").split("} ")
            out[name.strip('"')] = float(value)
        elif line.startswith("ledgermq_transactions_pending "):
            out["pending"] = float(line.split()[1])
    return out


@pytest.fixture
def tx_cluster(tmp_path: Path) -> Iterator[LocalBrokerCluster]:
    c = start_cluster(tmp_path / "cluster", NODE_ARGS)
    try:
        yield c
    finally:
        c.stop_all()


def test_transactions_across_a_kill_of_the_master(tx_cluster: LocalBrokerCluster) -> None:
    c = tx_cluster
    run = Run(c)
    threads = [run.guarded(n, f) for n, f in (("producer", produce), ("checker", answer))]
    watchers = [run.guarded("watcher", watch), run.guarded("sampler", sample)]
    http = httpx.Client(timeout=10)
    silent_p = TransactionProducer(c.brokers, SILENT_GROUP)
    try:
        master = c.wait_ready()
        r = http.post(c.urls[master] + "/v1/topics", json={"name": TOPIC, "queues": QUEUES})
        assert r.status_code == 201, r.text
        started = time.monotonic()
        for t in [*watchers, *threads]:
            t.start()

        # The silent transaction begins when the producer is half way (it waits there),
        # and the kill comes when it had two checks, while the producer commits again.
        wait_until(lambda: run.begun >= KILL_AFTER or run.errors, timeout_s=15, what="half of them")
        assert not run.errors, run.errors
        half_way = time.monotonic()
        silent = silent_p.begin(TOPIC, [SILENT]).transaction_id
        silent_begun = time.monotonic()
        wait_until(lambda: silent_checks(run) >= 2, timeout_s=10, what="two checks of it")
        run.go.set()
        wait_until(
            lambda: run.begun >= KILL_AFTER + 5 and run.committing.is_set(),
            timeout_s=10,
            poll_s=0.0005,
            what="a commit in flight",
        )
        killed = time.monotonic()
        checks_before = silent_checks(run)
        c.kill(master)
        new_master = c.wait_ready(timeout_s=30)
        took_over = time.monotonic()
        assert new_master != master
        run.lives[master] += 1
        c.start(master)

        wait_until(
            lambda: run.begun == TXS or run.errors, timeout_s=30, what="every transaction begun"
        )
        assert not run.errors, run.errors
        commits = [i for i in range(TXS) if plan(i)[1] == "commit"]
        expected = sorted(b for i in commits for b in bodies(i))
        with run.lock:
            ids = dict(run.ids)

        def settled() -> bool:
            live = c.master()
            if live is None:
                return False
            r = http.get(c.urls[live] + "/v1/transactions")
            counters = tx_counters(http, c.urls[live])
            return (
                r.status_code == 200
                and r.json()["transactions"] == []
                and counters.get("copied") == len(expected)
            )

        all_begun = time.monotonic()
        wait_until(lambda: settled() or run.errors, timeout_s=20, what="nothing pending")
        settled_at = time.monotonic()
        assert not run.errors, run.errors
        final = c.wait_ready(timeout_s=30)
        index = http.get(c.urls[final] + "/v1/cluster").json()["committed_index"]
        for n in c.ids:
            wait_until(lambda n=n: caught_up(c, n, index), timeout_s=20, what=f"{n} caught up")
        # The watcher's last pulls see what every node has.
        wait_until(
            lambda: all(len(run.visible[n]) >= len(expected) for n in c.ids) or run.violations,
            timeout_s=10,
            what="the watcher sees every committed message on every node",
        )
    finally:
        run.stop.set()
        for t in [*threads, *watchers]:
            if t.is_alive():
                t.join(timeout=30)
        http.close()
        silent_p.close()

    assert not run.errors, run.errors
    assert not run.violations, run.violations[:10]
    assert not any(t.is_alive() for t in [*threads, *watchers])

    with httpx.Client(timeout=10) as http:
        # Every replica: the same messages, each committed one exactly once, with its origin.
        views = [read_all(http, c.urls[n]) for n in c.ids]
        assert views[0] == views[1] == views[2]
        got = Counter(m["body"] for m in views[0])
        assert sorted(got.elements()) == expected, (
            sorted(set(expected) - set(got)),
            [b for b, k in got.items() if k > 1 or b not in expected],
        )
        for m in views[0]:
            i = index_of(m["body"])
            assert i is not None
            j = int(m["body"].partition(".")[2])
            assert m["properties"]["TX_ORIGIN"] == f"{ids[i].removeprefix('tx1:')}:{j}"
        # Nothing pending anywhere; the counters agree on every node.
        for n in c.ids:
            r = http.get(c.urls[n] + "/v1/transactions")
            assert r.status_code == 200 and r.json() == {"transactions": []}, (n, r.text)
        rollbacks = TXS - len(commits)
        want = {
            "begun": TXS + 1,
            "committed": len(commits),
            "rolled_back": rollbacks + 1,
            "expired": 1,
            "copied": len(expected),
            "dropped": 0,
            "pending": 0,
        }

        def agreed() -> list[dict[str, float]] | None:
            seen = [tx_counters(http, c.urls[n]) for n in c.ids]
            same = seen[0] == seen[1] == seen[2]
            return seen if same and {k: seen[0].get(k) for k in want} == want else None

        counters = wait_until(agreed, timeout_s=10, what="the same counters on every node")[0]
        checker_txs = sum(1 for i in range(TXS) if plan(i)[0] == "checker")
        assert counters["checks"] >= MAX_CHECKS + checker_txs

        # The silent transaction: rolled back once, after MAX_CHECKS checks in all. Seen
        # from each node's process: its count never goes down and, once resolved, it
        # stays resolved; the highest count is MAX_CHECKS.
        by_life: dict[tuple[str, int], list[int | None]] = {}
        for node, life, _, count in run.silent:
            by_life.setdefault((node, life), []).append(count)
        for key, counts in by_life.items():
            while counts and counts[0] is None:  # (a restarted node before it replayed)
                counts.pop(0)
            pending = [n for n in counts if n is not None]
            assert pending == sorted(pending), (key, counts)
            assert counts == pending + [None] * (len(counts) - len(pending)), (key, counts)
        assert 2 <= checks_before < MAX_CHECKS
        assert silent_checks(run) == MAX_CHECKS
        resolved_at = min(
            t for node, _, t, n in run.silent if node != master and n is None and t > killed
        )
        with pytest.raises(TransactionResolvedError), TransactionProducer(c.brokers, "x") as p:
            p.commit(silent)
        for tid in (silent, ids[1]):  # the silent one, one the producer rolled back
            r = http.post(c.urls[final] + f"/v1/transactions/{tid}", json={"action": "commit"})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert (err["code"], err["state"]) == ("TRANSACTION_RESOLVED", "rolled_back")

    # No node applied a copy it did not expect (a second copy of a message, say).
    for n in c.ids:
        log = (c.log_dir / f"{n}.log").read_text(errors="replace")
        assert "a transaction copy that was not expected" not in log, n
        assert "malformed transaction operation" not in log, n

    # The checker answered checks of its own transactions, some at the second check.
    with run.lock:
        counts_seen = Counter(n for _, n in run.checks)
    assert counts_seen[1] and counts_seen[2], counts_seen
    around = [(s, d, w) for s, d, w in run.calls if s <= killed <= s + d]
    slowest = max(run.calls, key=lambda x: x[1])
    print(
        f"\nphases: first half {half_way - started:.2f} s, to the kill {killed - half_way:.2f}"
        f" s, the rest begun {all_begun - killed:.2f} s, all settled"
        f" {settled_at - all_begun:.2f} s;"
        f" kill -9 of {master} to a new master {new_master}: {took_over - killed:.2f} s;"
        f" silent transaction rolled back {resolved_at - silent_begun:.2f} s after its begin"
        f" ({checks_before} checks before the kill); calls across the kill:"
        f" {[(w, round(d, 3)) for _, d, w in around]}; slowest call {slowest[2]}"
        f" {slowest[1]:.3f} s; checks answered by count {dict(counts_seen)};"
        f" counters {counters}"
    )
