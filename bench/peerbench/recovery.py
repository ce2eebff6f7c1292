"""Restart recovery on the catch-up log (``--consume-messages`` x ``--body-size``: 1 GiB
by default, plus what the produce runs wrote).

Two measurements per system that keeps a log (LedgerMQ, NATS, etcd; pysyncobj is not
measured: its log holds only the produce runs and it has no read API to check it):

- ``follower``: kill -9 of a follower, started again at once; the time from its start
  to its own health check passing (LedgerMQ ``/readyz``: a master known and dispatch
  caught up; NATS ``/healthz``; etcd ``/health``), and for LedgerMQ to its dispatch
  reaching the master's commit index;
- ``cluster``: every replica stopped (SIGTERM) and started again; the time from the
  start to the first acknowledged write (one message, retried every 10 ms).

``replica_bytes`` is what one replica holds on disk when it restarts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from .loadgen import nats_connect
from .systems import Etcd, LedgerMQ, Nats, System

# A restart reads the whole log: its bound is longer than --timeout's.
RECOVERY_TIMEOUT_S = 600.0


def _until(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``cond()`` holds, polled every 10 ms."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def _ok(fn: Callable[[], Any]) -> bool:
    try:
        return bool(fn())
    except Exception:
        return False


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def ledgermq_recovery(s: LedgerMQ) -> dict[str, Any]:
    c = s.cluster
    master = s.master()
    follower = next(n for n in c.ids if n != master)
    size = s.data_bytes()
    c.kill(follower)
    c.start(follower)
    t0 = time.monotonic()
    ready = _until(lambda: c.ready(follower, 0.5), RECOVERY_TIMEOUT_S, f"{s.key} {follower} ready")
    s.wait_dispatched(follower)
    caught_up = time.monotonic() - t0
    c.stop_all()
    c.start_all()

    def produced() -> bool:
        m = c.master()
        if m is None:
            return False
        r = httpx.post(
            c.urls[m] + "/v1/topics/bench/messages",
            json={"messages": [{"body": "probe"}]},
            timeout=1.0,
        )
        return r.status_code == 200

    write = _until(
        lambda: _ok(produced), RECOVERY_TIMEOUT_S, f"{s.key} first write after a restart"
    )
    return {
        "replica_bytes": size,
        "follower_ready_ms": _ms(ready),
        "follower_caught_up_ms": _ms(caught_up),
        "cluster_first_write_ms": _ms(write),
    }


def nats_recovery(s: Nats) -> dict[str, Any]:
    from .failover import NatsHooks  # noqa: PLC0415

    hooks = NatsHooks(s, s.a)
    leader = asyncio.run(hooks.leader())[0]
    follower = next(i for i in range(3) if i != leader)
    size = s.data_bytes()
    s.group.kill(follower)
    s.group.start(follower)
    ready = _until(lambda: s.healthy(follower), RECOVERY_TIMEOUT_S, f"nats{follower} healthy")
    s.group.stop_all()
    s.group.start_all()

    async def publish() -> bool:
        nc = await nats_connect(s.servers, connect_timeout=0.5, allow_reconnect=False)
        try:
            await nc.jetstream(timeout=0.5).publish("bench.probe", b"probe")
            return True
        finally:
            await nc.close()

    write = _until(
        lambda: _ok(lambda: asyncio.run(publish())), RECOVERY_TIMEOUT_S, "nats first write"
    )
    return {
        "replica_bytes": size,
        "follower_ready_ms": _ms(ready),
        "cluster_first_write_ms": _ms(write),
    }


def etcd_recovery(s: Etcd) -> dict[str, Any]:
    leader = s.leader()
    follower = next(i for i in range(3) if i != leader)
    size = s.data_bytes()
    s.group.kill(follower)
    s.group.start(follower)
    ready = _until(
        lambda: _ok(lambda: s.healthy(follower)), RECOVERY_TIMEOUT_S, f"etcd{follower} healthy"
    )
    s.group.stop_all()
    s.group.start_all()
    body = {"key": base64.b64encode(b"probe").decode(), "value": ""}

    def put() -> bool:
        for url in s.urls:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(url + "/v3/kv/put", json=body, timeout=0.5).status_code == 200:
                    return True
        return False

    write = _until(put, RECOVERY_TIMEOUT_S, "etcd first write")
    return {
        "replica_bytes": size,
        "follower_ready_ms": _ms(ready),
        "cluster_first_write_ms": _ms(write),
    }


def run_recovery(s: System) -> dict[str, Any]:
    if isinstance(s, LedgerMQ):
        out = ledgermq_recovery(s)
    elif isinstance(s, Nats):
        out = nats_recovery(s)
    elif isinstance(s, Etcd):
        out = etcd_recovery(s)
    else:
        return {"not_measured": "no log of its own to recover (and no read API)"}
    s.wait_ready()
    print(f"recovery | {s.key}: {out}", file=sys.stderr)
    return out
