"""The Python HTTP floor for ``bench/http_bench.py``: a bare FastAPI app, nothing else.

Served the way a LedgerMQ node serves its API (``ledgermq/node.py``): uvicorn with the
httptools parser on a uvloop loop, one process, no lifespan, no access log. It has no
broker, no validation and no storage, so what a request costs here is the least any
endpoint of ours can cost on this machine (the "HTTP floor"):

- ``POST /echo``: reads the whole request body and answers a small JSON
  (``{"ok": true, "bytes": N}``), like a produce answers its results;
- ``GET /blob?size=N``: answers N bytes of JSON built once and cached (the floor for a
  pull answer of that size);
- ``GET /healthz``: ``{"status": "ok"}``.

A benchmark fixture, not product code:

    .venv/bin/python bench/http_floor.py --port 18080 [--exit-with-parent]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import Any

import orjson
import uvicorn
import uvloop
from fastapi import FastAPI, Query, Request
from starlette.responses import Response


class JSONBytes(Response):
    """orjson-rendered JSON, as the node's app renders its hot responses."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def create_app() -> FastAPI:
    app = FastAPI(title="http floor", default_response_class=JSONBytes)
    blobs: dict[int, bytes] = {}

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONBytes({"status": "ok"})

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONBytes({"ok": True, "bytes": len(body)})

    @app.get("/blob")
    async def blob(size: int = Query(default=1024, ge=2, le=64 << 20)) -> Response:
        data = blobs.get(size)
        if data is None:
            data = blobs[size] = b'"' + b"x" * (size - 2) + b'"'
        return Response(data, media_type="application/json")

    return app


async def _watch_parent(server: uvicorn.Server, parent: int) -> None:
    while not server.should_exit:
        await asyncio.sleep(0.5)
        if os.getppid() != parent:
            server.should_exit = True


async def serve(host: str, port: int, exit_with_parent: bool) -> None:
    config = uvicorn.Config(
        create_app(),
        host=host,
        port=port,
        loop="none",  # the uvloop loop this coroutine runs on, as in ledgermq/node.py
        http="httptools",
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    watchdog = (
        asyncio.create_task(_watch_parent(server, os.getppid())) if exit_with_parent else None
    )
    try:
        await server.serve()
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if not server.started:
        raise OSError(f"could not serve HTTP on {host}:{port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--exit-with-parent", action="store_true")
    a = ap.parse_args()
    try:
        uvloop.run(serve(a.host, a.port, a.exit_with_parent))
    except OSError as e:
        print(f"http_floor: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
