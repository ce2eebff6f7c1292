"""Failover through the HTTP API on 3 ``python -m ledgermq`` processes: kill -9 the master,
a new master takes writes, offsets continue without gap or duplicate, consumer offsets
are intact; with no quorum, writes answer 503 NO_MASTER with Retry-After; the killed
nodes come back and catch up."""

from __future__ import annotations

from typing import Any

import httpx

from ledgermq.local_cluster import LocalBrokerCluster
from tests.process.test_cluster_contract import caught_up
from tests.waiting import wait_until


def produce_until_ok(http: httpx.Client, c: LocalBrokerCluster, body: dict[str, Any]) -> Any:
    """What a client does across a failover: find the master, retry NO_MASTER (the
    session makes the retry safe)."""

    def attempt() -> Any:
        master = c.master()
        if master is None:
            return None
        try:
            r = http.post(c.urls[master] + "/v1/topics/fo/messages", json=body)
        except httpx.HTTPError:
            return None
        if r.status_code == 503:
            assert r.json()["error"]["code"] in ("NO_MASTER", "UNKNOWN_OUTCOME"), r.text
            return None
        assert r.status_code == 200, r.text
        return r.json()["results"]

    return wait_until(attempt, timeout_s=30, what="a produce through the failover")


def test_kill_the_master_then_lose_the_quorum(fresh_cluster3: LocalBrokerCluster) -> None:
    c = fresh_cluster3
    http = httpx.Client(timeout=30)
    try:
        master = c.wait_ready()
        url = c.urls[master]
        assert http.post(url + "/v1/topics", json={"name": "fo", "queues": 2}).status_code == 201
        first = produce_until_ok(
            http, c, {"messages": [{"body": f"a{i}", "queue_id": 0} for i in range(10)]}
        )
        assert [r["queue_offset"] for r in first] == list(range(10))
        r = http.put(url + "/v1/groups/cg/offsets", json={"topic": "fo", "offsets": {"0": 4}})
        assert r.status_code == 200

        c.kill(master)
        new_master = c.wait_ready(timeout_s=30)
        assert new_master != master
        second = produce_until_ok(
            http,
            c,
            {
                "messages": [{"body": f"b{i}", "queue_id": 0} for i in range(10)],
                "producer_id": "fo-1",
                "sequence": 0,
            },
        )
        assert [r["queue_offset"] for r in second] == list(range(10, 20))  # no gap, no dup
        offs = http.get(c.urls[new_master] + "/v1/groups/cg/offsets").json()["offsets"]
        assert offs[0]["committed_offset"] == 4  # the group's offset survived the failover

        # Only one node left: no quorum, no master; writes say so with Retry-After.
        survivor = next(n for n in c.ids if n not in (master, new_master))
        index = http.get(c.urls[new_master] + "/v1/cluster").json()["committed_index"]
        # A follower learns a commit on the next append or heartbeat: wait for it, or the
        # survivor would rightly not serve the second batch (it holds it uncommitted).
        wait_until(lambda: caught_up(c, survivor, index), what="the survivor has batch b")
        c.kill(new_master)
        wait_until(
            lambda: (c.cluster_info(survivor) or {}).get("broker_role") == "SLAVE",
            what="the survivor steps down",
        )

        def no_master() -> httpx.Response | None:
            r = http.post(
                c.urls[survivor] + "/v1/topics/fo/messages", json={"messages": [{"body": "z"}]}
            )
            return r if r.status_code == 503 else None

        r = wait_until(no_master, what="503 from the survivor")
        assert r.json()["error"]["code"] == "NO_MASTER"
        assert int(r.headers["retry-after"]) >= 1
        pulled = http.get(  # reads still work on the survivor
            c.urls[survivor] + "/v1/topics/fo/queues/0/messages", params={"max_messages": 100}
        ).json()
        assert [m["body"] for m in pulled["messages"]] == [f"a{i}" for i in range(10)] + [
            f"b{i}" for i in range(10)
        ]

        # Both come back: a master again, and everyone has everything.
        c.start(master)
        c.start(new_master)
        final = c.wait_ready(timeout_s=60)
        index = http.get(c.urls[final] + "/v1/cluster").json()["committed_index"]
        for n in c.ids:
            wait_until(lambda n=n: caught_up(c, n, index), what=f"{n} catches up")
        views = [
            http.get(u + "/v1/topics/fo/queues/0/messages", params={"max_messages": 100}).json()
            for u in c.urls.values()
        ]
        assert views[0] == views[1] == views[2]
        assert len(views[0]["messages"]) == 20
    finally:
        http.close()
