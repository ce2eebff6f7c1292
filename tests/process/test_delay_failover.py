"""Delay messages across a kill -9 of the master, on 3 ``python -m ledgermq`` processes
(docs/guarantees.md §5c): delays spread over a few seconds, some recalled before the
kill and some after it, the master killed while about half are pending, a new master
elected, the old one restarted. Then, reading every queue of the topic from every node:
every delay message not recalled is delivered exactly once, no recalled one is, none
before its time (the store time is the master's clock, which is this machine's), and
the replicas are identical; ``GET /v1/topics`` never lists the timer topic."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import httpx

from broker.metadata import TIMER_TOPIC
from ledgermq.demo.load import percentile
from ledgermq.local_cluster import LocalBrokerCluster
from tests.process.test_cluster_contract import caught_up
from tests.waiting import wait_until

TOPIC, QUEUES = "dl", 4
MESSAGES = 300
BATCH = 25
FIRST_MS, SPREAD_MS = 1_000, 4_000  # due from 1 s to 5 s after the first send
RECALL_BEFORE = {i for i in range(MESSAGES) if i % 20 == 3}  # recalled before the kill
RECALL_AFTER = {i for i in range(MESSAGES) if i % 20 == 13}  # recalled on the new master
# When the messages were due: the lateness (store time - time) of each is reported.
PHASES = ("before the kill", "during the election", "after it")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _write(c: LocalBrokerCluster, http: httpx.Client, method: str, path: str,
           body: Any = None) -> httpx.Response | None:  # fmt: skip
    """One write to whichever node says it is MASTER; None when there is none yet or
    the answer is one to retry (no master, an unknown outcome: the retries here are
    safe, a produce under its session and a recall repeated)."""
    master = c.master()
    if master is None:
        return None
    try:
        r = http.request(method, c.urls[master] + path, json=body)
    except httpx.HTTPError:
        return None
    if r.status_code == 503:
        assert r.json()["error"]["code"] in ("NO_MASTER", "UNKNOWN_OUTCOME"), r.text
        return None
    return r


def _until_answered(c: LocalBrokerCluster, http: httpx.Client, method: str, path: str,
                    body: Any = None) -> httpx.Response:  # fmt: skip
    def attempt() -> httpx.Response | None:
        return _write(c, http, method, path, body)

    r = wait_until(attempt, timeout_s=15, what=f"{method} {path} answered", poll_s=0.05)
    assert r is not None
    return r


def _recall(c: LocalBrokerCluster, http: httpx.Client, result: dict[str, Any]) -> str:
    """``cancelled`` (200) or ``delivered`` (409 ALREADY_DELIVERED); answered before the
    message's time, only ``cancelled`` (it cannot have been delivered yet)."""
    r = _until_answered(c, http, "DELETE", f"/v1/delayed/{result['recall_handle']}")
    answered_ms = _now_ms()
    if r.status_code == 409:
        assert r.json()["error"]["code"] == "ALREADY_DELIVERED", r.text
        assert answered_ms >= result["deliver_at_ms"], f"delivered before its time: {result}"
        return "delivered"
    assert r.status_code == 200, r.text
    return "cancelled"


def _delivered(http: httpx.Client, url: str) -> int:
    """The messages in the topic on one node (-1: no answer)."""
    try:
        r = http.get(url + f"/v1/topics/{TOPIC}")
    except httpx.HTTPError:
        return -1
    if r.status_code != 200:
        return -1
    return sum(q["max_offset"] - q["min_offset"] for q in r.json()["queues"])


def _read_all(http: httpx.Client, url: str) -> list[dict[str, Any]]:
    """Every message of every queue of the topic on one node, in queue and offset order."""
    out: list[dict[str, Any]] = []
    desc = http.get(url + f"/v1/topics/{TOPIC}").json()
    for q in desc["queues"]:
        offset = q["min_offset"]
        for _ in range(MESSAGES):  # bounded: every page moves on
            if offset >= q["max_offset"]:
                break
            r = http.get(
                url + f"/v1/topics/{TOPIC}/queues/{q['queue_id']}/messages",
                params={"offset": offset, "max_messages": 1000},
            )
            assert r.status_code == 200, r.text
            page = r.json()["messages"]
            assert page, f"queue {q['queue_id']} ends at {offset}, not {q['max_offset']}"
            out += page
            offset = page[-1]["queue_offset"] + 1
    return out


def _no_timer_topic(c: LocalBrokerCluster, http: httpx.Client) -> None:
    for node in c.ids:
        if not c.alive(node):
            continue
        try:
            r = http.get(c.urls[node] + "/v1/topics")
        except httpx.HTTPError:
            continue  # (a node starting)
        if r.status_code == 200:
            names = {t["name"] for t in r.json()["topics"]}
            assert TIMER_TOPIC not in names, (node, names)


def _figures(xs: list[int]) -> str:
    if not xs:
        return "none"
    return (
        f"n={len(xs)} p50 {percentile(xs, 0.5):.0f} ms, p99 {percentile(xs, 0.99):.0f} ms, "
        f"max {max(xs)} ms"
    )


def test_delay_messages_across_a_kill_of_the_master(fresh_cluster3: LocalBrokerCluster) -> None:
    c = fresh_cluster3
    http = httpx.Client(timeout=10)
    try:
        master = c.wait_ready()
        r = http.post(c.urls[master] + "/v1/topics", json={"name": TOPIC, "queues": QUEUES})
        assert r.status_code == 201, r.text

        # Delay messages due from 1 s to 5 s from now, each batch across the whole spread.
        start = _now_ms()
        order = list(range(MESSAGES))
        random.Random(29).shuffle(order)
        due = {i: start + FIRST_MS + SPREAD_MS * i // MESSAGES for i in range(MESSAGES)}
        results: dict[int, dict[str, Any]] = {}
        for seq, at in enumerate(range(0, MESSAGES, BATCH)):
            ids = order[at : at + BATCH]
            body = {
                "messages": [{"body": f"d{i}", "deliver_at_ms": due[i]} for i in ids],
                "producer_id": "delay-fo",
                "sequence": seq,
            }
            r = _until_answered(c, http, "POST", f"/v1/topics/{TOPIC}/messages", body)
            assert r.status_code == 200, r.text
            for i, res in zip(ids, r.json()["results"], strict=True):
                assert res["queue_id"] is None and res["queue_offset"] is None
                assert res["deliver_at_ms"] >= due[i]  # (a time past is now)
                results[i] = res
        recalls = {i: _recall(c, http, results[i]) for i in sorted(RECALL_BEFORE)}
        _no_timer_topic(c, http)

        # The kill -9, once about half of what is to be delivered is delivered.
        expected_before = MESSAGES - len(RECALL_BEFORE)
        wait_until(
            lambda: _delivered(http, c.urls[master]) >= expected_before // 2,
            timeout_s=15,
            what="half the delay messages delivered",
        )
        c.kill(master)
        killed_ms = _now_ms()
        new_master = c.wait_ready(timeout_s=30)
        elected_ms = _now_ms()
        assert new_master != master
        # Recalls on the new master: a pending one is cancelled, a delivered one says so.
        for i in sorted(RECALL_AFTER):
            recalls[i] = _recall(c, http, results[i])
        assert "cancelled" in recalls.values()
        c.start(master)
        _no_timer_topic(c, http)

        cancelled = {i for i, how in recalls.items() if how == "cancelled"}
        expected = MESSAGES - len(cancelled)
        new_url = c.urls[new_master]
        wait_until(
            lambda: _delivered(http, new_url) >= expected,
            timeout_s=20,
            what=f"{expected} delay messages delivered",
            poll_s=0.05,
        )
        index = http.get(new_url + "/v1/cluster").json()["committed_index"]
        for node in c.ids:
            wait_until(lambda node=node: caught_up(c, node, index), timeout_s=30,
                       what=f"{node} caught up")  # fmt: skip
        _no_timer_topic(c, http)

        views = {node: _read_all(http, url) for node, url in c.urls.items()}
        ref = views[new_master]
        for node, view in views.items():
            assert view == ref, f"{node}'s topic differs from {new_master}'s"
        counts = Counter(m["body"] for m in ref)
        twice = sorted(b for b, n in counts.items() if n > 1)
        assert not twice, f"delivered twice: {twice}"
        wanted = {f"d{i}" for i in range(MESSAGES) if i not in cancelled}
        assert set(counts) - wanted == set(), f"cancelled yet delivered: {set(counts) - wanted}"
        assert wanted - set(counts) == set(), f"never delivered: {sorted(wanted - set(counts))}"
        for i, how in recalls.items():  # ALREADY_DELIVERED was so
            assert (f"d{i}" in counts) == (how == "delivered"), (i, how)
        late: dict[str, list[int]] = {phase: [] for phase in PHASES}
        for m in ref:
            i = int(m["body"][1:])
            res = results[i]
            assert m["properties"]["TIMER_DELIVER_MS"] == str(res["deliver_at_ms"])
            assert "t1:" + m["properties"]["TIMER_ORIGIN"] == res["recall_handle"]
            lateness = m["store_timestamp"] - res["deliver_at_ms"]
            assert lateness >= 0, f"{m['body']} stored {-lateness} ms before its time"
            at = res["deliver_at_ms"]
            late[PHASES[(at >= killed_ms) + (at > elected_ms)]].append(lateness)
        print(
            f"delay failover: killed {master} at +{killed_ms - start} ms, {new_master} master "
            f"{elected_ms - killed_ms} ms later; {expected} delivered, {len(cancelled)} "
            f"recalled ({sum(1 for h in recalls.values() if h == 'delivered')} recalls "
            "answered ALREADY_DELIVERED)"
        )
        for phase, xs in late.items():
            print(f"  lateness (store - deliver_at) of those due {phase}: {_figures(xs)}")
        assert late["before the kill"] and late["after it"], late
    finally:
        http.close()
