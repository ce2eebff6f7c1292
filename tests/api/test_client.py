"""``ledgermq.client`` without a server: the protocol core driven by hand (sans-I/O:
scripted replies and a fake clock), and the drivers over httpx's ``MockTransport`` for
wire details. The real thing against three broker processes is
``tests/process/test_client.py``."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from broker.batch import inner_records
from broker.metadata import PRODUCER_ID
from ledgermq import client as mq
from ledgermq.client import AsyncAdmin, Message, Producer

# ---- the sans-I/O core, driven by hand ------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Answer = Callable[[mq.Request], mq.Outcome]


def drive(
    gen: mq.Gen[Any], answer: Answer, clock: FakeClock, actions: list[mq.Action] | None = None
) -> tuple[Any, list[mq.Action]]:
    """Run an operation: each Request gets ``answer(request)``, each Sleep moves the
    fake clock. Returns (result, every action in order); bounded."""
    actions = [] if actions is None else actions
    outcome: mq.Outcome | None = None
    for _ in range(1000):
        try:
            action = gen.send(outcome)
        except StopIteration as stop:
            return stop.value, actions
        actions.append(action)
        if isinstance(action, mq.Sleep):
            assert action.seconds >= 0
            clock.now += action.seconds
            outcome = None
        else:
            outcome = answer(action)
    raise AssertionError("the operation did not finish within 1000 actions")


def drive_raises(
    gen: mq.Gen[Any], answer: Answer, clock: FakeClock
) -> tuple[mq.LedgerMQError, list[mq.Action]]:
    actions: list[mq.Action] = []
    with pytest.raises(mq.LedgerMQError) as info:
        drive(gen, answer, clock, actions)
    return info.value, actions


def reply(status: int, body: Any = None, **headers: str) -> mq.Reply:
    return mq.Reply(status, {k.replace("_", "-").lower(): v for k, v in headers.items()}, body)


def error(status: int, code: str, **fields: Any) -> mq.Reply:
    headers = {"retry_after": "1"} if status == 503 else {}
    return reply(status, {"error": {"code": code, "message": code.lower(), **fields}}, **headers)


def cluster_body(node_id: str, role: str, leader_id: str | None, leader_url: str | None) -> Any:
    return {
        "node_id": node_id,
        "broker_role": role,
        "raft_role": "LEADER" if role == "MASTER" else "FOLLOWER",
        "leader_id": leader_id,
        "leader_url": leader_url,
    }


def exchange(brokers: str, clock: FakeClock, **options: Any) -> mq.Exchange:
    return mq.Exchange(brokers, mq.ClientSettings(**options), rng=random.Random(7), clock=clock)


A, B, M = "http://a:1", "http://b:2", "http://m:3"
WRITE = mq.Call("POST", "/v1/topics", body={"name": "t"}, write=True)
READ = mq.Call("GET", "/v1/topics")


@pytest.mark.parametrize("code", sorted(mq.ERROR_CLASSES))
def test_error_codes_map_to_typed_exceptions(code: str) -> None:
    e = mq.error_from_reply(error(409, code, leader_url="http://x:1", extra=5))
    assert type(e) is mq.ERROR_CLASSES[code]
    assert (e.code, e.status, e.message) == (code, 409, code.lower())
    assert e.fields == {"leader_url": "http://x:1", "extra": 5}
    assert isinstance(e, mq.LedgerMQError)


def test_unknown_codes_and_bodies_that_are_not_ours() -> None:
    e = mq.error_from_reply(error(418, "TEAPOT"))
    assert type(e) is mq.LedgerMQError and e.code == "TEAPOT"
    e = mq.error_from_reply(error(403, "FORBIDDEN"))
    assert type(e) is mq.ForbiddenError and isinstance(e, mq.LedgerMQError)
    e = mq.error_from_reply(mq.Reply(502, {}, None, "<html>bad gateway</html>"))
    assert e.code == "HTTP_502" and "bad gateway" in e.message


def test_backoff_is_exponential_capped_and_jittered() -> None:
    s = mq.ClientSettings(backoff_base_s=0.1, backoff_cap_s=1.0)
    rng = random.Random(1)
    for n, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (60, 1.0)]:
        draws = [mq.backoff_delay_s(n, s, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in draws), (n, draws)
        assert len(set(draws)) > 1  # jittered


def test_settings_are_checked() -> None:
    for bad in ({"deadline_s": 0}, {"max_attempts": 0}, {"backoff_base_s": 3.0}):
        with pytest.raises(ValueError):
            mq.ClientSettings(**bad)


def test_parse_brokers() -> None:
    assert mq.parse_brokers(" a:1, http://b:2/ ,a:1") == ["http://a:1", "http://b:2"]
    assert mq.parse_brokers(["https://c"]) == ["https://c"]
    for bad in ("", " , ", "ftp://x"):
        with pytest.raises(ValueError):
            mq.parse_brokers(bad)


def test_message_encoding() -> None:
    assert mq.encode_message("héllo") == {"body": "héllo", "encoding": "utf-8"}
    assert mq.encode_message(b"\xff\x00") == {"body": "/wA=", "encoding": "base64"}
    m = Message(b"x", key="k", keys=["a"], tags="T", properties={"p": "1"}, queue_id=2)
    assert mq.encode_message(m) == {
        "body": "eA==",
        "encoding": "base64",
        "key": "k",
        "keys": ["a"],
        "tags": "T",
        "properties": {"p": "1"},
        "queue_id": 2,
    }
    assert mq.encode_message({"body": "eA==", "encoding": "base64", "sharding_key": "o"}) == {
        "body": "eA==",
        "encoding": "base64",
        "sharding_key": "o",
    }
    assert mq.encode_message({"body": b"x", "tags": None}) == {"body": "eA==", "encoding": "base64"}
    for bad in ({"key": "no body"}, {"body": "x", "colour": "red"}):
        with pytest.raises(ValueError):
            mq.encode_message(bad)
    with pytest.raises(TypeError):
        mq.encode_message(42)  # type: ignore[arg-type]


def test_received_message_decoding() -> None:
    base = {"topic": "t", "queue_id": 1, "queue_offset": 5, "msg_id": "m"}
    assert mq.decode_message({**base, "body": "/wA=", "encoding": "base64"}).body == b"\xff\x00"
    m = mq.decode_message({**base, "body": "hé", "encoding": "utf-8", "keys": ["k"]})
    assert (m.body, m.text, m.keys) == ("hé".encode(), "hé", ("k",))


def test_producer_id_form_is_the_brokers() -> None:
    assert mq.PRODUCER_ID.pattern == PRODUCER_ID.pattern
    assert mq.PRODUCER_ID.fullmatch(mq.new_producer_id())
    with pytest.raises(ValueError):
        mq.ProducerOps(exchange(A, FakeClock()), "bad id!", 0)


def test_a_write_discovers_the_master_and_follows_not_master() -> None:
    clock = FakeClock()
    ex = exchange(f"{A},{B}", clock)

    def answer(req: mq.Request) -> mq.Outcome:
        if req.url == A + "/v1/cluster":  # a slave that knows the master: B
            return reply(200, cluster_body("a", "SLAVE", "b", B + "/"))
        if req.url.startswith(B):  # B lost it meanwhile: M is the master now
            return error(307, "NOT_MASTER", leader_id="m", leader_url=M)
        assert req.url == M + "/v1/topics" and req.method == "POST"
        return reply(201, {"name": "t", "queues": 8})

    result, actions = drive(ex.exchange(WRITE), answer, clock)
    assert result.status == 201
    assert [a.url for a in actions if isinstance(a, mq.Request)] == [
        A + "/v1/cluster",
        B + "/v1/topics",
        M + "/v1/topics",
    ]
    assert ex.master == M  # cached: the next write goes straight there
    _, actions = drive(ex.exchange(WRITE), answer, clock)
    assert [a.url for a in actions if isinstance(a, mq.Request)] == [M + "/v1/topics"]


def test_a_redirect_with_only_a_location_header() -> None:
    clock = FakeClock()
    ex = exchange(A, clock)
    ex.master = A

    def answer(req: mq.Request) -> mq.Outcome:
        if req.url.startswith(A):
            return reply(
                307, {"error": {"code": "NOT_MASTER", "message": "x"}}, location=M + "/v1/topics"
            )
        return reply(200, {})

    drive(ex.exchange(WRITE), answer, clock)
    assert ex.master == M


def test_no_master_backs_off_at_least_retry_after_until_the_deadline() -> None:
    clock = FakeClock()
    ex = exchange(f"{A},{B}", clock, deadline_s=10.0, backoff_base_s=0.05, backoff_cap_s=0.5)
    start = clock.now

    def answer(req: mq.Request) -> mq.Outcome:
        if req.url.endswith("/v1/cluster"):
            return reply(200, cluster_body("a", "SLAVE", "b", B))
        return error(503, "NO_MASTER")  # Retry-After: 1

    err, actions = drive_raises(ex.exchange(WRITE), answer, clock)
    assert isinstance(err, mq.NoMasterError)
    sleeps = [a.seconds for a in actions if isinstance(a, mq.Sleep)]
    assert sleeps and all(s >= 1.0 for s in sleeps)  # the server's hint wins over 0.5 s
    assert clock.now - start <= 10.0  # never sleeps past the deadline
    assert len(sleeps) >= 5
    # Every round rediscovers the master (it may have moved).
    posts = [a for a in actions if isinstance(a, mq.Request) and a.method == "POST"]
    assert len(sleeps) <= len(posts) <= len(sleeps) + 1


def test_unknown_outcome_is_retried_with_the_same_session_and_busy_too() -> None:
    clock = FakeClock()
    ex = exchange(A, clock)
    ex.master = A
    ops = mq.ProducerOps(ex, "p-1", 41)
    answers = iter(
        [
            error(503, "UNKNOWN_OUTCOME"),
            reply(200, cluster_body("a", "MASTER", "a", A)),  # rediscovery
            error(429, "BUSY", retry_after_ms=250),
            reply(200, {"results": [{"msg_id": "x", "queue_id": 3, "queue_offset": 9}]}),
        ]
    )
    result, actions = drive(ops.send("t", ["hello"]), lambda _r: next(answers), clock)
    assert result == [mq.SendResult("x", 3, 9)]
    posts = [a for a in actions if isinstance(a, mq.Request) and a.method == "POST"]
    assert len(posts) == 3
    assert all(p.content == posts[0].content for p in posts)  # byte-for-byte the same batch
    assert all(p.params == posts[0].params for p in posts)
    assert posts[0].content_type == "application/vnd.ledgermq.batch"  # the record format
    assert posts[0].params is not None
    assert (posts[0].params["producer_id"], posts[0].params["sequence"]) == ("p-1", 41)
    assert [a.seconds for a in actions if isinstance(a, mq.Sleep)][-1] >= 0.25
    assert ops.sequence == 42  # the next batch


def test_a_full_disk_is_retried_on_the_same_master_until_space_returns() -> None:
    """507 DISK_FULL (issue 17): the master recovers by itself, so a producer waits as
    Retry-After says, at the same master, within its deadline; then gives up typed."""
    clock = FakeClock()
    ex = exchange(A, clock)
    ex.master = A
    ops = mq.ProducerOps(ex, "p-1", 7)
    answers = iter(
        [
            error(507, "DISK_FULL", retry_after_ms=1000),
            error(507, "DISK_FULL", retry_after_ms=1000),
            reply(200, {"results": [{"msg_id": "x", "queue_id": 0, "queue_offset": 1}]}),
        ]
    )
    result, actions = drive(ops.send("t", ["hello"]), lambda _r: next(answers), clock)
    assert result == [mq.SendResult("x", 0, 1)]
    assert not any(isinstance(a, mq.Request) and a.method == "GET" for a in actions)
    sleeps = [a.seconds for a in actions if isinstance(a, mq.Sleep)]
    assert len(sleeps) == 2 and min(sleeps) >= 1.0  # as Retry-After said
    full = error(507, "DISK_FULL", retry_after_ms=1000)
    err, _ = drive_raises(ops.send("t", ["again"]), lambda _r: full, clock)
    assert isinstance(err, mq.DiskFullError)


def test_an_unreachable_broker_is_skipped_and_none_answering_is_unavailable() -> None:
    clock = FakeClock()
    ex = exchange(f"{A},{B}", clock, deadline_s=5.0)

    def b_answers(req: mq.Request) -> mq.Outcome:
        if req.url.startswith(A):
            return mq.Unreachable("ConnectError: refused")
        return reply(200, {"topics": []})

    result, actions = drive(ex.exchange(READ), b_answers, clock)
    assert result.body == {"topics": []}
    assert not any(isinstance(a, mq.Sleep) for a in actions)  # straight to the next one

    err, actions = drive_raises(ex.exchange(READ), lambda _r: mq.Unreachable("refused"), clock)
    assert isinstance(err, mq.BrokerUnavailableError)
    assert A in str(err) and B in str(err)
    assert any(isinstance(a, mq.Sleep) for a in actions)  # rounds separated by backoff


def test_a_silent_master_costs_the_answer_timeout_then_the_master_is_looked_for_again() -> None:
    """A paused master (issue 16): the produce waits ``produce_answer_timeout_s``, not
    ``timeout_s``; a slave that still names the silent master is not believed this
    round; the batch is retried under the same session on the new master."""
    clock = FakeClock()
    ex = exchange(f"{A},{B},{M}", clock, timeout_s=10.0, produce_answer_timeout_s=1.0)
    ex.master = M
    elected = False

    def answer(req: mq.Request) -> mq.Outcome:
        nonlocal elected
        if req.url.startswith(M):  # SIGSTOPped: the request times out
            clock.now += req.timeout_s
            return mq.Unreachable("ReadTimeout")
        if req.url.endswith("/v1/cluster"):  # A and B: M until the election, then B
            me = req.url[7]
            leader = ("b", B) if elected else ("m", M)
            elected = True
            role = "MASTER" if leader[0] == me else "SLAVE"
            return reply(200, cluster_body(me, role, *leader))
        return reply(200, {"results": [{"msg_id": "x", "queue_id": 0, "queue_offset": 0}]})

    start = clock.now
    result, actions = drive(mq.ProducerOps(ex, "p-1", 5).send("t", ["v"]), answer, clock)
    requests = [a for a in actions if isinstance(a, mq.Request)]
    assert [r.url.removeprefix("http://") for r in requests] == [
        "m:3/v1/topics/t/messages",
        "a:1/v1/cluster",  # names M, which just timed out: not asked again this round
        "b:2/v1/cluster",  # names B
        "b:2/v1/topics/t/messages",
    ]
    assert all(r.timeout_s == 1.0 for r in requests)
    assert {r.params["sequence"] for r in requests if r.content and r.params} == {5}
    assert result[0].queue_offset == 0 and ex.master == B
    assert clock.now - start < 1.5


def test_other_errors_are_raised_at_once() -> None:
    clock = FakeClock()
    ex = exchange(f"{A},{B}", clock)
    calls = []

    def answer(req: mq.Request) -> mq.Outcome:
        calls.append(req)
        return error(404, "GROUP_NOT_FOUND", group="g")

    err, _ = drive_raises(ex.exchange(READ), answer, clock)
    assert isinstance(err, mq.GroupNotFoundError) and err.fields["group"] == "g"
    assert len(calls) == 1


def test_a_topic_one_replica_has_not_applied_yet_is_read_from_another() -> None:
    """A follower behind the master answers TOPIC_NOT_FOUND for a topic another client
    just created (the CI flake of stop 37): a read asks the other replicas, once each,
    and raises only when none has it; the master's word is final, and writes are not
    retried on it."""
    clock = FakeClock()
    ex = exchange(f"{A},{B},{M}", clock)
    calls: list[str] = []

    def a_lags(req: mq.Request) -> mq.Outcome:
        calls.append(req.url[7])
        if req.url.startswith(A):
            return error(404, "TOPIC_NOT_FOUND", topic="t")
        return reply(200, {"topics": []})

    result, actions = drive(ex.exchange(READ), a_lags, clock)
    assert result.body == {"topics": []} and calls == ["a", "b"]
    assert not any(isinstance(a, mq.Sleep) for a in actions)

    calls.clear()
    nowhere = lambda req: (calls.append(req.url[7]), error(404, "TOPIC_NOT_FOUND"))[1]  # noqa: E731
    err, actions = drive_raises(ex.exchange(READ), nowhere, clock)
    assert isinstance(err, mq.TopicNotFoundError)
    assert sorted(calls) == ["a", "b", "m"]  # each once, no second round
    assert not any(isinstance(a, mq.Sleep) for a in actions)

    calls.clear()
    ex.master = M
    err, _ = drive_raises(ex.exchange(READ), nowhere, clock)
    assert isinstance(err, mq.TopicNotFoundError) and calls == ["m"]


def test_attempts_are_bounded_when_two_nodes_name_each_other() -> None:
    clock = FakeClock()
    ex = exchange(f"{A},{B}", clock, max_attempts=12, deadline_s=1e6)
    ex.master = A

    def answer(req: mq.Request) -> mq.Outcome:
        other = B if req.url.startswith(A) else A
        if req.url.endswith("/v1/cluster"):
            return reply(200, cluster_body("x", "SLAVE", "y", other))
        return error(307, "NOT_MASTER", leader_url=other)

    err, actions = drive_raises(ex.exchange(WRITE), answer, clock)
    assert isinstance(err, mq.NotMasterError)
    assert sum(isinstance(a, mq.Request) for a in actions) == 12


def test_long_polls_get_their_wait_on_top_of_the_timeout() -> None:
    clock = FakeClock()
    ex = exchange(A, clock, timeout_s=2.0)
    _, actions = drive(
        ex.exchange(mq.Call("POST", "/v1/groups/g/pull", body={}, wait_ms=5000)),
        lambda _r: reply(200, {}),
        clock,
    )
    assert isinstance(actions[0], mq.Request) and actions[0].timeout_s == pytest.approx(7.0)


def test_group_pull_drops_what_a_lagging_node_repeats() -> None:
    clock = FakeClock()
    ex = exchange(A, clock)
    ops = mq.ConsumerOps(ex, "g", "t")
    ops.positions, ops.committed = {0: 5}, {0: 5}

    def msg(q: int, o: int) -> dict[str, Any]:
        return {"topic": "t", "queue_id": q, "queue_offset": o, "msg_id": "m", "body": "x"}

    body = {
        "messages": [msg(0, 3), msg(0, 4), msg(0, 5), msg(1, 0)],
        "next_offsets": {"0": 6, "1": 1},
    }
    got, _ = drive(ops.poll(10), lambda _r: reply(200, body), clock)
    assert [(m.queue_id, m.queue_offset) for m in got] == [(0, 5), (1, 0)]
    assert ops.positions == {0: 6, 1: 1}
    assert ops.pending() == {0: 6, 1: 1}


def test_pacer_stops_on_count_and_on_idle() -> None:
    clock = FakeClock()
    p = mq.Pacer(clock, max_idle_s=2.0, max_messages=5, wait_ms=1500, batch=4)
    assert p.next_fetch() == (4, 1500)
    p.got(4)
    assert p.next_fetch() == (1, 1500)
    clock.now += 1.0
    assert p.next_fetch() == (1, 1000)  # never waits past the idle limit
    clock.now += 1.0
    assert p.next_fetch() is None
    p = mq.Pacer(clock, max_idle_s=None, max_messages=2, wait_ms=10, batch=4)
    p.got(2)
    assert p.next_fetch() is None


# ---- the drivers over httpx.MockTransport: wire details -------------------------------------


def test_sync_driver_handles_307_itself_and_reuses_one_client() -> None:
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.url.path))
        if request.url.path == "/v1/cluster":
            return httpx.Response(200, json=cluster_body("a", "MASTER", "a", A))
        if request.url.host == "a":
            return httpx.Response(
                307,
                headers={"Location": M + request.url.path},
                json={"error": {"code": "NOT_MASTER", "message": "m is", "leader_url": M}},
            )
        assert request.headers["content-type"] == "application/vnd.ledgermq.batch"
        assert request.headers["authorization"] == "Bearer s3cret"
        assert request.url.params["producer_id"].startswith("p-")
        n = len(inner_records(request.content, 0, len(request.content)))
        return httpx.Response(
            200,
            json={
                "results": [{"msg_id": f"i{k}", "queue_id": 0, "queue_offset": k} for k in range(n)]
            },
        )

    with Producer(A, transport=httpx.MockTransport(handler), auth_token="s3cret") as p:
        assert p.send_one("t", "x").msg_id == "i0"
        assert p.master == M
        assert len(p.send("t", ["x", b"y"])) == 2
    assert (
        seen
        == [("a", "/v1/cluster"), ("a", "/v1/topics/t/messages")]
        + [("m", "/v1/topics/t/messages")] * 2
    )


def test_async_driver_sleeps_between_retries_and_quotes_names() -> None:
    hits: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hits.append(request.url.raw_path.decode())
        if len(hits) == 1:
            return httpx.Response(
                503,
                json={"error": {"code": "BUSY", "message": "later", "retry_after_ms": 30}},
            )
        return httpx.Response(200, json={"name": "a%b|c", "queues": [], "topics": []})

    async def run() -> float:
        async with AsyncAdmin(A, transport=httpx.MockTransport(handler)) as admin:
            started = time.monotonic()
            d = await admin.describe_topic("a%b|c")
            assert d.name == "a%b|c"
            return time.monotonic() - started

    took = asyncio.run(run())
    assert took >= 0.03
    assert hits == ["/v1/topics/a%25b%7Cc"] * 2
