"""The HTTP contract against a real 3-node cluster of ``python -m ledgermq`` processes on
127.0.0.1: redirects from a SLAVE, reads from every node, long polling, bad input
changing no node's log, retried session batches, leadership transfer over HTTP."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.waiting import wait_until


def roles(c: LocalBrokerCluster) -> tuple[str, list[str]]:
    master = c.wait_ready(timeout_s=30)
    return master, [n for n in c.ids if n != master]


def caught_up(c: LocalBrokerCluster, node: str, index: int) -> bool:
    info = c.cluster_info(node)
    return info is not None and info["dispatched_index"] >= index


def log_ends(c: LocalBrokerCluster) -> dict[str, int]:
    return {n: c.cluster_info(n)["ledger_end_index"] for n in c.ids}  # type: ignore[index]


@pytest.fixture
def http() -> Any:
    with httpx.Client(timeout=30) as client:
        yield client


def test_every_node_describes_the_same_cluster(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, _ = roles(cluster3)
    infos = [http.get(u + "/v1/cluster").json() for u in cluster3.urls.values()]
    assert {i["leader_id"] for i in infos} == {master}
    assert {i["leader_url"] for i in infos} == {cluster3.urls[master]}
    assert sorted(i["broker_role"] for i in infos) == ["MASTER", "SLAVE", "SLAVE"]
    for info in infos:
        assert [(n["node_id"], n["http_url"]) for n in info["nodes"]] == list(cluster3.urls.items())


WRITES = [
    ("post", "/v1/topics", {"name": "redir", "queues": 2}),
    ("post", "/v1/topics/redir/messages", {"messages": [{"body": "x"}]}),
    ("put", "/v1/groups/gr/offsets", {"topic": "redir", "offsets": {"0": 0}}),
    ("post", "/v1/groups/gr/offsets/reset", {"topic": "redir", "to": "earliest"}),
    ("post", "/v1/groups/gr/pull", {"topic": "redir", "auto_commit": True}),
    ("delete", "/v1/topics/redir", None),
]


def test_writes_on_a_slave_redirect_to_the_master(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, slaves = roles(cluster3)
    slave_url, master_url = cluster3.urls[slaves[0]], cluster3.urls[master]
    for method, path, body in WRITES:
        r = http.request(method, slave_url + path + "?x=1", json=body)
        assert r.status_code == 307, (path, r.text)
        assert r.headers["location"] == master_url + path + "?x=1"
        err = r.json()["error"]
        assert err["code"] == "NOT_MASTER"
        assert (err["leader_id"], err["leader_url"]) == (master, master_url)
        followed = http.request(method, slave_url + path, json=body, follow_redirects=True)
        assert followed.status_code in (200, 201, 204), (path, followed.text)
    r = http.post(slave_url + "/v1/cluster/leadership", json={"to": slaves[1]})
    assert r.status_code == 307


def test_reads_are_served_by_every_node(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, _ = roles(cluster3)
    base = cluster3.urls[master]
    sent = http.post(
        base + "/v1/topics/reads/messages",
        json={"messages": [{"body": f"r{i}", "key": f"k{i}", "queue_id": 0} for i in range(20)]},
    )
    assert sent.status_code == 200
    index = http.get(base + "/v1/cluster").json()["committed_index"]
    answers = []
    for node, url in cluster3.urls.items():
        wait_until(lambda n=node: caught_up(cluster3, n, index), what=f"{node} dispatch")
        pull = http.get(url + "/v1/topics/reads/queues/0/messages", params={"max_messages": 100})
        key = http.get(url + "/v1/topics/reads/messages", params={"key": "k7"}).json()
        one = http.get(url + "/v1/messages/" + sent.json()["results"][3]["msg_id"]).json()
        topic = http.get(url + "/v1/topics/reads").json()
        answers.append((pull.json(), key, one, topic))
    assert answers[0] == answers[1] == answers[2]
    pull, key, one, _ = answers[0]
    assert [m["body"] for m in pull["messages"]] == [f"r{i}" for i in range(20)]
    assert [m["body"] for m in key["messages"]] == ["r7"] and one["body"] == "r3"


def test_long_polling_wakes_promptly_on_every_node(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, _ = roles(cluster3)
    http.post(cluster3.urls[master] + "/v1/topics", json={"name": "lp", "queues": 1})
    index = http.get(cluster3.urls[master] + "/v1/cluster").json()["committed_index"]
    for n in cluster3.ids:
        wait_until(lambda n=n: caught_up(cluster3, n, index), what="topic everywhere")
    woke: dict[str, float] = {}
    results: dict[str, Any] = {}

    def poll(node: str) -> None:
        with httpx.Client(timeout=30) as c:
            r = c.get(
                cluster3.urls[node] + "/v1/topics/lp/queues/0/messages",
                params={"offset": 0, "wait_ms": 10_000},
            )
        woke[node] = time.monotonic()
        results[node] = r.json()

    threads = [threading.Thread(target=poll, args=(n,)) for n in cluster3.ids]
    for t in threads:
        t.start()

    def parked(node: str) -> bool:
        text = http.get(cluster3.urls[node] + "/metrics").text
        return "ledgermq_long_polls_waiting 1.0" in text

    for n in cluster3.ids:
        wait_until(lambda n=n: parked(n), what=f"the long poll parked on {n}")
    assert not woke, "a long poll returned before anything was produced"
    r = http.post(
        cluster3.urls[master] + "/v1/topics/lp/messages", json={"messages": [{"body": "w"}]}
    )
    committed = time.monotonic()
    for t in threads:
        t.join(timeout=15)
    assert set(results) == set(cluster3.ids)
    for node, res in results.items():
        assert res["status"] == "FOUND" and res["messages"][0]["body"] == "w", node
    lag_ms = {n: (woke[n] - committed) * 1000 for n in woke}
    # The master dispatches before it answers the produce; a slave learns the commit on
    # the next append or heartbeat (200 ms).
    assert lag_ms[master] < 100, lag_ms
    assert all(v < 1000 for v in lag_ms.values()), lag_ms
    assert r.status_code == 200


def test_bad_input_changes_no_log(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, _ = roles(cluster3)
    url = cluster3.urls[master]
    http.post(url + "/v1/topics", json={"name": "bad", "queues": 2})
    before = log_ends(cluster3)
    huge = "x" * (4 * 1024 * 1024 + 1)
    cases = [
        ("post", "/v1/topics/bad/messages", {"json": {"messages": [{"body": huge}]}}, 413),
        ("post", "/v1/topics/bad/messages", {"content": b"{not json"}, 422),
        (
            "post",
            "/v1/topics/bad/messages",
            {"json": {"messages": [{"body": "x", "queue_id": 9}]}},
            422,
        ),
        ("post", "/v1/topics", {"json": {"name": "%SYS%x"}}, 422),
        ("put", "/v1/groups/g/offsets", {"json": {"topic": "bad", "offsets": {"7": 1}}}, 422),
        ("post", "/v1/topics/bad/messages", {"content": b"\x00" * 100}, 422),
    ]
    for method, path, kw, status in cases:
        r = http.request(method, url + path, **kw)
        assert r.status_code == status, (path, r.text)
        assert r.json()["error"]["code"] in ("PAYLOAD_TOO_LARGE", "INVALID_ARGUMENT")
    assert log_ends(cluster3) == before
    assert all(cluster3.alive(n) for n in cluster3.ids)


def test_retried_session_batch_returns_the_same_results(
    cluster3: LocalBrokerCluster, http: Any
) -> None:
    master, slaves = roles(cluster3)
    batch = {"messages": [{"body": f"s{i}"} for i in range(5)], "producer_id": "pc", "sequence": 3}
    first = http.post(cluster3.urls[master] + "/v1/topics/sess/messages", json=batch)
    before = log_ends(cluster3)
    again = http.post(  # through a slave: redirected, then answered from the session table
        cluster3.urls[slaves[0]] + "/v1/topics/sess/messages", json=batch, follow_redirects=True
    )
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert log_ends(cluster3)[master] == before[master]


def test_leadership_transfer_over_http(cluster3: LocalBrokerCluster, http: Any) -> None:
    master, slaves = roles(cluster3)
    r = http.post(cluster3.urls[master] + "/v1/cluster/leadership", json={"to": slaves[0]})
    assert r.status_code == 200, r.text
    assert r.json()["leader_id"] == slaves[0]
    assert cluster3.wait_ready(timeout_s=30) == slaves[0]
    for url in cluster3.urls.values():
        wait_until(lambda u=url: http.get(u + "/v1/cluster").json()["leader_id"] == slaves[0])
    # Each node's role history (GET /v1/cluster/history) tells it: the old master recorded
    # the transfer in the term the target leads, every node that term's leader, and the
    # target that it became MASTER in it.
    term = http.get(cluster3.urls[slaves[0]] + "/v1/cluster").json()["term"]
    history = {n: http.get(u + "/v1/cluster/history").json() for n, u in cluster3.urls.items()}
    transfers = [
        (e["term"], e["leader_id"]) for e in history[master]["events"] if e["event"] == "transfer"
    ]
    assert transfers[-1] == (term, slaves[0])
    for node, h in history.items():
        assert h["node_id"] == node
        seen = [
            e["leader_id"]
            for e in h["events"]
            if e["event"] == "role" and e["term"] == term and e["leader_id"] is not None
        ]
        assert seen and set(seen) == {slaves[0]}, (node, h)
    promoted = [e["term"] for e in history[slaves[0]]["events"] if e["event"] == "master"]
    assert promoted[-1] == term
