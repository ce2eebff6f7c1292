"""Calling an ASGI app as a server would, without one: the scope of an HTTP request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def http_scope(
    method: str,
    path: str,
    *,
    query: bytes = b"",
    headers: Iterable[tuple[bytes, bytes]] = (),
    host: bytes = b"node",
) -> dict[str, Any]:
    """An HTTP/1.1 request's scope from 127.0.0.1 (header names lower-case bytes)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [*headers, (b"host", host)],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
