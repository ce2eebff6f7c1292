"""RocketMQ 5's official Python client (``rocketmq-python-client`` 5.1.2, in its own venv:
``client_env``) against a 3-process LedgerMQ cluster on 127.0.0.1, over gRPC.

Producers: sync and async sends, FIFO (one message group → one queue, in order), a
delay message (invisible before its time), each read back over our HTTP API with its
body, tag, keys, properties and the client's message id; a client that reaches only a
follower (its sends are forwarded to the master). Bad input, from a raw stub: clear
status codes and nothing written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from api.rocketmq.protocol import definition_pb2 as pb
from api.rocketmq.protocol import service_pb2 as spb
from api.rocketmq.protocol import service_pb2_grpc
from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS
from tests.process.conftest import start_cluster
from tests.waiting import wait_until

from .client_env import official_python, run_script
from .clusters import cluster_with_topics

pytestmark = pytest.mark.slow

TOPICS = {"orders": 4, "fifo": 8, "later": 2, "fromslave": 2, "speed": 4, "work": 3}


@pytest.fixture(scope="module")
def official() -> Path:
    return official_python()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    with cluster_with_topics(tmp_path_factory.mktemp("rocketmq"), TOPICS) as c:
        yield c


def by_key(c: LocalBrokerCluster, node: str, topic: str, key: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{c.urls[node]}/v1/topics/{topic}/messages", params={"key": key}, timeout=5)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def read_back(c: LocalBrokerCluster, topic: str, message_id: str) -> dict[str, Any]:
    """The one message stored under the client's id, as every node serves it."""
    found = {}
    for node in c.ids:
        got = wait_until(
            lambda n=node: by_key(c, n, topic, message_id), 10, f"{message_id} on {node}"
        )
        assert len(got) == 1, got
        found[node] = got[0]
    first = found[c.ids[0]]
    assert all(m == first for m in found.values()), found
    return first


def send(
    python: Path, endpoints: str, messages: list[dict[str, Any]], mode: str = "sync"
) -> dict[str, Any]:
    topics = sorted({m["topic"] for m in messages})
    return run_script(
        python,
        "producer.py",
        {"endpoints": endpoints, "topics": topics, "mode": mode, "messages": messages},
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_producer_sends_are_stored_with_their_ids_tags_keys_and_properties(
    official: Path, cluster: LocalBrokerCluster, mode: str
) -> None:
    messages = [
        {
            "topic": "orders",
            "body": f"{mode} order {i} ✓",
            "tag": f"Tag{i % 2}",
            "keys": [f"{mode}-k{i}", f"{mode}-other{i}"],
            "properties": {"region": "eu", "n": str(i)},
        }
        for i in range(12)
    ]
    out = send(official, cluster.grpc_endpoints, messages, mode)
    receipts = out["receipts"]
    assert all("error" not in r for r in receipts), receipts
    ids = [r["message_id"] for r in receipts]
    assert len(set(ids)) == len(ids)
    for spec, r in zip(messages, receipts, strict=True):
        m = read_back(cluster, "orders", r["message_id"])
        assert m["body"] == spec["body"] and m["tags"] == spec["tag"]
        assert sorted(m["keys"]) == sorted(spec["keys"])
        assert m["properties"] == spec["properties"]
        assert m["queue_offset"] == r["offset"]
        # a user key finds it too
        assert (
            by_key(cluster, cluster.ids[0], "orders", spec["keys"][0])[0]["msg_id"] == m["msg_id"]
        )


def test_fifo_messages_of_one_group_share_a_queue_in_send_order(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    groups = ["order-1", "order-2", "order-3"]
    messages = [
        {"topic": "fifo", "body": f"{g} step {i}", "group": g} for i in range(6) for g in groups
    ]
    receipts = send(official, cluster.grpc_endpoints, messages)["receipts"]
    assert all("error" not in r for r in receipts), receipts
    placed: dict[str, list[tuple[int, int, str]]] = {g: [] for g in groups}
    for spec, r in zip(messages, receipts, strict=True):
        m = read_back(cluster, "fifo", r["message_id"])
        assert m["body"] == spec["body"]
        assert m["properties"] == {"__SHARDINGKEY": spec["group"]}
        placed[spec["group"]].append((m["queue_id"], m["queue_offset"], m["body"]))
    for g, rows in placed.items():
        assert len({q for q, _, _ in rows}) == 1, f"{g} spread over queues: {rows}"
        assert [o for _, o, _ in rows] == sorted(o for _, o, _ in rows), rows
        assert [b for _, _, b in rows] == [f"{g} step {i}" for i in range(6)]


def test_a_delay_message_is_invisible_before_its_time(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    deliver_s = int(time.time()) + 4
    out = send(
        official,
        cluster.grpc_endpoints,
        [{"topic": "later", "body": "wake", "delivery_s": deliver_s}],
    )
    (r,) = out["receipts"]
    assert "error" not in r and r["recall_handle"], r
    if time.time() < deliver_s - 0.5:  # (a slow machine may have passed the time already)
        assert by_key(cluster, cluster.ids[0], "later", r["message_id"]) == []
    m = wait_until(
        lambda: by_key(cluster, cluster.ids[0], "later", r["message_id"]), 30, "delivery"
    )[0]
    assert m["body"] == "wake" and m["store_timestamp"] >= deliver_s * 1000
    read_back(cluster, "later", r["message_id"])


def test_a_client_that_reaches_only_a_follower_sends_through_it(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.master()
    follower = next(n for n in cluster.ids if n != master)
    messages = [{"topic": "fromslave", "body": f"via follower {i}"} for i in range(5)]
    receipts = send(official, cluster.grpc_addrs[follower], messages)["receipts"]
    assert all("error" not in r for r in receipts), receipts
    for spec, r in zip(messages, receipts, strict=True):
        assert read_back(cluster, "fromslave", r["message_id"])["body"] == spec["body"]


def test_official_producer_throughput_is_reported(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    """Not a benchmark (nothing asserted on speed): the figure lands in the test output."""
    n = 300
    for mode in ("sync", "async"):
        messages = [{"topic": "speed", "body": "x" * 100} for _ in range(n)]
        out = send(official, cluster.grpc_endpoints, messages, mode)
        assert all("error" not in r for r in out["receipts"])
        print(
            f"official Python producer, {mode}: {n / out['seconds']:.0f} messages/s",
            file=sys.stderr,
        )


def test_simple_consumer_receives_acks_and_changes_invisible_time_through_a_follower(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.master()
    assert master is not None
    follower = next(n for n in cluster.ids if n != master)
    # The group starts at the earliest message (RocketMQ's start is the latest, ours too
    # by default: a group made by its first receive sees what comes after it).
    r = httpx.put(f"{cluster.urls[master]}/v1/groups/workers", json={"start": "earliest"})
    assert r.status_code == 200, r.text
    messages = [
        {
            "topic": "work",
            "body": "job 1",
            "tag": "TagA",
            "keys": ["job-1"],
            "properties": {"p": "1"},
        },
        {"topic": "work", "body": "job 2"},
        {"topic": "work", "body": "job 3", "group": "jobs"},
        {"topic": "work", "body": "job 4"},
    ]
    receipts = send(official, cluster.grpc_endpoints, messages)["receipts"]
    assert all("error" not in r for r in receipts), receipts
    report = run_script(
        official,
        "simple_consumer.py",
        {
            "endpoints": cluster.grpc_addrs[follower],  # every call forwarded to the master
            "group": "workers",
            "topic": "work",
            "expect": len(messages),
            "invisible_s": 20,
            "await_s": 2,
        },
    )
    got = {m["message_id"]: m for m in report["received"]}
    assert set(got) == {r["message_id"] for r in receipts}
    for spec, r in zip(messages, receipts, strict=True):
        m = got[r["message_id"]]
        assert m["body"] == spec["body"] and m["tag"] == spec.get("tag")
        assert m["keys"] == spec.get("keys", []) and m["properties"] == spec.get("properties", {})
        assert m["message_group"] == spec.get("group") and m["topic"] == "work"
        assert m["delivery_attempt"] == 1 and not m["corrupted"]  # the MD5 digest holds
    assert report["handle_replaced"]
    assert report["old_handle_ack"].startswith("refused") and "40013" in report["old_handle_ack"]
    (again,) = report["again"]
    assert again["message_id"] == report["received"][0]["message_id"]
    assert again["delivery_attempt"] == 2
    assert report["left"] == []
    lag = httpx.get(f"{cluster.urls[master]}/v1/groups/workers/offsets", params={"topic": "work"})
    assert sum(q["lag"] for q in lag.json()["offsets"]) == 0, lag.text


# ---- bad input, from a raw stub ---------------------------------------------------------------


@pytest.fixture
def stub(cluster: LocalBrokerCluster) -> Iterator[Any]:
    follower = next(n for n in cluster.ids if n != cluster.master())
    with grpc.insecure_channel(cluster.grpc_addrs[follower]) as ch:
        yield service_pb2_grpc.MessagingServiceStub(ch)


CLIENT = [("x-mq-client-id", "test@1@0@abc")]


def one(topic: str, body: bytes = b"b", **sp: Any) -> spb.SendMessageRequest:
    sp = {"message_id": "0102TEST", "message_type": pb.NORMAL, **sp}
    props = sp.pop("props", {})
    return spb.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name=topic),
                body=body,
                user_properties=props,
                system_properties=pb.SystemProperties(**sp),
            )
        ]
    )


def max_offsets(c: LocalBrokerCluster, topic: str) -> list[int]:
    r = httpx.get(f"{c.urls[c.ids[0]]}/v1/topics/{topic}", timeout=5)
    return [q["max_offset"] for q in r.json()["queues"]]


def test_bad_input_gets_clear_status_codes_and_changes_nothing(
    cluster: LocalBrokerCluster, stub: Any
) -> None:
    before = max_offsets(cluster, "orders")

    def code(r: Any) -> int:
        return int(r.status.code)

    # no client id
    assert code(stub.SendMessage(one("orders"), timeout=5)) == pb.CLIENT_ID_REQUIRED
    assert (
        code(stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="orders")), timeout=5))
        == pb.CLIENT_ID_REQUIRED
    )
    # unknown topic: on the route (asked of the master by the follower) and on a send
    route = stub.QueryRoute(
        spb.QueryRouteRequest(topic=pb.Resource(name="nosuch")), metadata=CLIENT, timeout=5
    )
    assert code(route) == pb.TOPIC_NOT_FOUND and not route.message_queues
    sent = stub.SendMessage(one("nosuch"), metadata=CLIENT, timeout=5)
    assert code(sent) == pb.TOPIC_NOT_FOUND and [int(e.status.code) for e in sent.entries] == [
        pb.TOPIC_NOT_FOUND
    ]
    # a body over the limit (4 MiB: what Settings publish), and the malformed
    huge = stub.SendMessage(one("orders", b"x" * ((4 << 20) + 1)), metadata=CLIENT, timeout=10)
    assert code(huge) == pb.MESSAGE_BODY_TOO_LARGE
    assert (
        code(stub.SendMessage(one("orders", props={"UNIQ_KEY": "x"}), metadata=CLIENT, timeout=5))
        == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    )
    assert (
        code(stub.SendMessage(one("orders", props={"a\x01": "x"}), metadata=CLIENT, timeout=5))
        == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    )
    assert (
        code(stub.SendMessage(one("orders", message_id=""), metadata=CLIENT, timeout=5))
        == pb.ILLEGAL_MESSAGE_ID
    )
    assert (
        code(stub.SendMessage(one("orders", tag="a|b"), metadata=CLIENT, timeout=5))
        == pb.ILLEGAL_MESSAGE_TAG
    )
    assert (
        code(stub.SendMessage(one("orders", body=b""), metadata=CLIENT, timeout=5))
        == pb.MESSAGE_BODY_EMPTY
    )
    # consumers: no client id, a SQL filter, a handle that names nothing
    rq = spb.ReceiveMessageRequest(
        group=pb.Resource(name="g"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="orders")),
        filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 1"),
        batch_size=1,
    )
    assert [
        int(r.status.code) for r in stub.ReceiveMessage(rq, timeout=5) if r.HasField("status")
    ] == [pb.CLIENT_ID_REQUIRED]
    assert [
        int(r.status.code)
        for r in stub.ReceiveMessage(rq, metadata=CLIENT, timeout=5)
        if r.HasField("status")
    ] == [pb.ILLEGAL_FILTER_EXPRESSION]
    bogus = spb.AckMessageRequest(
        group=pb.Resource(name="g"),
        topic=pb.Resource(name="orders"),
        entries=[spb.AckMessageEntry(message_id="x", receipt_handle="v1:0:0:1")],
    )
    assert code(stub.AckMessage(bogus, metadata=CLIENT, timeout=5)) == pb.INVALID_RECEIPT_HANDLE
    # an RPC not served (yet): gRPC UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as e:
        stub.GetOffset(spb.GetOffsetRequest(), metadata=CLIENT, timeout=5)
    assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert max_offsets(cluster, "orders") == before


def test_route_echoes_the_access_point_with_queue_zero_on_broker_zero(
    cluster: LocalBrokerCluster, stub: Any
) -> None:
    access = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="10.1.2.3", port=8081)])
    r = stub.QueryRoute(
        spb.QueryRouteRequest(
            topic=pb.Resource(name="orders", resource_namespace="ns"), endpoints=access
        ),
        metadata=CLIENT,
        timeout=5,
    )
    assert r.status.code == pb.OK
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]
    for q in r.message_queues:
        assert q.broker.id == 0 and q.broker.name == cluster.group and q.broker.endpoints == access
        assert q.permission == pb.READ_WRITE and q.topic.resource_namespace == "ns"
        assert set(q.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
    hb = stub.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER), metadata=CLIENT, timeout=5)
    assert hb.status.code == pb.OK
    bye = stub.NotifyClientTermination(
        spb.NotifyClientTerminationRequest(), metadata=CLIENT, timeout=5
    )
    assert bye.status.code == pb.OK


def test_telemetry_answers_settings_with_the_servers_values(
    cluster: LocalBrokerCluster, stub: Any
) -> None:
    settings = pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="orders")])
    )
    replies = stub.Telemetry(
        iter([spb.TelemetryCommand(settings=settings)]), metadata=CLIENT, timeout=5
    )
    (reply,) = list(replies)
    assert reply.status.code == pb.OK
    assert reply.settings.publishing.max_body_size == 4 << 20
    assert reply.settings.backoff_policy.HasField("exponential_backoff")
    nameless = stub.Telemetry(iter([spb.TelemetryCommand(settings=settings)]), timeout=5)
    assert [r.status.code for r in nameless] == [pb.CLIENT_ID_REQUIRED]


def test_a_send_through_a_follower_is_held_through_the_masters_death(tmp_path: Path) -> None:
    """kill -9 of the master, then at once a send to a follower with a 15 s deadline: the
    follower holds it through the election and forwards it to the new master (clients
    never re-route: an early refusal would only come back to the same node)."""
    c = start_cluster(tmp_path / "c", (*CLUSTER_ARGS, "--no-auto-create-topics"))
    try:
        master = c.wait_ready()
        r = httpx.post(f"{c.urls[master]}/v1/topics", json={"name": "held", "queues": 2})
        assert r.status_code == 201, r.text
        follower = next(n for n in c.ids if n != master)
        wait_until(lambda: by_key_topic(c, follower, "held"), 10, "the topic on the follower")
        c.kill(master)
        with grpc.insecure_channel(c.grpc_addrs[follower]) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            sent = stub.SendMessage(
                one("held", b"through the election"), metadata=CLIENT, timeout=15
            )
        assert sent.status.code == pb.OK, sent
        new_master = c.wait_ready()
        assert new_master != master
        (m,) = wait_until(lambda: by_key(c, new_master, "held", "0102TEST"), 10, "the message")
        assert m["body"] == "through the election"
    finally:
        c.stop_all()


def by_key_topic(c: LocalBrokerCluster, node: str, topic: str) -> bool:
    return httpx.get(f"{c.urls[node]}/v1/topics/{topic}", timeout=5).status_code == 200
