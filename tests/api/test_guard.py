"""The request guard (issue 17, HTTP): every body is capped before it is parsed, and a
request without a valid token is refused before its body is read.

The app is called as an ASGI server would call it, with a ``receive`` that records how
much of the body the app asked for: "before reading the body" is then a count, not a
guess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from fastapi import FastAPI

from api.app import create_app
from tests.api.conftest import TEST_LIMITS, Node
from tests.asgi import http_scope

pytestmark = pytest.mark.asyncio

GIB = 1 << 30


@dataclass
class Exchange:
    """One request through the app: its answer and how many body chunks were read."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks_read: int = 0

    @property
    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        return error


async def call(
    app: FastAPI,
    method: str,
    path: str,
    chunks: list[bytes],
    headers: dict[str, str] | None = None,
    query: bytes = b"",
) -> Exchange:
    """Send ``chunks`` as the body (one ``http.request`` message each), as uvicorn does."""
    ex = Exchange()
    raw_headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = http_scope(method, path, query=query, headers=raw_headers)

    async def receive() -> dict[str, Any]:
        if ex.chunks_read < len(chunks):
            ex.chunks_read += 1
            more = ex.chunks_read < len(chunks)
            return {"type": "http.request", "body": chunks[ex.chunks_read - 1], "more_body": more}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            ex.status = message["status"]
            ex.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            ex.body += message.get("body", b"")

    await app(scope, receive, send)
    return ex


def authed_app(node: Node) -> FastAPI:
    return create_app(node.broker.settings, node.broker, auth_token="s3cret")


BODY_ENDPOINTS = [
    ("POST", "/v1/topics/g/messages"),
    ("POST", "/v1/topics"),
    ("PUT", "/v1/groups/g/offsets"),
    ("POST", "/v1/groups/g/offsets/reset"),
    ("POST", "/v1/groups/g/pull"),
    ("POST", "/v1/cluster/leadership"),
    ("PUT", "/v1/groups/g"),
    ("POST", "/v1/groups/g/receive"),
    ("POST", "/v1/groups/g/ack"),
    ("POST", "/v1/groups/g/nack"),
    ("POST", "/v1/groups/g/invisible"),
    ("POST", "/v1/groups/g/dlq"),
    ("POST", "/v1/groups/g/dlq/redrive"),
    ("POST", "/v1/transactions/tx1:0"),
]


@pytest.mark.parametrize(("method", "path"), BODY_ENDPOINTS)
async def test_no_token_is_refused_before_the_body_is_read(
    node: Node, method: str, path: str
) -> None:
    app = authed_app(node)
    before = node.log_state()
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic s3cret"}):
        # A declared 2 GiB body, never sent: the answer comes without reading any of it.
        ex = await call(app, method, path, [b"{"] * 3, {"content-length": str(2 * GIB), **headers})
        assert ex.status == 401, ex.body
        assert ex.error["code"] == "UNAUTHENTICATED" and ex.headers["www-authenticate"] == "Bearer"
        assert ex.chunks_read == 0
    assert node.log_state() == before


@pytest.mark.parametrize(("method", "path"), BODY_ENDPOINTS)
async def test_a_declared_length_over_the_cap_is_refused_unread(
    node: Node, method: str, path: str
) -> None:
    app = authed_app(node)
    cap = TEST_LIMITS.max_request_bytes if path.endswith("/messages") else 64 * 1024
    auth = {"authorization": "Bearer s3cret"}
    ex = await call(app, method, path, [b"x"], {"content-length": str(cap + 1), **auth})
    assert ex.status == 413 and ex.error["code"] == "PAYLOAD_TOO_LARGE", ex.body
    assert ex.error["limit"] == cap and ex.chunks_read == 0


@pytest.mark.parametrize(("method", "path"), BODY_ENDPOINTS)
async def test_a_chunked_body_is_refused_as_it_passes_the_cap(
    node: Node, method: str, path: str
) -> None:
    """No Content-Length: the guard counts what arrives and stops reading at the cap."""
    cap = TEST_LIMITS.max_request_bytes if path.endswith("/messages") else 64 * 1024
    chunk = b" " * 16 * 1024
    chunks = [chunk] * (cap // len(chunk) + 50)
    before = node.log_state()
    ex = await call(node.app, method, path, chunks, {"transfer-encoding": "chunked"})
    assert ex.status == 413 and ex.error["code"] == "PAYLOAD_TOO_LARGE", ex.body
    assert ex.chunks_read == cap // len(chunk) + 1  # the one that passed the cap, no more
    assert node.log_state() == before


async def test_bodies_under_the_cap_and_requests_without_one_pass(node: Node) -> None:
    r = await node.http.post("/v1/topics", json={"name": "ok", "queues": 1})
    assert r.status_code == 201, r.text

    async def stream() -> AsyncIterator[bytes]:  # chunked, under the cap
        yield b'{"messages": [{"body": '
        yield b'"streamed"}]}'

    r = await node.http.post("/v1/topics/ok/messages", content=stream())
    assert r.status_code == 200, r.text
    r = await node.http.get("/v1/topics/ok/queues/0/messages")
    assert [m["body"] for m in r.json()["messages"]] == ["streamed"]
    r = await node.http.delete("/v1/topics/ok")
    assert r.status_code == 204


async def test_a_streamed_body_over_the_cap_through_httpx(node: Node) -> None:
    async def stream() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * (16 * 1024)

    r = await node.http.put("/v1/groups/g/offsets", content=stream())
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert (
        'ledgermq_http_errors_total{code="PAYLOAD_TOO_LARGE"} 1.0'
        in (await node.http.get("/metrics")).text
    )


async def test_an_open_node_caps_too(node: Node) -> None:
    """No tokens: no 401, but the caps hold."""
    ex = await call(node.app, "POST", "/v1/topics", [b"{}"], {"content-length": str(GIB)})
    assert ex.status == 413 and ex.chunks_read == 0
    r = await node.http.post("/v1/topics", content=b"{" * (64 * 1024 + 1))
    assert r.status_code == 413
    # A body no header announced (a server would not pass one; the cap holds anyway).
    ex = await call(node.app, "POST", "/v1/topics", [b" " * (64 * 1024)] * 2)
    assert ex.status == 413 and ex.chunks_read == 2


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/healthz"), ("PUT", "/v1/groups/"), ("GET", "/v1/topics/")]
)
async def test_a_query_string_that_is_not_utf8_is_refused_not_a_500(
    node: Node, method: str, path: str
) -> None:
    """Starlette decodes the query as UTF-8 where it builds a URL (the slash redirect of
    ``/v1/groups/``, found by the http_bodies fuzz target): the guard refuses it first."""
    ex = await call(node.app, method, path, [b"{}"], query=b"a=\xcd\xcd")
    assert ex.status == 422 and ex.error["code"] == "INVALID_ARGUMENT", ex.body
    assert (await call(node.app, method, path, [], query=b"a=%CD")).status != 422
