"""RocketMQ 5's official Node.js client (``rocketmq-client-nodejs`` 1.0.8 from npm, in a
cache of its own: ``client_env.official_node``) against a 3-process LedgerMQ cluster.

What Node needs beyond Python (docs/rocketmq.md): one address per endpoints (it cannot
use "a;b;c"), a route with queue id 0, a Settings reply before ``startup()`` returns
(with an exponential backoff for producers), an MD5 body digest on every message, a
status per send entry. Producer (normal, FIFO, delay), SimpleConsumer (receive, ack,
change of the invisible time, through a follower), transactions (commit, rollback, and
the server's check answered), PushConsumer (success, a retry, failures dead-lettered,
FIFO order per message group) scenarios run as ``scripts/node/*.js``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS
from tests.process.conftest import start_cluster
from tests.waiting import wait_until

from .client_env import official_node, run_node_script
from .clusters import cluster_with_topics
from .scenarios import (
    CHECKER,
    FIFO_FAIL,
    TRANSACTIONS,
    assert_each_acknowledged_send_stored_once,
    assert_fifo_order,
    fifo_messages,
    stored,
)

pytestmark = [pytest.mark.slow, pytest.mark.process]

TOPICS = {
    **{"n-orders": 4, "n-fifo": 4, "n-later": 2, "n-work": 3, "n-push": 4},
    **{"n-tx": 2, "n-failing": 2, "n-ordered": 4},
}
# the first check after 1 s (RocketMQ's default: 6 s), so that the test does not wait long
TX_ARGS = ("--tx-first-check-ms", "1000", "--tx-check-interval-ms", "2000")


@pytest.fixture(scope="module")
def node_modules() -> Path:
    return official_node()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    with cluster_with_topics(tmp_path_factory.mktemp("rocketmq-node"), TOPICS, *TX_ARGS) as c:
        yield c


def one_node(c: LocalBrokerCluster, *, master: bool) -> str:
    """One node's gRPC address (Node.js takes a single address)."""
    m = c.wait_ready()
    return c.grpc_addrs[m if master else next(n for n in c.ids if n != m)]


def by_key(c: LocalBrokerCluster, topic: str, key: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{c.urls[c.ids[0]]}/v1/topics/{topic}/messages", params={"key": key}, timeout=5)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def push(modules: Path, endpoints: str, group: str, topic: str, **args: Any) -> dict[str, Any]:
    """A push consumer's run (``scripts/node/push_consumer.js``), a minute at most."""
    return run_node_script(
        modules,
        "push_consumer.js",
        {"endpoints": endpoints, "group": group, "topic": topic, "max_ms": 60000, **args},
        timeout_s=150,
    )


def send(modules: Path, endpoints: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    topics = sorted({m["topic"] for m in messages})
    out = run_node_script(
        modules, "producer.js", {"endpoints": endpoints, "topics": topics, "messages": messages}
    )
    receipts: list[dict[str, Any]] = out["receipts"]
    assert all("error" not in r for r in receipts), receipts
    return receipts


def test_node_producer_sends_normal_fifo_and_delay_messages(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    normal = [
        {
            "topic": "n-orders",
            "body": f"node order {i} ✓",
            "tag": "TagN",
            "keys": [f"node-k{i}"],
            "properties": {"lang": "js"},
        }
        for i in range(5)
    ]
    fifo = [
        {"topic": "n-fifo", "body": f"{g} step {i}", "group": g} for i in range(4) for g in "ab"
    ]
    # through a follower: every send forwarded to the master
    receipts = send(node_modules, one_node(cluster, master=False), normal + fifo)
    for spec, r in zip(normal + fifo, receipts, strict=True):
        got = wait_until(lambda r=r, s=spec: by_key(cluster, s["topic"], r["message_id"]), 30)
        assert len(got) == 1, (got, r)  # (twice: a send retried after a client timeout)
        m = got[0]
        assert m["body"] == spec["body"] and m["queue_offset"] == r["offset"]
        if "tag" in spec:
            assert m["tags"] == "TagN" and m["keys"] == spec["keys"]
            assert m["properties"] == {"lang": "js"}
        else:
            assert m["properties"] == {"__SHARDINGKEY": spec["group"]}
    for g in "ab":
        rows = [
            by_key(cluster, "n-fifo", r["message_id"])[0]
            for s, r in zip(fifo, receipts[len(normal) :], strict=True)
            if s["group"] == g
        ]
        assert len({m["queue_id"] for m in rows}) == 1
        assert [m["body"] for m in sorted(rows, key=lambda m: m["queue_offset"])] == [
            f"{g} step {i}" for i in range(4)
        ]
    sent_at = time.time()
    (r,) = send(
        node_modules,
        one_node(cluster, master=True),
        [{"topic": "n-later", "body": "wake", "delay_ms": 3000}],
    )
    assert r["recall_handle"], r
    (m,) = wait_until(lambda: by_key(cluster, "n-later", r["message_id"]), 30, "the delivery")
    assert m["body"] == "wake" and m["store_timestamp"] >= (sent_at + 3) * 1000 - 1000


def test_node_simple_consumer_receives_acks_and_changes_invisible_time(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.urls[cluster.wait_ready()]
    r = httpx.put(f"{master}/v1/groups/n-workers", json={"start": "earliest"})
    assert r.status_code == 200, r.text
    messages = [
        {"topic": "n-work", "body": "job 1", "tag": "TagA", "keys": ["job-1"]},
        {"topic": "n-work", "body": "job 2"},
        {"topic": "n-work", "body": "job 3", "group": "jobs"},
    ]
    receipts = send(node_modules, one_node(cluster, master=True), messages)
    report = run_node_script(
        node_modules,
        "simple_consumer.js",
        {
            "endpoints": one_node(cluster, master=False),  # every call forwarded
            "group": "n-workers",
            "topic": "n-work",
            "expect": len(messages),
            "invisible_ms": 20000,
            "await_ms": 2000,
        },
    )
    got = {m["message_id"]: m for m in report["received"]}
    assert set(got) == {r["message_id"] for r in receipts}
    for spec, r in zip(messages, receipts, strict=True):
        m = got[r["message_id"]]
        assert m["body"] == spec["body"] and m["tag"] == spec.get("tag")
        assert m["keys"] == spec.get("keys", []) and m["message_group"] == spec.get("group")
        assert m["delivery_attempt"] == 1 and not m["corrupted"]  # the MD5 digest holds
    assert report["handle_replaced"]
    assert report["old_handle_ack"].startswith("refused"), report["old_handle_ack"]
    (again,) = report["again"]
    assert again["message_id"] == report["received"][0]["message_id"]
    assert again["delivery_attempt"] == 2
    assert report["left"] == []


def test_node_push_consumer_consumes_every_message_once(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.urls[cluster.wait_ready()]
    r = httpx.put(f"{master}/v1/groups/n-pushers", json={"start": "earliest"})
    assert r.status_code == 200, r.text
    messages = [{"topic": "n-push", "body": f"push {i}"} for i in range(10)]
    receipts = send(node_modules, one_node(cluster, master=True), messages)
    report = push(
        node_modules,
        one_node(cluster, master=False),
        "n-pushers",
        "n-push",
        until=len(messages),
        fail=["push 3"],  # nacked once, delivered again with attempt 2
    )
    got = report["deliveries"]
    ok = sorted(d["message_id"] for d in got if d["result"] == "success")
    assert ok == sorted(r["message_id"] for r in receipts), got
    attempts = sorted(d["delivery_attempt"] for d in got if d["body"] == "push 3")
    assert attempts == [1, 2], got
    assert all(not d["corrupted"] for d in got)

    def lag() -> int:
        q = httpx.get(f"{master}/v1/groups/n-pushers/offsets", params={"topic": "n-push"})
        return sum(x["lag"] for x in q.json()["offsets"])

    wait_until(lambda: lag() == 0, 20, "every message acked")


def bodies_of(c: LocalBrokerCluster, topic: str, queues: int) -> list[str]:
    out = []
    for q in range(queues):
        r = httpx.get(
            f"{c.urls[c.wait_ready()]}/v1/topics/{quote(topic, safe='')}/queues/{q}/messages",
            params={"offset": 0, "max_messages": 100},
            timeout=5,
        )
        assert r.status_code == 200, r.text
        out += [m["body"] for m in r.json()["messages"]]
    return sorted(out)


def test_node_transactions_commit_roll_back_and_answer_the_servers_check(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.urls[cluster.wait_ready()]
    out = run_node_script(
        node_modules,
        "transactional.js",
        {
            "endpoints": one_node(cluster, master=False),  # begins and ends forwarded
            "http": master,
            "topic": "n-tx",
            "transactions": TRANSACTIONS,
            "checker": CHECKER,
            "wait_checks_s": 60,
        },
        timeout_s=150,
    )
    sent = out["sent"]
    assert all("error" not in s for s in sent), sent
    assert len({s["transaction_id"] for s in sent}) == 4
    ids = {spec["body"]: s["message_id"] for spec, s in zip(TRANSACTIONS, sent, strict=True)}
    checked = {c["body"]: c for c in out["checked"]}
    assert set(checked) == {"checked: commit", "checked: roll back"}, out["checked"]
    for body, c in checked.items():
        assert c["message_id"] == ids[body] and c["topic"] == "n-tx", c
    r = httpx.get(f"{master}/v1/transactions", params={"producer_group": "n-tx"}, timeout=5)
    assert r.status_code == 200 and r.json()["transactions"] == [], r.text
    for body in ("committed", "checked: commit"):
        (m,) = wait_until(lambda b=body: by_key(cluster, "n-tx", ids[b]), 30, body)
        assert m["body"] == body
    assert bodies_of(cluster, "n-tx", 2) == ["checked: commit", "committed"]


def test_node_push_consumer_failures_are_retried_then_dead_lettered(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.urls[cluster.wait_ready()]
    config = {"start": "earliest", "max_delivery_attempts": 3}
    r = httpx.put(
        f"{master}/v1/groups/n-failers",
        json={**config, "retry": {"policy": "list", "delays_ms": [200]}},
    )
    assert r.status_code == 200, r.text
    messages = [{"topic": "n-failing", "body": f"bad {i}"} for i in range(2)]
    receipts = send(node_modules, one_node(cluster, master=True), messages)
    report = push(
        node_modules,
        one_node(cluster, master=False),
        "n-failers",
        "n-failing",
        until=len(messages) * 3,
        fail_all=True,
        dead_url=f"{master}/v1/groups/n-failers",
        dead=len(messages),
    )
    attempts: dict[str, list[int]] = {}
    for d in report["deliveries"]:
        attempts.setdefault(d["message_id"], []).append(d["delivery_attempt"])
    assert attempts == {r["message_id"]: [1, 2, 3] for r in receipts}, attempts
    assert report["dead_lettered"] == len(messages), report
    assert bodies_of(cluster, "%DLQ%n-failers", 1) == sorted(m["body"] for m in messages)


def test_node_fifo_push_consumer_keeps_each_message_groups_order_through_a_failure(
    node_modules: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.urls[cluster.wait_ready()]
    r = httpx.put(f"{master}/v1/groups/n-fifo-pushers", json={"start": "earliest", "fifo": True})
    assert r.status_code == 200, r.text
    messages = fifo_messages("n-ordered")
    send(node_modules, one_node(cluster, master=True), messages)
    report = push(
        node_modules,
        one_node(cluster, master=False),
        "n-fifo-pushers",
        "n-ordered",
        until=len(messages) + 1,
        fail=[FIFO_FAIL],
    )
    assert_fifo_order(report["deliveries"])


def test_kill_9_of_the_master_during_node_sends_through_a_follower_stores_each_once(
    node_modules: Path, tmp_path: Path
) -> None:
    """Node's producer, connected to a follower (it takes one address), sends while the
    master is killed: the follower holds the sends in flight through the election and
    forwards them to the new master; a send the client retries carries the same message
    id. Every id the client was told is stored is stored once, and no body twice."""
    c = start_cluster(tmp_path / "c", (*CLUSTER_ARGS, "--no-auto-create-topics"))
    try:
        master = c.wait_ready()
        r = httpx.post(f"{c.urls[master]}/v1/topics", json={"name": "busy", "queues": 2})
        assert r.status_code == 201, r.text
        follower = next(n for n in c.ids if n != master)
        wait_until(lambda: stored(c, follower, "busy") == 0, 10, "the topic on the follower")
        n = 300
        messages = [{"topic": "busy", "body": f"m{i}"} for i in range(n)]
        out: dict[str, Any] = {}

        def run() -> None:
            args = {"endpoints": c.grpc_addrs[follower], "topics": ["busy"], "messages": messages}
            out.update(run_node_script(node_modules, "producer.js", args, timeout_s=300))

        sender = threading.Thread(target=run)
        sender.start()
        wait_until(lambda: stored(c, follower, "busy") >= n // 4, 60, "a quarter sent")
        c.kill(master)
        sender.join(300)
        assert not sender.is_alive() and out, "the producer did not finish"
        assert "startup_error" not in out, out
        receipts = out["receipts"]
        ok = [r for r in receipts if "error" not in r]
        assert len(ok) >= n // 2, receipts  # most go through (the rest: errors, told so)
        new_master = c.wait_ready()
        total = assert_each_acknowledged_send_stored_once(c, new_master, "busy", messages, receipts)
        print(f"kill -9 during Node sends: {len(ok)}/{n} acknowledged, {total} stored, none twice")
    finally:
        c.stop_all()
