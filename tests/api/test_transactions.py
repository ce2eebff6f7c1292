"""Transactional messages over HTTP on one in-process node (docs/http.md, "Transactions"):
half messages visible to nobody, a commit delivers them once, a rollback never, checks
reach the producer group's pollers and expire into a rollback, bad input changes
nothing."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from broker.gate import BrokerRole
from broker.metadata import HALF_TOPIC
from broker.produce import LoopAnswerSlot
from ledgermq.client import AsyncTransactionProducer, TransactionCheck, TransactionResolvedError
from ledgermq.client.transacting import Resolution
from tests.api.conftest import Node, node_settings, running_node
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _begin(
    node: Node, topic: str, bodies: list[str], group: str = "pg", **extra: Any
) -> dict[str, Any]:
    r = await node.http.post(
        f"/v1/topics/{topic}/messages",
        json={
            "messages": [{"body": b, **extra} for b in bodies],
            "transaction": {"producer_group": group},
        },
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = orjson.loads(r.content)
    return answer


async def _end(node: Node, tx: str, action: str) -> tuple[int, dict[str, Any]]:
    r = await node.http.post(f"/v1/transactions/{tx}", json={"action": action})
    return r.status_code, orjson.loads(r.content)


async def _bodies(node: Node, topic: str, queues: int = 1) -> list[str]:
    out = []
    for q in range(queues):
        r = await node.http.get(f"/v1/topics/{topic}/queues/{q}/messages?offset=0")
        assert r.status_code == 200, r.text
        out += [m["body"] for m in orjson.loads(r.content)["messages"]]
    return out


async def test_a_committed_transaction_is_delivered_once_a_rolled_back_one_never(
    node: Node,
) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    yes = await _begin(node, "t", ["a", "b"], tags="T", properties={"p": "1"})
    no = await _begin(node, "t", ["x"])
    assert yes["transaction_id"] != no["transaction_id"]
    assert len(yes["results"]) == 2
    assert await _bodies(node, "t") == [], "half messages are visible to nobody"
    assert await _end(node, yes["transaction_id"], "commit") == (
        200,
        {"transaction_id": yes["transaction_id"], "state": "committed"},
    )
    assert (await _end(node, no["transaction_id"], "rollback"))[0] == 200
    assert await _bodies(node, "t") == ["a", "b"]
    # Repeats answer the same and copy nothing again; the other resolution is refused.
    assert (await _end(node, yes["transaction_id"], "commit"))[0] == 200
    assert (await _end(node, no["transaction_id"], "rollback"))[0] == 200
    status, body = await _end(node, yes["transaction_id"], "rollback")
    assert status == 409 and body["error"]["code"] == "TRANSACTION_RESOLVED"
    status, body = await _end(node, no["transaction_id"], "commit")
    assert status == 409 and body["error"]["state"] == "rolled_back"
    assert await _bodies(node, "t") == ["a", "b"]
    r = await node.http.get("/v1/topics/t/queues/0/messages?offset=0")
    first = orjson.loads(r.content)["messages"][0]
    assert first["tags"] == "T" and first["properties"]["p"] == "1"
    assert first["properties"]["TX_ORIGIN"].endswith(":0")
    assert "TX_PRODUCER_GROUP" not in first["properties"]
    stats = node.broker.meta.transactions.stats
    assert (stats["begun"], stats["committed"], stats["rolled_back"], stats["copied"]) == (
        2,
        1,
        1,
        2,
    )
    assert node.broker.meta.transactions.live == {}
    text = (await node.http.get("/metrics")).text
    assert "ledgermq_transactions_pending 0.0" in text
    assert 'ledgermq_transactions_total{event="begun"} 2.0' in text
    assert 'ledgermq_transactions_total{event="copied"} 2.0' in text
    assert 'ledgermq_transactions_total{event="rolled_back"} 1.0' in text


async def test_bad_transaction_input_changes_nothing(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    tx = (await _begin(node, "t", ["a"]))["transaction_id"]
    before = node.log_state()
    for bad in ("tx1:999", "nope", "tx1:"):
        status, body = await _end(node, bad, "commit")
        assert status == 404 and body["error"]["code"] == "TRANSACTION_NOT_FOUND", bad
    status, _ = await _end(node, tx, "maybe")
    assert status == 422
    r = await node.http.post(
        "/v1/topics/t/messages",
        json={"messages": [{"body": "a", "delay_ms": 5}], "transaction": {"producer_group": "pg"}},
    )
    assert r.status_code == 422, "a transaction's messages have no delivery time"
    r = await node.http.post(
        "/v1/topics/t/messages",
        json={"messages": [{"body": "a"}], "transaction": {"producer_group": "bad group"}},
    )
    assert r.status_code == 422, r.text
    r = await node.http.get("/v1/transactions/checks", params={"producer_group": "a b"})
    assert r.status_code == 422, r.text
    r = await node.http.get("/v1/transactions/checks", params={"producer_group": "nobody"})
    assert r.status_code == 200 and orjson.loads(r.content) == {"checks": []}
    assert node.log_state() == before
    r = await node.http.get("/v1/topics")
    assert HALF_TOPIC not in [t["name"] for t in orjson.loads(r.content)["topics"]]
    r = await node.http.get("/v1/transactions")
    [pending] = orjson.loads(r.content)["transactions"]
    assert pending["transaction_id"] == tx and pending["messages"] == 1


async def test_checks_reach_the_group_and_an_unanswered_transaction_expires(
    tmp_path: Path,
) -> None:
    settings = node_settings(
        tmp_path / "n0", tx_first_check_ms=200, tx_check_interval_ms=200, tx_max_checks=2
    )
    async with running_node(settings) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        answered = (await _begin(node, "t", ["kept"]))["transaction_id"]
        ignored = (await _begin(node, "t", ["lost"], group="other"))["transaction_id"]
        r = await node.http.get(
            "/v1/transactions/checks", params={"producer_group": "pg", "wait_ms": 5000}
        )
        assert r.status_code == 200, r.text
        [check] = orjson.loads(r.content)["checks"]
        assert check["transaction_id"] == answered and check["check_count"] == 1
        assert [m["body"] for m in check["messages"]] == ["kept"]
        assert check["messages"][0]["topic"] == "t"
        assert (await _end(node, answered, "commit"))[0] == 200
        # Nobody answers "other": two checks, then it is rolled back.
        txs = node.broker.meta.transactions
        await until(lambda: txs.stats["expired"] == 1, what="the unanswered one expires")
        assert txs.state_of(int(ignored.removeprefix("tx1:"))) == "rolled_back"
        assert txs.stats["checks"] >= 3
        assert await _bodies(node, "t") == ["kept"]


async def test_a_commit_whose_copies_a_master_did_not_write_is_completed(
    tmp_path: Path,
) -> None:
    """A master that died after the commit's entry and before its copies: the commit is
    replicated, and the next master's loop copies what is missing (here: the commit is
    appended by hand and the node restarted, standing for the failover)."""
    settings = node_settings(tmp_path / "n0")
    async with running_node(settings) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 4})
        tx = (await _begin(node, "t", ["a", "b", "c"], queue_id=2))["transaction_id"]
        base = int(tx.removeprefix("tx1:"))
        node.broker.transactions._delivering[base] = LoopAnswerSlot()  # (never ends: no copy)
        await node.broker.metalog.append({"op": "tx.commit", "base": base})
        assert await _bodies(node, "t", 4) == []
    async with running_node(settings) as node:
        await until(lambda: node.broker.meta.transactions.live == {}, what="copied")
        r = await node.http.get("/v1/topics/t/queues/2/messages?offset=0")
        assert [m["body"] for m in orjson.loads(r.content)["messages"]] == ["a", "b", "c"]
        assert node.broker.meta.transactions.stats["copied"] == 3


async def test_the_client_commits_a_block_rolls_back_on_an_error_and_answers_checks(
    tmp_path: Path,
) -> None:
    settings = node_settings(tmp_path / "n0", tx_first_check_ms=100, tx_check_interval_ms=100)
    async with running_node(settings) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        transport = httpx.ASGITransport(app=node.app)
        async with AsyncTransactionProducer("http://node", "pg", transport=transport) as p:
            async with p.transaction() as tx:
                [r] = await tx.send("t", ["committed"])
                assert r.queue_id == 0  # (where the half message lies)
            with pytest.raises(RuntimeError):
                async with p.transaction() as tx:
                    await tx.send("t", ["rolled back"])
                    raise RuntimeError("the local transaction failed")
            asked = await p.begin("t", ["asked"])
            seen: list[TransactionCheck] = []

            def checker(c: TransactionCheck) -> Resolution | None:
                seen.append(c)
                return "commit" if c.messages[0].body == b"asked" else None

            assert await p.answer_checks(checker, wait_ms=5000) == 1
            assert [c.transaction_id for c in seen] == [asked.transaction_id]
            with pytest.raises(TransactionResolvedError):
                await p.rollback(asked.transaction_id)
        assert await _bodies(node, "t") == ["committed", "asked"]


async def test_metrics_show_pending_transactions_and_delay_messages(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await _begin(node, "t", ["a"])
    r = await node.http.post(
        "/v1/topics/t/messages", json={"messages": [{"body": "later", "delay_ms": 60_000}]}
    )
    assert r.status_code == 200, r.text
    text = (await node.http.get("/metrics")).text
    assert "ledgermq_transactions_pending 1.0" in text
    assert 'ledgermq_transactions_total{event="begun"} 1.0' in text
    assert "ledgermq_delay_pending 1.0" in text
    assert 'ledgermq_delay_messages_total{event="scheduled"} 1.0' in text


async def test_a_resolution_not_applied_in_time_is_an_unknown_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose entry is committed but not applied within ``append_timeout_ms``
    (here dispatch stalls on a disk error right after it) answers 503 UNKNOWN_OUTCOME,
    which a client retries, and not 409 TRANSACTION_RESOLVED ``state: pending``, which
    it takes for a refusal; once dispatch goes on, the retry answers the commit."""
    async with running_node(node_settings(tmp_path / "n0", append_timeout_ms=300)) as node:
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        tx = (await _begin(node, "t", ["a"]))["transaction_id"]
        dispatcher, server = node.broker.dispatcher, node.broker.server
        assert dispatcher is not None

        def stalled(_most: int) -> int:  # from the next committed entry on: the commit's
            if server.committed_index > dispatcher.dispatched_index:
                raise OSError(errno.EIO, "injected: the disk fails")
            return 0

        monkeypatch.setattr(dispatcher, "dispatch_some", stalled)
        try:
            status, body = await _end(node, tx, "commit")
        finally:
            monkeypatch.undo()
        assert (status, body["error"]["code"]) == (503, "UNKNOWN_OUTCOME"), body
        txs = node.broker.meta.transactions
        await until(lambda: txs.state_of(int(tx.removeprefix("tx1:"))) == "committed")
        assert await _end(node, tx, "commit") == (200, {"transaction_id": tx, "state": "committed"})
        assert await _bodies(node, "t") == ["a"]


async def test_a_commit_right_after_its_begin_finds_it_while_the_dispatcher_lags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transactional produce is answered once committed, and waits for dispatch only a
    while: a commit right after it, on a master whose dispatcher lagged (a new master
    still applying the terms before its own, say), answered 404 TRANSACTION_NOT_FOUND
    for a transaction it had acknowledged. It waits until what is committed is applied
    now (and a slave sends it to the master), as a recall of a delay message does."""
    async with running_node(node_settings(tmp_path / "n0", append_timeout_ms=300)) as node:
        b = node.broker
        await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
        await _begin(node, "t", ["first"])  # (the half topic)

        async def idle(force: bool = False) -> None:
            await asyncio.sleep(0.01)

        with monkeypatch.context() as m:  # a dispatcher behind (its loop idles meanwhile)
            m.setattr(b.dispatcher, "dispatch_some", lambda _max: 0)
            m.setattr(b.dispatcher, "housekeep", idle)
            r = await node.http.post(
                "/v1/topics/t/messages",
                json={"messages": [{"body": "lagged"}], "transaction": {"producer_group": "pg"}},
            )
        assert r.status_code == 200, r.text
        tx = orjson.loads(r.content)["transaction_id"]
        assert b.meta.transactions.end == 1, "committed, answered, not applied yet"
        assert await _end(node, tx, "commit") == (200, {"transaction_id": tx, "state": "committed"})
        assert await _bodies(node, "t") == ["lagged"]


async def test_a_live_transaction_holds_retention_and_snapshots_back(node: Node) -> None:
    """The first live transaction's record is the pin: retention keeps it, and a snapshot
    taken after it is not handed to Raft (a follower that installed it could not read the
    half messages a check hands out and a commit copies; found by the broker simulation,
    whose checks handed out no messages once a master's retention passed them). Once it
    is resolved, the newest snapshot goes to Raft again."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    begun = await _begin(node, "t", ["held"])
    pinned = b.transactions.pinned_entry_pos()
    assert pinned is not None and pinned == begun["results"][0]["commitlog_offset"] - 48
    await node.http.post("/v1/topics/t/messages", json={"messages": [{"body": "more"}]})
    await b.dispatcher.snapshot()  # a snapshot past the pin: kept on disk, not served
    snaps = b.dispatcher.snapshot_manager
    assert snaps.snapshot_index > snaps.served_index and snaps.unserved
    assert b.store._retention_floor is not None and b.store._retention_floor <= pinned
    assert (await _end(node, begun["transaction_id"], "commit"))[0] == 200
    assert b.transactions.pinned_entry_pos() is None
    await b.dispatcher.snapshot()
    assert snaps.served_index == snaps.snapshot_index == b.meta.applied_index


async def test_a_slave_sends_an_end_it_does_not_know_yet_to_the_master(node: Node) -> None:
    """A slave that has not applied a transaction's record yet answers a commit of it
    with its refusal (the client goes to the master), not 404 TRANSACTION_NOT_FOUND: the
    route asked for the transaction's topic before anything else (found by the broker
    simulation: an acknowledged transaction's rollback, sent to a lagging slave, was
    "not found")."""
    b = node.broker
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    begun = await _begin(node, "t", ["a"])
    b.gate.set_role(BrokerRole.SLAVE, b.gate.role_term, "a test: deposed")
    status, body = await _end(node, "tx1:7", "commit")  # (not applied here: not yet)
    assert status != 404 and body["error"]["code"] != "TRANSACTION_NOT_FOUND", body
    b.gate.set_role(BrokerRole.MASTER, b.gate.role_term, "a test: master again")
    assert (await _end(node, "tx1:7", "commit"))[0] == 404  # the master does not know it
    assert (await _end(node, begun["transaction_id"], "commit"))[0] == 200


async def test_a_queue_the_topic_lacks_is_refused_or_its_transaction_dropped(node: Node) -> None:
    """A transactional produce pinned to a queue its topic lacks is refused, as any
    produce is; a commit whose topic was made again with fewer queues since drops what
    is left, counted, instead of being refused on every try (and, unfinished, holding
    retention back for ever). Found by reading, after the broker simulation's pin."""
    await node.http.post("/v1/topics", json={"name": "t", "queues": 4})
    r = await node.http.post(
        "/v1/topics/t/messages",
        json={"messages": [{"body": "x", "queue_id": 9}], "transaction": {"producer_group": "pg"}},
    )
    assert r.status_code == 422 and "queue_id 9" in r.text
    assert node.broker.meta.transactions.stats["begun"] == 0
    begun = await _begin(node, "t", ["pinned"], queue_id=3)
    assert (await node.http.delete("/v1/topics/t")).status_code in (200, 204)
    await node.http.post("/v1/topics", json={"name": "t", "queues": 2})
    assert (await _end(node, begun["transaction_id"], "commit"))[0] == 200
    txs = node.broker.meta.transactions
    await until(lambda: txs.stats["dropped"] == 1, what="the transaction's message dropped")
    assert node.broker.transactions.pinned_entry_pos() is None
    assert await _bodies(node, "t", queues=2) == []
