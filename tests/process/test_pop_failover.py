"""A POP group across a kill -9 of the master, on 3 ``python -m ledgermq`` processes
(docs/consuming.md, "What holds across a failover"): several consumers share a topic,
the master dies mid-stream and comes back; every message is acknowledged once or
dead-lettered (the poison ones, exactly once each), no message is handed to a second
consumer inside its invisible time, attempts never go down, and the lag ends at 0."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import Any

import httpx

from ledgermq.local_cluster import LocalBrokerCluster
from tests.process.test_cluster_failover import produce_until_ok
from tests.waiting import wait_until

TOPIC, GROUP, DLQ = "fo", "w", "%DLQ%w"
MESSAGES = 240
POISON = {f"m{i}" for i in range(MESSAGES) if i % 40 == 7}  # never acked: dead letters
INVISIBLE_MS = 1500
ATTEMPTS = 3
DEADLINE_S = 120.0


class Consumers:
    """Consumer threads of one group: each receives from whichever node answers
    (a SLAVE redirects its writes to the master) and acks what it got, but the poison."""

    def __init__(self, c: LocalBrokerCluster, n: int) -> None:
        self.c = c
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.deliveries: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
        self.acked: dict[str, int] = defaultdict(int)  # OK answers per body
        self.unknown: set[str] = set()  # an ack whose answer was lost
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]

    def _post(self, http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
        for node in self.c.ids:
            if not self.c.alive(node):
                continue
            try:
                r = http.post(self.c.urls[node] + path, json=body)
            except httpx.HTTPError:
                continue
            if r.status_code == 503:
                return None  # no master yet (or an unknown outcome): try again later
            if r.status_code != 200:
                raise AssertionError(f"{path}: {r.status_code} {r.text}")
            return r.json()
        return None

    def _run(self, i: int) -> None:
        http = httpx.Client(timeout=10, follow_redirects=True)
        try:
            while not self.stop.is_set():
                got = self._post(
                    http,
                    f"/v1/groups/{GROUP}/receive",
                    {
                        "topic": TOPIC,
                        "max_messages": 8,
                        "invisible_ms": INVISIBLE_MS,
                        "wait_ms": 300,
                    },
                )
                if got is None:
                    time.sleep(0.05)  # no master: the election takes a moment
                    continue
                now = time.time() * 1000
                todo = []
                with self.lock:
                    for m in got["messages"]:
                        self.deliveries[m["body"]].append(
                            (now, m["delivery_attempt"], m["invisible_until"])
                        )
                        if m["body"] not in POISON:
                            todo.append(m)
                if not todo:
                    continue
                handles = [m["receipt_handle"] for m in todo]
                res = self._post(
                    http, f"/v1/groups/{GROUP}/ack", {"topic": TOPIC, "receipt_handles": handles}
                )
                with self.lock:
                    if res is None:
                        self.unknown.update(m["body"] for m in todo)
                        continue
                    for m, r in zip(todo, res["results"], strict=True):
                        if r["status"] == "OK":
                            self.acked[m["body"]] += 1
        except Exception as e:  # reported by the test
            self.errors.append(f"consumer {i}: {e!r}")
        finally:
            http.close()

    def done(self) -> bool:
        with self.lock:
            return all(
                self.acked[f"m{i}"] or f"m{i}" in self.unknown
                for i in range(MESSAGES)
                if f"m{i}" not in POISON
            )


def _dead_letters(http: httpx.Client, url: str) -> list[dict[str, Any]]:
    r = http.get(url + f"/v1/topics/{DLQ}/queues/0/messages", params={"max_messages": 100})
    if r.status_code != 200:
        return []
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_a_pop_group_across_a_kill_of_the_master(fresh_cluster3: LocalBrokerCluster) -> None:
    c = fresh_cluster3
    http = httpx.Client(timeout=30)
    consumers = Consumers(c, 3)
    try:
        master = c.wait_ready()
        url = c.urls[master]
        assert http.post(url + "/v1/topics", json={"name": TOPIC, "queues": 4}).status_code == 201
        config = {
            "start": "earliest",
            "max_delivery_attempts": ATTEMPTS,
            "retry": {"policy": "list", "delays_ms": [100]},
        }
        assert http.put(url + f"/v1/groups/{GROUP}", json=config).status_code == 200
        for seq in range(MESSAGES // 40):
            body = {
                "messages": [{"body": f"m{i}"} for i in range(seq * 40, seq * 40 + 40)],
                "producer_id": "p",
                "sequence": seq,
            }
            produce_until_ok(http, c, body)
        for t in consumers.threads:
            t.start()
        wait_until(
            lambda: sum(consumers.acked.values()) >= MESSAGES // 3,
            timeout_s=60,
            what="a third of the messages acked",
        )
        with consumers.lock:
            before = sum(consumers.acked.values())
        c.kill(master)
        new_master = c.wait_ready(timeout_s=30)
        assert new_master != master
        c.start(master)
        wait_until(consumers.done, timeout_s=DEADLINE_S, what="every message acked")
        wait_until(
            lambda: len(_dead_letters(http, c.urls[new_master])) >= len(POISON),
            timeout_s=60,
            what="the poison messages dead-lettered",
        )
        consumers.stop.set()
        for t in consumers.threads:
            t.join(timeout=30)
        assert not consumers.errors, consumers.errors

        assert before < MESSAGES - len(POISON), "the master died mid-stream"
        # Acked once: no message got two OK acks (a second handle of it was stale).
        assert max(consumers.acked.values()) == 1
        # Dead letters: each poison message exactly once, with its origin and attempts.
        dead = _dead_letters(http, c.urls[new_master])
        assert sorted(m["body"] for m in dead) == sorted(POISON)
        for m in dead:
            assert m["properties"]["DLQ_ORIGIN_TOPIC"] == TOPIC
            assert m["properties"]["DELIVERY_ATTEMPTS"] == str(ATTEMPTS)
        for body, seen in consumers.deliveries.items():
            attempts = [a for _, a, _ in seen]
            assert attempts == sorted(attempts), (body, seen)  # attempts never go down
            for (_, _, until), (at, _, _) in itertools.pairwise(seen):
                # never handed out again inside the last delivery's invisible time
                # (100 ms of slack: the client's clock reads after the answer)
                assert at + 100 >= until, (body, seen)
            if body in POISON:
                assert max(attempts) <= ATTEMPTS
        # Lag 0: nothing left that is neither acked nor dead-lettered, on every node.
        for node in c.ids:
            wait_until(lambda node=node: c.ready(node), timeout_s=60, what=f"{node} ready")

            def lag_zero(node: str = node) -> bool:
                r = http.get(c.urls[node] + f"/v1/groups/{GROUP}/offsets", params={"topic": TOPIC})
                return r.status_code == 200 and all(q["lag"] == 0 for q in r.json()["offsets"])

            wait_until(lag_zero, timeout_s=30, what=f"lag 0 on {node}")
    finally:
        consumers.stop.set()
        for t in consumers.threads:
            if t.is_alive():
                t.join(timeout=30)
        http.close()
