"""``RequestGuard``: what every request with a body must pass before any of it is read.

A pure ASGI middleware (not ``BaseHTTPMiddleware``, which would buffer and copy the body
and run the app in another task), outermost but for Starlette's error middleware:

- a ``/v1`` request with a body on a node with tokens answers 401 before its body is
  read when it carries no token the node knows (the routes check the token again, with
  its scopes, as for requests without a body);
- a declared ``Content-Length`` over the cap answers 413 ``PAYLOAD_TOO_LARGE`` at once;
  a body sent without one (chunked) is counted as it is received and refused the
  moment it passes the cap, whatever part of the app was reading it.

A query string that is not UTF-8 answers 400 ``INVALID_ARGUMENT`` before anything else:
Starlette decodes it as UTF-8 wherever it builds the request's URL (a slash redirect,
an error handler) and would fail there instead.

The cap is ``Limits.max_request_bytes`` for a produce, ``Limits.max_small_body_bytes``
for every other body (topic create, offsets, group pull, leadership). A request that
announces no body is not refused up front (the routes check its token); what it sends
is counted all the same.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import errors
from broker.jsonint import decimal
from broker.settings import Limits

from .auth import TokenTable
from .metrics import NodeMetrics
from .routes.common import bearer_token, broker_error_response, grant_of

PRODUCE_PATH = re.compile(r"/v1/topics/[^/]+/messages")


class _OverCapError(Exception):
    """Raised into the app by ``receive`` when the body passes its cap: whatever the app
    makes of it (FastAPI answers a failed body read 400), the guard answers 413."""


class RequestGuard:
    def __init__(
        self, app: ASGIApp, *, limits: Limits, tokens: TokenTable | None, metrics: NodeMetrics
    ) -> None:
        self.app = app
        self.limits = limits
        self.tokens = tokens
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            scope.get("query_string", b"").decode()
        except UnicodeDecodeError:
            await self.refuse(
                errors.InvalidArgumentError("the query string is not UTF-8"), scope, receive, send
            )
            return
        headers = _headers(scope)
        cap = self.cap(scope)
        declared = headers.get("content-length")
        if declared not in (None, "0") or "transfer-encoding" in headers:
            try:  # a body is coming: is it wanted, and may it be this long?
                if self.tokens is not None and scope["path"].startswith("/v1/"):
                    grant_of(self.tokens, bearer_token(headers.get("authorization")))
                size = None if declared is None else decimal(declared)
                if declared is not None and (size is None or size > cap):
                    raise too_large(cap)
            except errors.BrokerError as e:
                await self.refuse(e, scope, receive, send)
                return
        # Counted even when no body was announced: the cap holds whatever the server
        # (or a test calling the app) hands over.
        await self.counted(cap, scope, receive, send)

    def cap(self, scope: Scope) -> int:
        """The body cap of this request: a produce's, or the small one of the rest."""
        if scope["method"] == "POST" and PRODUCE_PATH.fullmatch(scope["path"]):
            return self.limits.max_request_bytes
        return self.limits.max_small_body_bytes

    async def counted(self, cap: int, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a ``receive`` that counts the body's bytes and refuses it
        past ``cap``; the app's answer to that refusal is dropped for the 413."""
        received = 0
        over = started = False

        async def counted_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    over = True
                    raise _OverCapError(cap)
            return message

        async def send_unless_over(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, send_unless_over)
        except Exception:
            if not over:
                raise
        if over and not started:  # started: the app answered before reading it all
            await self.refuse(too_large(cap), scope, receive, send)

    async def refuse(
        self, e: errors.BrokerError, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.metrics.errors.labels(e.code).inc()
        await broker_error_response(e)(scope, receive, send)


def too_large(cap: int) -> errors.PayloadTooLargeError:
    return errors.PayloadTooLargeError(f"request body over {cap} bytes", limit=cap)


def _headers(scope: Scope) -> MutableMapping[str, Any]:
    """The request headers by lower-case name (the last of repeated ones)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
