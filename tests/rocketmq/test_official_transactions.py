"""RocketMQ 5's official Python client against a 3-process LedgerMQ cluster: transactions
(commit, rollback, and a transaction resolved by the server's check on the producer's
Telemetry stream), a message id resent (to the master, then to a follower) stored once,
and the recall of a delay message. The checks are due after 1 s here (RocketMQ's 6 s by
default) so that the test does not wait long."""

from __future__ import annotations

import contextlib
import threading
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
from .scenarios import CHECKER, TRANSACTIONS, assert_each_acknowledged_send_stored_once, stored
from .test_official_client import CLIENT, by_key, one, read_back, send

pytestmark = pytest.mark.slow

TOPICS = {"tx": 2, "again": 2, "recall": 2}
TX_ARGS = ("--tx-first-check-ms", "1000", "--tx-check-interval-ms", "2000")


@pytest.fixture(scope="module")
def official() -> Path:
    return official_python()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    with cluster_with_topics(tmp_path_factory.mktemp("rocketmq-tx"), TOPICS, *TX_ARGS) as c:
        yield c


def master_url(c: LocalBrokerCluster) -> str:
    return c.urls[c.wait_ready()]


def test_transactions_commit_roll_back_and_are_resolved_by_the_servers_check(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    out = run_script(
        official,
        "transactional.py",
        {
            "endpoints": cluster.grpc_endpoints,
            "http": master_url(cluster),
            "topic": "tx",
            "transactions": TRANSACTIONS,
            "checker": CHECKER,
            "wait_checks_s": 60,
        },
    )
    sent = out["sent"]
    assert all("error" not in s for s in sent), sent
    assert all(s["transaction_id"] for s in sent) and len({s["message_id"] for s in sent}) == 4
    ids = {spec["body"]: s["message_id"] for spec, s in zip(TRANSACTIONS, sent, strict=True)}
    # the checks reached the producer with the half message: its topic, id and body
    checked = {c["body"]: c for c in out["checked"]}
    assert set(checked) == {"checked: commit", "checked: roll back"}, out["checked"]
    for body, c in checked.items():
        assert c["message_id"] == ids[body] and c["topic"] == "tx", c
    # committed (by the client, by a check): in the topic once, under the client's id
    for body in ("committed", "checked: commit"):
        assert read_back(cluster, "tx", ids[body])["body"] == body
    r = httpx.get(f"{master_url(cluster)}/v1/transactions", params={"producer_group": "tx"})
    assert r.status_code == 200 and r.json()["transactions"] == [], r.text
    # rolled back (by the client, by a check): never in the topic
    stored = [m["body"] for m in messages_of(cluster, "tx")]
    assert sorted(stored) == ["checked: commit", "committed"], stored


def messages_of(c: LocalBrokerCluster, topic: str) -> list[dict[str, Any]]:
    out = []
    for q in range(TOPICS[topic]):
        r = httpx.get(
            f"{c.urls[c.ids[0]]}/v1/topics/{topic}/queues/{q}/messages",
            params={"offset": 0, "max_messages": 100},
            timeout=5,
        )
        assert r.status_code == 200, r.text
        out.extend(r.json()["messages"])
    return out


def test_a_message_id_resent_to_another_node_is_stored_once(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    master = cluster.wait_ready()
    follower = next(n for n in cluster.ids if n != master)
    message_id = "01AABBCCDDEEFF000100000000DEDUPE1"
    spec = {"topic": "again", "body": "only once", "message_id": message_id}
    first = send(official, cluster.grpc_addrs[master], [spec])["receipts"]
    # the same id again, through a follower (the client's retry after a timeout, say)
    again = send(official, cluster.grpc_addrs[follower], [spec, spec])["receipts"]
    assert all("error" not in r for r in [*first, *again]), (first, again)
    assert {r["message_id"] for r in [*first, *again]} == {message_id}
    assert {r["offset"] for r in [*first, *again]} == {first[0]["offset"]}
    m = read_back(cluster, "again", message_id)  # one message on every node
    assert m["body"] == "only once" and m["queue_offset"] == first[0]["offset"]
    assert len(messages_of(cluster, "again")) == 1
    # a raw resend with the same id and another body: the first send's answer
    with grpc.insecure_channel(cluster.grpc_addrs[follower]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        r = stub.SendMessage(
            one("again", b"other", message_id=message_id), metadata=CLIENT, timeout=10
        )
    assert r.status.code == pb.OK and r.entries[0].offset == first[0]["offset"], r
    assert len(messages_of(cluster, "again")) == 1


def test_a_delay_message_is_recalled_before_its_time(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    deliver_s = int(time.time()) + 600
    first = send(
        official,
        cluster.grpc_endpoints,
        [{"topic": "recall", "body": "never", "delivery_s": deliver_s}],
    )["receipts"]
    (r,) = first
    assert "error" not in r and r["recall_handle"], r
    master = cluster.wait_ready()
    follower = next(n for n in cluster.ids if n != master)
    # recalled through a follower (forwarded to the master), then again: refused
    out = run_script(
        official,
        "producer.py",
        {
            "endpoints": cluster.grpc_addrs[follower],
            "topics": ["recall"],
            "messages": [],
            "recall": [r["recall_handle"], r["recall_handle"], "t1:999999"],
        },
    )
    recalled = out["recalled"]
    # the message's id; a repeat answers the same; a handle that names nothing: an error
    assert recalled[:2] == [r["message_id"], r["message_id"]], recalled
    assert isinstance(recalled[2], dict) and "error" in recalled[2], recalled
    assert by_key(cluster, master, "recall", r["message_id"]) == []
    # a raw RecallMessage: a handle that names nothing, none at all
    with grpc.insecure_channel(cluster.grpc_addrs[follower]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        bad = stub.RecallMessage(
            spb.RecallMessageRequest(topic=pb.Resource(name="recall"), recall_handle="nope"),
            metadata=CLIENT,
            timeout=10,
        )
        none = stub.RecallMessage(
            spb.RecallMessageRequest(topic=pb.Resource(name="recall")), metadata=CLIENT, timeout=5
        )
    assert bad.status.code == pb.NOT_FOUND and none.status.code == pb.BAD_REQUEST


class TelemetryStream:
    """A producer's Telemetry stream to one node, held open (as the clients hold theirs),
    its server commands collected by a thread."""

    def __init__(self, addr: str, client_id: str, topic: str) -> None:
        self.channel = grpc.insecure_channel(addr)
        stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.done = threading.Event()
        self.received: list[spb.TelemetryCommand] = []
        settings = pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)])
        )

        def commands() -> Iterator[spb.TelemetryCommand]:
            yield spb.TelemetryCommand(settings=settings)
            self.done.wait(120)  # bounded: the test ends it

        self.call = stub.Telemetry(
            commands(), metadata=[("x-mq-client-id", client_id)], timeout=120
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for command in self.call:
                self.received.append(command)

    def checks(self) -> list[spb.RecoverOrphanedTransactionCommand]:
        return [
            c.recover_orphaned_transaction_command
            for c in list(self.received)
            if c.HasField("recover_orphaned_transaction_command")
        ]

    def close(self) -> None:
        self.done.set()
        self.call.cancel()
        self.channel.close()


def test_checks_reach_the_producers_streams_on_every_node_across_the_masters_death(
    tmp_path: Path,
) -> None:
    """A transaction stored through a follower, then kill -9 of the master: the new
    master's check schedule goes on, and each surviving node offers the check on the
    producer streams connected to it; the answer to a check, through either follower,
    commits it once."""
    c = start_cluster(tmp_path / "c", (*CLUSTER_ARGS, "--no-auto-create-topics", *TX_ARGS))
    streams: list[TelemetryStream] = []
    try:
        master = c.wait_ready()
        r = httpx.post(f"{c.urls[master]}/v1/topics", json={"name": "txf", "queues": 2})
        assert r.status_code == 201, r.text
        f1, f2 = (n for n in c.ids if n != master)
        streams = [
            TelemetryStream(c.grpc_addrs[n], f"producer@{n}", "txf") for n in (f1, f2, master)
        ]
        for s in streams:  # each stream's Settings were answered
            wait_until(lambda s=s: s.received, 10, "the settings reply")
        half = one("txf", b"half of it", message_id="01TXFAILOVER", message_type=pb.TRANSACTION)
        with grpc.insecure_channel(c.grpc_addrs[f1]) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            sent = stub.SendMessage(half, metadata=CLIENT, timeout=10)
        assert sent.status.code == pb.OK and sent.entries[0].transaction_id, sent
        tx_id = sent.entries[0].transaction_id
        c.kill(master)
        for s in streams[:2]:  # both followers offer it, whatever the election does
            (check, *_) = wait_until(s.checks, 60, "a check on a follower's stream")
            assert check.transaction_id == tx_id
            assert check.message.topic.name == "txf" and check.message.body == b"half of it"
            assert check.message.system_properties.message_id == "01TXFAILOVER"
            assert check.message.system_properties.message_type == pb.TRANSACTION
        end = spb.EndTransactionRequest(
            topic=pb.Resource(name="txf"),
            message_id="01TXFAILOVER",
            transaction_id=tx_id,
            resolution=pb.COMMIT,
            source=pb.SOURCE_SERVER_CHECK,
        )
        for n in (f2, f1):  # two answers to one check: one commit
            with grpc.insecure_channel(c.grpc_addrs[n]) as ch:
                stub = service_pb2_grpc.MessagingServiceStub(ch)
                ended = stub.EndTransaction(end, metadata=CLIENT, timeout=15)
            assert ended.status.code == pb.OK, ended
        new_master = c.wait_ready()
        (m,) = wait_until(lambda: by_key(c, new_master, "txf", "01TXFAILOVER"), 10, "the copy")
        assert m["body"] == "half of it"
        # the resend of the half message's id: the first answer, no second transaction
        with grpc.insecure_channel(c.grpc_addrs[f1]) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            again = stub.SendMessage(half, metadata=CLIENT, timeout=10)
        assert again.entries[0].transaction_id == tx_id, again
    finally:
        for s in streams:
            s.close()
        c.stop_all()


def deduplicated(c: LocalBrokerCluster, node: str) -> int:
    text = httpx.get(f"{c.urls[node]}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("ledgermq_produce_deduplicated_total"))
    return int(float(line.split()[-1]))


def test_kill_9_of_the_master_during_official_sends_stores_each_message_id_once(
    official: Path, tmp_path: Path
) -> None:
    """The official producer sends while the master is killed: its sends in flight fail
    or time out and are resent with the same message id, through another node; every id
    the client was told is stored is stored exactly once, and none twice."""
    c = start_cluster(tmp_path / "c", (*CLUSTER_ARGS, "--no-auto-create-topics"))
    try:
        master = c.wait_ready()
        r = httpx.post(f"{c.urls[master]}/v1/topics", json={"name": "busy", "queues": 2})
        assert r.status_code == 201, r.text
        follower = next(n for n in c.ids if n != master)
        wait_until(lambda: stored(c, follower, "busy") == 0, 10, "the topic on a follower")
        n = 400
        messages = [{"topic": "busy", "body": f"m{i}"} for i in range(n)]
        out: dict[str, Any] = {}
        # the master first among the endpoints: the client is connected to it when it dies
        endpoints = ";".join(c.grpc_addrs[x] for x in [master, *(y for y in c.ids if y != master)])

        def run() -> None:
            out.update(
                run_script(
                    official,
                    "producer.py",
                    {"endpoints": endpoints, "topics": ["busy"], "messages": messages},
                    timeout_s=300,
                )
            )

        sender = threading.Thread(target=run)
        sender.start()
        wait_until(lambda: stored(c, follower, "busy") >= n // 4, 60, "a quarter sent")
        c.kill(master)
        sender.join(300)
        assert not sender.is_alive() and out, "the producer did not finish"
        receipts = out["receipts"]
        ok = [r for r in receipts if "error" not in r]
        assert len(ok) >= n // 2, receipts  # most go through (the rest: errors, told so)
        new_master = c.wait_ready()
        total = assert_each_acknowledged_send_stored_once(c, new_master, "busy", messages, receipts)
        resent = sum(deduplicated(c, x) for x in c.ids if x != master)
        print(
            f"kill -9 during sends: {len(ok)}/{n} acknowledged, {total} stored, none twice;"
            f" {resent} resends answered from the send window by the survivors"
        )
    finally:
        c.stop_all()


def test_end_transaction_answers_clear_codes(cluster: LocalBrokerCluster) -> None:
    master = cluster.wait_ready()
    follower = next(n for n in cluster.ids if n != master)
    with grpc.insecure_channel(cluster.grpc_addrs[follower]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        half = one("tx", b"end me", message_id="01ENDCODES", message_type=pb.TRANSACTION)
        sent = stub.SendMessage(half, metadata=CLIENT, timeout=10)
        assert sent.status.code == pb.OK, sent
        tx_id = sent.entries[0].transaction_id

        def end(resolution: int, transaction_id: str = tx_id, **kw: Any) -> int:
            r = stub.EndTransaction(
                spb.EndTransactionRequest(
                    topic=pb.Resource(name="tx"),
                    message_id="01ENDCODES",
                    transaction_id=transaction_id,
                    resolution=resolution,  # type: ignore[arg-type]
                    source=pb.SOURCE_CLIENT,
                ),
                timeout=10,
                **kw,
            )
            return int(r.status.code)

        assert end(pb.COMMIT) == pb.CLIENT_ID_REQUIRED  # no x-mq-client-id
        assert end(pb.COMMIT, "", metadata=CLIENT) == pb.INVALID_TRANSACTION_ID
        assert end(pb.COMMIT, "tx1:999999", metadata=CLIENT) == pb.INVALID_TRANSACTION_ID
        assert end(pb.COMMIT, "nonsense", metadata=CLIENT) == pb.INVALID_TRANSACTION_ID
        # no resolution (a checker that could not tell): OK, and it stays pending
        assert end(pb.TRANSACTION_RESOLUTION_UNSPECIFIED, metadata=CLIENT) == pb.OK
        pending = httpx.get(
            f"{master_url(cluster)}/v1/transactions", params={"producer_group": "tx"}
        )
        assert tx_id in {t["transaction_id"] for t in pending.json()["transactions"]}
        assert end(pb.ROLLBACK, metadata=CLIENT) == pb.OK
        assert end(pb.ROLLBACK, metadata=CLIENT) == pb.OK  # a repeat answers the same
        assert end(pb.COMMIT, metadata=CLIENT) == pb.PRECONDITION_FAILED
    assert by_key(cluster, master, "tx", "01ENDCODES") == []
