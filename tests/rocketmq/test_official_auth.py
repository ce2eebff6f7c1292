"""AK/SK credentials over gRPC (docs/rocketmq.md "Credentials"): the official Python
client (and Node's, whose signature is upper-case hex) against a 3-process cluster with
tokens and ``--access-keys-file``.

The right key produces and consumes, also through a follower (which forwards the call
with its signature; the master checks it again); a wrong secret, no credentials, a stale
signature are UNAUTHORIZED; a produce-only key cannot receive (FORBIDDEN); a call that
claims to be forwarded is checked like any other.
"""

from __future__ import annotations

import hashlib
import hmac
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

from .client_env import official_node, official_python, run_node_script, run_script
from .clusters import cluster_with_topics

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-the-test"
KEYS = {
    "app": ("app-secret", "produce:orders consume:orders"),
    "writer": ("writer-secret", "produce:orders"),
}


@pytest.fixture(scope="module")
def official() -> Path:
    return official_python()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    data_dir = tmp_path_factory.mktemp("rocketmq-auth")
    tokens, keys = data_dir / "tokens", data_dir / "access-keys"
    tokens.write_text(f"{ADMIN} admin\n")
    keys.write_text("".join(f"{ak} {sk} {scopes}\n" for ak, (sk, scopes) in KEYS.items()))
    args = ("--auth-tokens-file", str(tokens), "--access-keys-file", str(keys))
    with cluster_with_topics(data_dir, {"orders": 2}, *args, token=ADMIN) as c:
        yield c


def client(python: Path, c: LocalBrokerCluster, endpoints: str = "", **args: Any) -> Any:
    return run_script(
        python,
        "auth_client.py",
        {"endpoints": endpoints or c.grpc_endpoints, "topic": "orders", "await_s": 2, **args},
    )


def follower(c: LocalBrokerCluster) -> str:
    master = c.wait_ready()
    return next(n for n in c.ids if n != master)


def test_the_right_key_produces_and_consumes_also_through_a_follower(
    official: Path, cluster: LocalBrokerCluster
) -> None:
    at_follower = cluster.grpc_addrs[follower(cluster)]
    # the group starts at the earliest message (a new group's start is the latest)
    r = httpx.put(
        f"{cluster.urls[cluster.wait_ready()]}/v1/groups/signed-readers",
        json={"start": "earliest"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code in (200, 201), r.text
    bodies = [f"signed {i}" for i in range(5)]
    out = client(
        official, cluster, at_follower, op="send", ak="app", sk="app-secret", bodies=bodies
    )
    assert "error" not in out and len(out["sent"]) == 5, out
    got = client(
        official, cluster, at_follower, op="receive", ak="app", sk="app-secret",
        group="signed-readers", expect=5,
    )  # fmt: skip
    assert "error" not in got and sorted(got["received"]) == bodies, got


@pytest.mark.parametrize(
    "credentials", [{"ak": "app", "sk": "not-the-secret"}, {}, {"ak": "nobody", "sk": "x"}]
)
def test_a_wrong_secret_or_no_credentials_are_refused(
    official: Path, cluster: LocalBrokerCluster, credentials: dict[str, str]
) -> None:
    out = client(official, cluster, op="send", bodies=["never"], **credentials)
    assert "error" in out and not out.get("sent"), out
    # Python logs the route's UNAUTHORIZED (the raw calls below check the code) and
    # raises "failed to fetch topic route" from send
    assert any(w in out["error"] for w in ("40100", "nauthorized", "route")), out


def test_a_produce_only_key_cannot_receive(official: Path, cluster: LocalBrokerCluster) -> None:
    out = client(
        official, cluster, op="receive", ak="writer", sk="writer-secret",
        group="writers-may-not", expect=1,
    )  # fmt: skip
    assert "error" in out and not out.get("received"), out
    assert "40300" in out["error"] or "orbidden" in out["error"], out


def test_the_node_client_signs_too(cluster: LocalBrokerCluster) -> None:
    modules = official_node()
    at_follower = cluster.grpc_addrs[follower(cluster)]  # Node takes one address

    def send(credentials: dict[str, str] | None) -> Any:
        message = {"topic": "orders", "body": "from node"}
        args = {"endpoints": at_follower, "topics": ["orders"], "messages": [message]}
        return run_node_script(modules, "producer.js", {**args, "credentials": credentials})

    out = send({"accessKey": "writer", "accessSecret": "writer-secret"})
    assert "startup_error" not in out and "error" not in out["receipts"][0], out
    out = send({"accessKey": "writer", "accessSecret": "nope"})
    assert "startup_error" in out or "error" in out["receipts"][0], out
    # Node's startup fetches the routes: refused UNAUTHORIZED, it gives up after 3 tries
    assert any(w in str(out) for w in ("nauthorized", "40100", "topic routes")), out


def metadata(ak: str, sk: str, at: float, extra: tuple[tuple[str, str], ...] = ()) -> Any:
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))
    sig = hmac.new(sk.encode(), date.encode(), hashlib.sha1).hexdigest().upper()  # as Node
    return (
        ("x-mq-client-id", "raw@1@0@test"),
        ("x-mq-date-time", date),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}",
        ),
        *extra,
    )


def route(c: LocalBrokerCluster, node: str, md: Any) -> int:
    with grpc.insecure_channel(c.grpc_addrs[node]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]
        r = stub.QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name="orders")), metadata=md, timeout=5
        )
        return int(r.status.code)


def test_stale_signatures_and_claimed_forwards_are_checked_like_any_call(
    cluster: LocalBrokerCluster,
) -> None:
    master = cluster.wait_ready()
    now = time.time()
    assert route(cluster, master, metadata("app", "app-secret", now)) == pb.Code.OK
    assert route(cluster, master, metadata("writer", "writer-secret", now)) == pb.Code.OK
    # a signature older than the window (15 min) is refused: a captured one does not last
    assert route(cluster, master, metadata("app", "app-secret", now - 1000)) == pb.Code.UNAUTHORIZED
    # "forwarded by a peer" buys nothing: the master checks the signature all the same
    forged = metadata("app", "bad", now, (("x-ledgermq-hops", "1"),))
    assert route(cluster, master, forged) == pb.Code.UNAUTHORIZED
    # no credentials: Node sends no authorization, Python an empty Credential
    assert route(cluster, master, (("x-mq-client-id", "raw@1@0@test"),)) == pb.Code.UNAUTHORIZED
    assert route(cluster, master, metadata("", "", now)) == pb.Code.UNAUTHORIZED
    # from a follower too (it refuses before forwarding anything)
    other = next(n for n in cluster.ids if n != master)
    assert route(cluster, other, metadata("app", "bad", now)) == pb.Code.UNAUTHORIZED
