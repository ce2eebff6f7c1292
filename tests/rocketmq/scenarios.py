"""What the official clients' scenarios share, Python's and Node's alike: the
transactions of the server-check scenario, the FIFO push scenario's messages and order
check, and the exactly-once check after a kill -9 during sends."""

from __future__ import annotations

from typing import Any

import httpx

from ledgermq.local_cluster import LocalBrokerCluster

# One transaction each: committed and rolled back by the client, and two left open for
# the server's check, which the producer's checker answers as CHECKER says.
TRANSACTIONS = [
    {"body": "committed", "end": "commit"},
    {"body": "rolled back", "end": "rollback"},
    {"body": "checked: commit", "end": "open"},
    {"body": "checked: roll back", "end": "open"},
]
CHECKER = {"checked: commit": "commit", "checked: roll back": "rollback"}
FIFO_GROUPS = ("g1", "g2", "g3")
FIFO_STEPS = 5
FIFO_FAIL = "g2 step 1"  # failed once: retried in place, before g2's next message


def fifo_messages(topic: str) -> list[dict[str, Any]]:
    """Five steps of each message group, interleaved."""
    return [
        {"topic": topic, "body": f"{g} step {i}", "group": g}
        for i in range(FIFO_STEPS)
        for g in FIFO_GROUPS
    ]


def assert_fifo_order(deliveries: list[dict[str, Any]]) -> None:
    """Every group's steps consumed in order, and ``FIFO_FAIL`` delivered again at once
    (its group's next message waited for it)."""
    done: dict[str, list[str]] = {g: [] for g in FIFO_GROUPS}
    for d in deliveries:
        assert d["message_group"] in done, d
        if d["result"] == "success":
            done[d["message_group"]].append(d["body"])
    for g in FIFO_GROUPS:
        assert done[g] == [f"{g} step {i}" for i in range(FIFO_STEPS)], done
    seen = [d["body"] for d in deliveries if d["message_group"] == "g2"]
    assert seen[:3] == ["g2 step 0", FIFO_FAIL, FIFO_FAIL], seen


def stored(c: LocalBrokerCluster, node: str, topic: str) -> int:
    """Messages of ``topic`` on ``node`` (-1 while it lacks the topic)."""
    r = httpx.get(f"{c.urls[node]}/v1/topics/{topic}", timeout=5)
    return sum(q["max_offset"] for q in r.json()["queues"]) if r.status_code == 200 else -1


def by_key(c: LocalBrokerCluster, node: str, topic: str, key: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{c.urls[node]}/v1/topics/{topic}/messages", params={"key": key}, timeout=5)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def assert_each_acknowledged_send_stored_once(
    c: LocalBrokerCluster,
    node: str,
    topic: str,
    sent: list[dict[str, Any]],
    receipts: list[dict[str, Any]],
    queues: int = 2,
) -> int:
    """Every send acknowledged (a receipt without ``error``) is stored once under its
    message id, and no body is stored twice (a resend after a failover included); how
    many messages ``topic`` holds on ``node``."""
    for spec, r in zip(sent, receipts, strict=True):
        if "error" not in r:
            found = by_key(c, node, topic, r["message_id"])
            assert len(found) == 1 and found[0]["body"] == spec["body"], (r, found)
    bodies: dict[str, int] = {}
    for q in range(queues):
        page = httpx.get(
            f"{c.urls[node]}/v1/topics/{topic}/queues/{q}/messages",
            params={"offset": 0, "max_messages": 1000},
            timeout=10,
        ).json()["messages"]
        for m in page:
            bodies[m["body"]] = bodies.get(m["body"], 0) + 1
    total = stored(c, node, topic)
    assert sum(bodies.values()) == total
    twice = {b: k for b, k in bodies.items() if k > 1}
    assert not twice, f"stored more than once: {twice}"
    return total
