"""RocketMQ 5 push consumers (the official Python client, ``client_env``) against a
3-process LedgerMQ cluster: QueryAssignment, receives with a server-managed invisible
time renewed while the client lives, retries with the delivery attempt going on, dead
letters after the group's max attempts, FIFO order per message group.

The nodes run with a 6 s push invisible time (``LEDGERMQ_GRPC_AUTO_RENEW_MS``), so a
listener that sleeps 8 s needs a renewal.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import pytest

from api.rocketmq.protocol import definition_pb2 as pb
from api.rocketmq.protocol import service_pb2 as spb
from api.rocketmq.protocol import service_pb2_grpc
from api.rocketmq.settings import AUTO_RENEW_ENV
from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS
from tests.waiting import wait_until

from .client_env import official_python, run_script
from .clusters import cluster_with_topics
from .scenarios import FIFO_FAIL, assert_fifo_order, fifo_messages

pytestmark = [pytest.mark.slow, pytest.mark.process]

AUTO_RENEW_MS = 6000
TOPICS = {"push": 4, "slow": 2, "failing": 2, "ordered": 4, "quitting": 2}
CLIENT = [("x-mq-client-id", "test@2@0@push")]


@pytest.fixture(scope="module")
def official() -> Path:
    return official_python()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    with cluster_with_topics(
        tmp_path_factory.mktemp("rocketmq-push"), TOPICS, env={AUTO_RENEW_ENV: str(AUTO_RENEW_MS)}
    ) as c:
        yield c


def master_url(c: LocalBrokerCluster) -> str:
    return c.urls[c.wait_ready()]


def make_group(c: LocalBrokerCluster, group: str, **config: Any) -> None:
    r = httpx.put(f"{master_url(c)}/v1/groups/{group}", json={"start": "earliest", **config})
    assert r.status_code == 200, r.text


def send(python: Path, endpoints: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    topics = sorted({m["topic"] for m in messages})
    out = run_script(
        python,
        "producer.py",
        {"endpoints": endpoints, "topics": topics, "mode": "sync", "messages": messages},
    )
    receipts: list[dict[str, Any]] = out["receipts"]
    assert all("error" not in r for r in receipts), receipts
    return receipts


def push(python: Path, endpoints: str, group: str, topic: str, **args: Any) -> dict[str, Any]:
    return run_script(
        python,
        "push_consumer.py",
        {"endpoints": endpoints, "group": group, "topic": topic, "max_s": 60, **args},
        timeout_s=150,
    )


def group_counts(c: LocalBrokerCluster, group: str, topic: str) -> dict[str, int]:
    doc = httpx.get(f"{master_url(c)}/v1/groups/{group}", timeout=5).json()
    found = [t for t in doc["topics"] if t["topic"] == topic]
    return found[0] if found else {"in_flight": 0}  # type: ignore[no-any-return]


def lag(c: LocalBrokerCluster, group: str, topic: str) -> int:
    r = httpx.get(f"{master_url(c)}/v1/groups/{group}/offsets", params={"topic": topic}, timeout=5)
    return sum(q["lag"] for q in r.json()["offsets"])


def test_assignment_is_one_any_queue_entry_at_the_access_point(cluster: LocalBrokerCluster) -> None:
    follower = next(n for n in cluster.ids if n != cluster.master())
    access = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="10.1.2.3", port=8081)])
    with grpc.insecure_channel(cluster.grpc_addrs[follower]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        req = spb.QueryAssignmentRequest(
            topic=pb.Resource(name="push"), group=pb.Resource(name="g"), endpoints=access
        )
        a = stub.QueryAssignment(req, metadata=CLIENT, timeout=5)
        b = stub.QueryAssignment(req, metadata=CLIENT, timeout=5)
        assert a.status.code == pb.OK and a.SerializeToString() == b.SerializeToString()
        (one,) = a.assignments
        q = one.message_queue
        assert q.id == -1 and q.topic.name == "push" and q.permission == pb.READ_WRITE
        assert q.broker.id == 0 and q.broker.endpoints == access
        missing = stub.QueryAssignment(
            spb.QueryAssignmentRequest(
                topic=pb.Resource(name="nosuch"), group=pb.Resource(name="g"), endpoints=access
            ),
            metadata=CLIENT,
            timeout=5,
        )
        assert missing.status.code == pb.TOPIC_NOT_FOUND


def test_push_consumer_consumes_every_message_once(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    make_group(cluster, "pushers")
    messages = [{"topic": "push", "body": f"push {i}", "tag": "T"} for i in range(12)]
    receipts = send(official, cluster.grpc_endpoints, messages)
    report = push(official, cluster.grpc_endpoints, "pushers", "push", until=len(messages))
    got = report["deliveries"]
    assert sorted(d["message_id"] for d in got) == sorted(r["message_id"] for r in receipts)
    assert all(d["attempt"] == 1 and not d["corrupted"] for d in got), got
    wait_until(lambda: lag(cluster, "pushers", "push") == 0, 20, "every message acked")
    counts = group_counts(cluster, "pushers", "push")
    assert counts["acked"] == len(messages) and counts["redelivered"] == 0, counts


def test_a_slow_listener_keeps_its_messages_by_renewal_and_acks_with_the_first_handle(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    """The listener sleeps 8 s, past the 6 s invisible time the server picked: the
    master renews it while the client heartbeats; no second delivery, and the ack with
    the handle first given holds."""
    make_group(cluster, "sleepers")
    follower = next(n for n in cluster.ids if n != cluster.master())
    receipts = send(official, cluster.grpc_endpoints, [{"topic": "slow", "body": "zzz"}])
    report = push(
        official,
        cluster.grpc_addrs[follower],  # every call forwarded; the master renews
        "sleepers",
        "slow",
        until=1,
        sleep_s=(AUTO_RENEW_MS + 2000) / 1000,
    )
    (d,) = report["deliveries"]
    assert d["message_id"] == receipts[0]["message_id"] and d["attempt"] == 1
    wait_until(lambda: lag(cluster, "sleepers", "slow") == 0, 20, "the message acked")
    counts = group_counts(cluster, "sleepers", "slow")
    assert counts["acked"] == 1 and counts["redelivered"] == 0 and counts["expired"] == 0, counts


def test_failures_are_retried_with_the_attempt_going_on_then_dead_lettered(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    make_group(
        cluster,
        "failers",
        max_delivery_attempts=3,
        retry={"policy": "list", "delays_ms": [200]},
    )
    messages = [{"topic": "failing", "body": f"bad {i}"} for i in range(2)]
    receipts = send(official, cluster.grpc_endpoints, messages)
    report = push(
        official,
        cluster.grpc_endpoints,
        "failers",
        "failing",
        until=len(messages) * 3,
        fail_all=True,
        dead_url=f"{master_url(cluster)}/v1/groups/failers",
        dead=len(messages),
    )
    attempts: dict[str, list[int]] = {}
    for d in report["deliveries"]:
        attempts.setdefault(d["message_id"], []).append(d["attempt"])
    assert attempts == {r["message_id"]: [1, 2, 3] for r in receipts}, attempts
    assert report["dead_lettered"] == len(messages)
    dlq = quote("%DLQ%failers", safe="")
    r = httpx.get(f"{master_url(cluster)}/v1/topics/{dlq}/queues/0/messages", params={"offset": 0})
    assert r.status_code == 200, r.text
    dead = r.json()["messages"]
    assert sorted(m["body"] for m in dead) == sorted(m["body"] for m in messages)
    assert all(m["properties"]["DLQ_ORIGIN_TOPIC"] == "failing" for m in dead), dead
    assert lag(cluster, "failers", "failing") == 0


def test_fifo_push_consumer_keeps_each_message_groups_order_through_a_failure(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    make_group(cluster, "fifo-pushers", fifo=True)
    messages = fifo_messages("ordered")
    send(official, cluster.grpc_endpoints, messages)
    report = push(
        official,
        cluster.grpc_endpoints,
        "fifo-pushers",
        "ordered",
        until=len(messages) + 1,
        fail=[FIFO_FAIL],
    )
    assert_fifo_order(report["deliveries"])
    wait_until(lambda: lag(cluster, "fifo-pushers", "ordered") == 0, 20, "every message acked")


def test_renewal_goes_on_after_the_master_dies(official: Path, tmp_path: Path) -> None:
    """kill -9 of the master just after it handed a message to a push consumer whose
    listener runs past two invisible times: the new master knows the flight is renewed
    for that client (the replicated POP state) and goes on renewing it; the listener's
    ack, with the handle first given, lands on the new master; no second delivery."""
    renew_ms = 12_000
    c = LocalBrokerCluster(3, tmp_path / "c", extra_args=(*CLUSTER_ARGS, "--no-auto-create-topics"))
    c.env[AUTO_RENEW_ENV] = str(renew_ms)
    c.start_all()
    try:
        master = c.wait_ready(timeout_s=90)
        url = c.urls[master]
        assert httpx.post(f"{url}/v1/topics", json={"name": "kept", "queues": 2}).status_code == 201
        make_group(c, "survivors")
        (receipt,) = send(official, c.grpc_endpoints, [{"topic": "kept", "body": "long job"}])
        out: dict[str, Any] = {}

        def consume() -> None:
            out["report"] = push(
                official,
                c.grpc_endpoints,
                "survivors",
                "kept",
                until=1,
                sleep_s=2 * renew_ms / 1000 + 2,
            )

        worker = threading.Thread(target=consume)
        worker.start()
        try:
            wait_until(
                lambda: group_counts(c, "survivors", "kept")["in_flight"] == 1, 30, "the receive"
            )
            c.kill(master)
            new_master = c.wait_ready([n for n in c.ids if n != master], timeout_s=60)
            assert new_master != master
        finally:
            worker.join(timeout=150)
        (d,) = out["report"]["deliveries"]
        assert d["message_id"] == receipt["message_id"] and d["attempt"] == 1
        wait_until(lambda: lag(c, "survivors", "kept") == 0, 30, "the ack on the new master")
        counts = group_counts(c, "survivors", "kept")
        assert counts["acked"] == 1 and counts["redelivered"] == 0, counts
    finally:
        c.stop_all()


def test_a_fifo_push_consumer_forwards_what_it_gives_up_on_to_the_dead_letters(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    """A FIFO push consumer retries a failing message locally (the group's attempts,
    from Settings), then ForwardMessageToDeadLetterQueue: the copy lands in
    ``%DLQ%<group>`` and the message group goes on with the next message."""
    make_group(
        cluster,
        "fifo-quitters",
        fifo=True,
        max_delivery_attempts=2,
        retry={"policy": "list", "delays_ms": [100]},
    )
    messages = [{"topic": "quitting", "body": f"q step {i}", "group": "q"} for i in range(3)]
    receipts = send(official, cluster.grpc_endpoints, messages)
    report = push(
        official,
        cluster.grpc_endpoints,
        "fifo-quitters",
        "quitting",
        until=4,  # step 0, step 1 twice, step 2
        fail_always=["q step 1"],
    )
    bodies = [d["body"] for d in report["deliveries"]]
    assert bodies == ["q step 0", "q step 1", "q step 1", "q step 2"], report["deliveries"]
    wait_until(lambda: lag(cluster, "fifo-quitters", "quitting") == 0, 20, "all done")
    assert group_counts(cluster, "fifo-quitters", "quitting")["dead_lettered"] == 1
    dlq = quote("%DLQ%fifo-quitters", safe="")
    r = httpx.get(f"{master_url(cluster)}/v1/topics/{dlq}/queues/0/messages", params={"offset": 0})
    (dead,) = r.json()["messages"]
    assert dead["body"] == "q step 1" and dead["properties"]["DLQ_ORIGIN_TOPIC"] == "quitting"
    # the copy keeps the client's message id (its UNIQ_KEY): found by it
    r = httpx.get(
        f"{master_url(cluster)}/v1/topics/{dlq}/messages", params={"key": receipts[1]["message_id"]}
    )
    assert [m["body"] for m in r.json()["messages"]] == ["q step 1"], (r.text, dead)
