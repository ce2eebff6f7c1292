"""One broker node for ``bench/broker_bench.py``: a ``Broker`` on its own uvloop loop.

The parent (the benchmark) talks to it over JSON lines: commands on this process's
stdin, replies and events on its stdout (the original fd 1; Python's ``sys.stdout`` and
fd 1 are pointed at stderr so nothing else can garble the channel). Logs go to stderr,
which the parent sends to a file.

Commands (``{"id": N, "cmd": ..., ...}``; every reply carries the same ``id`` and
``ok``; each command runs as its own task, so ``status`` answers while a load runs):

- ``status``: ``Broker.status()`` plus the store's byte positions.
- ``create_topic``: ``Broker.create_topic``; ``create_topics``: many (``topics``, a few
  at a time).
- ``produce``: ``producers`` tasks produce batches of ``batch`` messages of ``body_size`` bytes
  through ``Broker.produce`` until ``duration`` s, ``messages`` in all, or the store's
  ``ledger_end_pos`` reaches ``until_pos`` (the first of those set); per-batch latency.
  With ``topics`` (a list), each batch goes to one of them drawn at random (seeded), or
  to each in turn with ``cycle``;
  ``progress``: ``progress`` events every 0.5 s in any case.
- ``pull``: read every queue of ``topic`` from offset 0 to its end with ``Broker.pull``.
- ``load_start`` / ``load_stop``: a background produce load (the failover rounds).
- ``probe``: from now on, as soon as this node is MASTER, produce one small batch
  (retrying every ms while refused) and report the monotonic time it succeeded.
- ``probe_cancel``, ``exit``.

Events (``{"event": ...}``): ``ready``; ``role`` on every broker role change (from a
wrapper around ``WriteGate.set_role``, with ``time.monotonic()``, which is system-wide on
Linux, so the parent can compare it with the time of its kill); ``progress`` while a
produce with ``until_pos`` runs.

Exit with the parent: EOF on stdin, or the parent pid changes (polled every 0.2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import errors
from broker.broker import Broker, NewMessage
from broker.gate import BrokerRole
from broker.settings import BrokerSettings
from consumequeue import ConsumeQueueSettings
from dledger.store import StoreSettings

MiB = 1 << 20
log = logging.getLogger("broker_node")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Node:
    def __init__(self, broker: Broker, out: Any) -> None:
        self.b = broker
        self.out = out
        self.stop = asyncio.Event()
        self.master_event = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.load: asyncio.Task[dict[str, Any]] | None = None
        self.probe: asyncio.Task[None] | None = None
        self.pool = [os.urandom(1024) for _ in range(64)]
        orig = broker.gate.set_role

        def set_role(role: BrokerRole, term: int, why: str) -> None:
            before = (broker.gate.role, broker.gate.role_term)
            orig(role, term, why)
            if role is BrokerRole.MASTER:
                self.master_event.set()
            else:
                self.master_event.clear()
            if before != (role, term):
                st = broker.store
                d = broker.dispatcher
                self.emit(
                    {
                        "event": "role",
                        "role": role.value,
                        "term": term,
                        "why": why,
                        "t": time.monotonic(),
                        "committed_index": st.committed_index,
                        "ledger_end_index": st.ledger_end_index,
                        "dispatched_index": d.dispatched_index if d is not None else -1,
                    }
                )

        broker.gate.set_role = set_role  # type: ignore[method-assign]

    def emit(self, msg: dict[str, Any]) -> None:
        self.out.write(orjson.dumps(msg) + b"\n")
        self.out.flush()

    def bodies(self, size: int) -> list[bytes]:
        if size == 1024:
            return self.pool
        return [os.urandom(size) for _ in range(16)]

    # ---- commands ----------------------------------------------------------------------

    async def handle(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        try:
            fn = getattr(self, "cmd_" + str(req.get("cmd")), None)
            if fn is None:
                raise ValueError(f"unknown command {req.get('cmd')!r}")
            reply = await fn(req)
            self.emit({"id": rid, "ok": True, **reply})
        except Exception as e:
            log.exception("command %s failed", req.get("cmd"))
            self.emit({"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}"})

    async def cmd_status(self, req: dict[str, Any]) -> dict[str, Any]:
        st = self.b.status().to_dict()
        st.pop("peers", None)
        s = self.b.store
        return {
            "status": st,
            "loop_stalls": self.b.server.stats["loop_stalls"],
            "max_tick_late_ms": self.b.server.stats["max_tick_late_ms"],
            "open_queues": len(self.b.cq),
            "mapped_queues": self.b.cq.mapped,
            "suspensions": self.b.cq.suspensions,
            "ledger_end_pos": s.ledger_end_pos,
            "committed_pos": s.committed_pos,
            "t": time.monotonic(),
        }

    async def cmd_create_topic(self, req: dict[str, Any]) -> dict[str, Any]:
        t, created = await self.b.topics.create(req["topic"], req.get("queues"))
        return {"queues": t.queues, "created": created}

    async def cmd_create_topics(self, req: dict[str, Any]) -> dict[str, Any]:
        names: list[str] = list(req["topics"])
        queues = req.get("queues")
        created = 0

        async def worker(k: int) -> None:
            nonlocal created
            for name in names[k::8]:
                _, new = await self.b.topics.create(name, queues)
                created += new

        await asyncio.gather(*(worker(k) for k in range(8)))
        return {"created": created}

    async def cmd_exit(self, req: dict[str, Any]) -> dict[str, Any]:
        self.stop.set()
        return {}

    async def cmd_produce(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self._produce(req, progress=True)

    async def _produce(self, req: dict[str, Any], *, progress: bool) -> dict[str, Any]:
        topics: list[str] = list(req.get("topics") or [req["topic"]])
        rng = random.Random(int(req.get("seed", 1)))
        cycle = bool(req.get("cycle"))  # the topics in turn, not at random
        turn = 0

        def next_topic() -> str:
            nonlocal turn
            turn += 1
            return topics[(turn - 1) % len(topics)] if cycle else rng.choice(topics)

        batch = int(req.get("batch", 100))
        producers = int(req.get("producers", 8))
        body_size = int(req.get("body_size", 1024))
        duration = req.get("duration")
        limit = req.get("messages")
        until_pos = req.get("until_pos")
        hard_s = float(req.get("timeout", 3600))
        if not self.b.is_master:
            raise RuntimeError("not MASTER")
        pool = self.bodies(body_size)
        term0 = self.b.gate.role_term
        start = time.monotonic()
        stop_at = start + (float(duration) if duration else hard_s)
        latencies: list[float] = []
        sent = 0
        errs: dict[str, int] = {}
        done = asyncio.Event()
        store = self.b.store

        def finished() -> bool:
            if done.is_set() or time.monotonic() >= stop_at:
                return True
            if limit is not None and sent >= limit:
                return True
            return until_pos is not None and store.ledger_end_pos >= until_pos

        async def producer(k: int) -> None:
            nonlocal sent
            i = k * 7
            while not finished():
                msgs = [NewMessage(pool[(i + j) % len(pool)]) for j in range(batch)]
                i += batch
                t0 = time.monotonic()
                try:
                    await self.b.producer.produce(next_topic(), msgs)
                except errors.BrokerError as e:
                    errs[e.code] = errs.get(e.code, 0) + 1
                    if not self.b.is_master:
                        done.set()  # lost the role: the run is over
                        return
                    await asyncio.sleep(0.01)
                    continue
                latencies.append((time.monotonic() - t0) * 1000)
                sent += batch

        async def reporter() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.5)
                self.emit(
                    {
                        "event": "progress",
                        "ledger_end_pos": store.ledger_end_pos,
                        "messages": sent,
                    }
                )

        wants = progress and (until_pos is not None or bool(req.get("progress")))
        rep = asyncio.create_task(reporter()) if wants else None
        try:
            await asyncio.gather(*(producer(k) for k in range(producers)))
        finally:
            done.set()
            if rep is not None:
                await rep
        took = time.monotonic() - start
        return {
            "messages": sent,
            "batches": len(latencies),
            "seconds": round(took, 3),
            "msgs_per_s": round(sent / took) if took > 0 else None,
            "mb_per_s": round(sent * body_size / took / 1e6, 2) if took > 0 else None,
            "p50_ms": _round(_pct(latencies, 0.5)),
            "p99_ms": _round(_pct(latencies, 0.99)),
            "max_ms": _round(max(latencies) if latencies else None),
            "errors": errs,
            "ledger_end_pos": store.ledger_end_pos,
            "terms": [term0, self.b.gate.role_term],
        }

    async def cmd_load_start(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.load is not None and not self.load.done():
            raise RuntimeError("a load is already running")
        self.load = asyncio.create_task(self._produce(req, progress=False))
        return {}

    async def cmd_load_stop(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.load is None:
            return {"result": None}
        self.load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.load
        return {}

    async def cmd_pull(self, req: dict[str, Any]) -> dict[str, Any]:
        topic = req["topic"]
        max_messages = int(req.get("max_messages", 1000))
        deadline = time.monotonic() + float(req.get("timeout", 600))
        queues = self.b.topics.get(topic).queues
        ends = [self.b.reads.queue_bounds(topic, q)[1] for q in range(queues)]
        total = nbytes = pulls = 0
        start = time.monotonic()
        for q in range(queues):
            offset = 0
            # at most ends[q] / 1 pulls plus one: every FOUND pull advances the offset
            for _ in range(ends[q] + 1):
                if offset >= ends[q] or time.monotonic() > deadline:
                    break
                r = await self.b.reads.pull(
                    self.b.reads.pulled_message,
                    topic,
                    q,
                    offset,
                    max_messages=max_messages,
                    wait_ms=0,
                )
                pulls += 1
                # A pull that finds messages never awaits: yield between pulls as separate
                # requests would, or a long read-out starves this node's Raft heartbeats.
                await asyncio.sleep(0)
                if r.status != "FOUND":
                    raise RuntimeError(f"queue {q} offset {offset}: {r.status}")
                total += len(r.messages)
                nbytes += sum(len(m.body) for m in r.messages)
                offset = r.next_offset
        took = time.monotonic() - start
        if total != sum(ends):
            raise RuntimeError(f"pulled {total} messages, expected {sum(ends)}")
        return {
            "messages": total,
            "pulls": pulls,
            "seconds": round(took, 3),
            "msgs_per_s": round(total / took) if took > 0 else None,
            "mb_per_s": round(nbytes / took / 1e6, 2) if took > 0 else None,
        }

    async def cmd_probe(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.probe is not None and not self.probe.done():
            raise RuntimeError("a probe is already armed")
        topic = req["topic"]
        timeout_s = float(req.get("timeout", 120))
        rid = req["id"]
        body = b"p" * 100

        async def run() -> None:
            deadline = time.monotonic() + timeout_s
            attempts = 0
            first_error = None
            while time.monotonic() < deadline:
                if not self.b.is_master:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.master_event.wait(), 0.05)
                    continue
                attempts += 1
                t0 = time.monotonic()
                try:
                    await self.b.producer.produce(topic, [NewMessage(body)])
                except errors.BrokerError as e:
                    first_error = first_error or e.code
                    await asyncio.sleep(0.001)
                    continue
                self.emit(
                    {
                        "event": "probe",
                        "probe_id": rid,
                        "ok": True,
                        "t_sent": t0,
                        "t": time.monotonic(),
                        "attempts": attempts,
                        "first_error": first_error,
                    }
                )
                return
            self.emit({"event": "probe", "probe_id": rid, "ok": False, "attempts": attempts})

        self.probe = asyncio.create_task(run())
        return {}

    async def cmd_probe_cancel(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.probe is not None:
            self.probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.probe
        return {}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


async def _main(a: argparse.Namespace, out: Any) -> None:
    settings = BrokerSettings(
        node_id=a.id,
        group=a.group,
        peers=a.peers,
        data_dir=a.data_dir,
        flush=a.flush,
        store=StoreSettings(data_file_size=a.data_file_mib * MiB),
        default_queues=a.queues,
        consume_queue=ConsumeQueueSettings(max_open_queues=a.max_open_queues),
        dispatch_checkpoint_interval_ms=a.checkpoint_interval_ms,
    )
    broker = Broker(settings)
    node = Node(broker, out)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop.set)
    parent = os.getppid()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def read_commands() -> None:
        while not node.stop.is_set():
            line = await reader.readline()
            if not line:
                log.warning("stdin closed: the parent is gone; stopping")
                node.stop.set()
                return
            try:
                req = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.error("bad command line %r", line[:200])
                continue
            t = asyncio.create_task(node.handle(req))
            node.tasks.add(t)
            t.add_done_callback(node.tasks.discard)

    async def watch_parent() -> None:
        while not node.stop.is_set():
            if os.getppid() != parent:
                log.warning("parent %d is gone; stopping", parent)
                node.stop.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(node.stop.wait(), 0.2)

    watcher = asyncio.create_task(watch_parent())
    await broker.start()
    cmds = asyncio.create_task(read_commands())
    node.emit({"event": "ready", "pid": os.getpid()})
    try:
        await node.stop.wait()
    finally:
        for t in (cmds, watcher, *node.tasks, node.load, node.probe):
            if t is not None:
                t.cancel()
        await asyncio.wait_for(broker.stop(), 30)


def main() -> int:
    ap = argparse.ArgumentParser(description="one broker node for bench/broker_bench.py")
    ap.add_argument("--id", required=True)
    ap.add_argument("--group", default="g0")
    ap.add_argument("--peers", required=True)
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--data-file-mib", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--max-open-queues", type=int, default=ConsumeQueueSettings().max_open_queues)
    ap.add_argument(
        "--checkpoint-interval-ms",
        type=int,
        default=BrokerSettings.__dataclass_fields__["dispatch_checkpoint_interval_ms"].default,
    )
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args()
    # The protocol owns the original stdout; anything printed goes to stderr (the log).
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=a.log_level.upper(),
        format=f"%(asctime)s {a.id} %(levelname)s %(name)s: %(message)s",
    )
    import uvloop  # noqa: PLC0415

    uvloop.run(_main(a, out))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
