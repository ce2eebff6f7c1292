"""The load generator process: ``bench/http_bench.py``'s, plus the peers' protocols.

``http_bench.LoadGen`` (a uvloop process, one keep-alive connection per client, each
client sending its next request when the previous one is answered, a measured window
after a warm-up, CPU sampled by the parent between the ``window_start`` and
``window_end`` events) drives LedgerMQ's pulls and the floor's ``GET /blob`` as it is.
``PeerLoadGen`` adds, on the same clock and tally:

- ``http``: POSTs built per request by a named body maker: ``ledgermq`` (a produce of
  ``batch`` messages, the answer must carry ``batch`` results), ``echo`` (the floor),
  ``etcd`` (one ``/v3/kv/put``, or a ``/v3/kv/txn`` of ``batch`` puts; keys are unique,
  values base64). etcd answers chunked, so ``ChunkedConnection`` reads both framings;
- ``nats``: JetStream publishes with nats-py, one connection per client; a request of
  ``batch`` messages is ``batch`` ``publish_async`` calls answered by ``batch`` acks;
- ``pysyncobj``: ``bench/pysyncobj_baseline.py``'s APPEND frames of ``batch`` bodies;
- ``etcd_range`` / ``nats_fetch``: the catch-up reads of the peers (see ``systems``);
- ``pop`` (http_bench's, LedgerMQ's POP receive + ack) and ``nats_pop``: shared
  consumption of a backlog, ``clients`` consumers each fetching ``batch`` messages from
  one durable JetStream pull consumer (explicit acks) and acking each of them, with
  ``Msg.ack()`` (published, not waited for: ``nats_ack`` ``ack``) or ``Msg.ack_sync()``
  (each answered by the server, all 32 at once: ``ack_sync``), until the stream's
  messages are acked.

``max_messages`` in a spec bounds the messages sent (the catch-up fill): each client
takes its batch from a shared budget before sending it (http_bench's ``_take``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import orjson
from http_bench import (
    RECORDS,
    HttpError,
    LoadGen,
    RawConnection,
    Request,
    WrongAnswerError,
    _bodies,
    _ms,
    _pct,
    _post_head,
    loadgen_main,
)

Call = Callable[[], Awaitable[int | str]]  # one request: messages acknowledged, or why not
RECORDS_BODY = "ledgermq-records"  # a LedgerMQ produce in the record format
NATS_ERRORS: tuple[type[BaseException], ...] = ()


class ChunkedConnection(RawConnection):
    """``RawConnection`` that also reads ``Transfer-Encoding: chunked`` answers (Go's
    net/http chunks every answer over 2 KiB: etcd's transactions and ranges)."""

    async def read_unsized_body(self, low_head: bytes) -> bytes:
        if b"\r\ntransfer-encoding: chunked" not in low_head:
            self.close()
            raise HttpError("answer without Content-Length or chunked framing")
        assert self.r is not None
        parts = []
        while True:
            size = int((await self.r.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.r.readuntil(b"\r\n")  # no trailers from Go's server
                break
            parts.append((await self.r.readexactly(size + 2))[:-2])
        return b"".join(parts)


async def _ignore(*_: object) -> None:
    """nats-py's callbacks: it logs every reconnect with a traceback otherwise."""


async def nats_connect(servers: list[str], **kw: Any) -> Any:
    """A nats-py connection that reports errors by raising them, not by logging them."""
    import nats  # noqa: PLC0415  # the `bench` extra

    return await nats.connect(
        servers=servers, error_cb=_ignore, disconnected_cb=_ignore, reconnected_cb=_ignore, **kw
    )


def _refusal(status: int, data: bytes) -> str:
    """``HTTP <status> <error code>`` of a refused request (LedgerMQ's error body)."""
    i = data.find(b'"code":"')
    code = data[i + 8 : data.find(b'"', i + 8)].decode(errors="replace") if i >= 0 else ""
    return f"HTTP {status} {code}".strip()


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data)


class EtcdBodies:
    """Request bodies for etcd's JSON gateway: unique keys ``<prefix><client><seq>``."""

    def __init__(self, spec: dict[str, Any], client: int) -> None:
        self.batch = spec["batch"]
        self.prefix = spec["key_prefix"]
        self.queues = spec.get("queues", 1)
        self.client = client
        self.seq = 0
        values = os.urandom(spec["pool"] * spec["body_size"])
        n = spec["body_size"]
        self.values = [_b64(values[k : k + n]) for k in range(0, len(values), n)]

    def key(self) -> bytes:
        self.seq += 1
        q = (self.client + self.seq) % self.queues
        return _b64(f"{self.prefix}{q}/{self.client:04d}{self.seq:012d}".encode())

    def next(self) -> tuple[str, bytes]:
        v = self.values
        if self.batch == 1:
            return "/v3/kv/put", b'{"key":"%s","value":"%s"}' % (self.key(), v[self.seq % len(v)])
        ops = [
            b'{"request_put":{"key":"%s","value":"%s"}}' % (self.key(), v[self.seq % len(v)])
            for _ in range(self.batch)
        ]
        return "/v3/kv/txn", b'{"success":[' + b",".join(ops) + b"]}"


def etcd_key_range(prefix: str) -> tuple[bytes, bytes]:
    """``key`` and ``range_end`` (base64) of every key starting with ``prefix``."""
    raw = prefix.encode()
    return _b64(raw), _b64(raw[:-1] + bytes((raw[-1] + 1,)))


NATS_POP_CONSUMER = "popbench"


class PeerLoadGen(LoadGen):
    def __init__(self, spec: dict[str, Any], progress: Any, conn: Connection) -> None:
        super().__init__(spec, progress, conn)
        self.answered = 0

    # -- the common client loop --

    async def _client(self, call: Call) -> None:
        """Send requests back to back until the time is up (or the budget is spent)."""
        errors = self.tally.errors
        while time.monotonic() < self.stop_at and self._take():
            t0 = time.monotonic()
            n: int | str
            try:
                async with asyncio.timeout(self.spec["request_timeout"]):
                    n = await call()
            except (OSError, EOFError, asyncio.IncompleteReadError, HttpError, TimeoutError) as e:
                n = type(e).__name__
            except NATS_ERRORS as e:
                n = type(e).__name__
            t1 = time.monotonic()
            if isinstance(n, str):
                self._give_back()  # the fill sends it again
                if self._in_window(t1):
                    errors[n] = errors.get(n, 0) + 1
                await asyncio.sleep(0.02)
                continue
            self.progress.value += 1
            self.answered += n
            if self._in_window(t1):
                self.tally.latencies.append(t1 - t0)
                self.tally.requests += 1
                self.tally.messages += n

    # -- HTTP POSTs (LedgerMQ produce, floor echo, etcd puts) --

    async def _http_calls(self) -> list[Call]:
        s = self.spec
        out: list[Call] = []
        pool: list[bytes] = []
        if s["body"] in ("ledgermq", "echo", RECORDS_BODY):
            records = s["body"] == RECORDS_BODY  # the record format (issue 31)
            pool = _bodies(s["batch"], s["body_size"], s["pool"], records=records)
        for k in range(s["clients"]):
            conn = ChunkedConnection(s["host"], s["ports"][k % len(s["ports"])])
            await conn.connect()
            out.append(self._http_call(conn, pool, k))
        return out

    def _http_call(self, conn: ChunkedConnection, pool: list[bytes], k: int) -> Call:
        """One client's request. In a fill (``max_messages``) a refused or failed request
        is sent again as it was, so that it is stored once: LedgerMQ's carry a producer
        session (the broker deduplicates a retried sequence), etcd's rewrite their keys."""
        s = self.spec
        host, port = conn.host, conn.port
        etcd = EtcdBodies(s, k) if s["body"] == "etcd" else None
        fill = s.get("max_messages") is not None
        ct = RECORDS if s["body"] == RECORDS_BODY else "application/json"
        reqs = [(s["path"], _post_head(host, port, s["path"], len(b), ct), b) for b in pool]
        topic = s["path"].split("/")[3].encode() if s["body"] == "ledgermq" else b""
        marker = {
            "ledgermq": b'"msg_id"', RECORDS_BODY: b'"runs"', "echo": b'"ok"',
            "etcd": b'"revision"',
        }[s["body"]]  # fmt: skip
        want = s["batch"] if s["body"] == "ledgermq" else 1
        i = k
        retry: list[Request] = []

        def next_request() -> Request:
            nonlocal i
            i += 1
            if etcd is not None:
                path, body = etcd.next()
                return (path, _post_head(host, port, path, len(body)), body)
            if fill and s["body"] == "ledgermq":
                # A producer per client and topic: each fill's sequences start anew.
                session = b',"producer_id":"fill-%s-%d","sequence":%d}' % (topic, k, i)
                body = pool[i % len(pool)][:-1] + session
                return (s["path"], _post_head(host, port, s["path"], len(body)), body)
            return reqs[i % len(reqs)]

        async def call() -> int | str:
            req = retry.pop() if retry else next_request()
            if fill:
                retry.append(req)  # until it is acknowledged
            try:
                status, data = await conn.request(req)
            except BaseException:
                conn.close()
                raise
            if status == 307 and s["body"] in ("ledgermq", RECORDS_BODY):
                await self._follow(conn, data)  # a new master: the next request goes there
            if status != 200:
                return _refusal(status, data)
            if data.count(marker) < want:
                raise WrongAnswerError(f"{s['body']}: unexpected answer {data[:200]!r}")
            retry.clear()
            return s["batch"]

        return call

    async def _follow(self, conn: ChunkedConnection, data: bytes) -> None:
        """Reconnect ``conn`` to the master a LedgerMQ 307 names (``leader_url``)."""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = orjson.loads(data)
            url = doc.get("error", {}).get("leader_url") or doc["leader_url"]
            host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
            conn.close()
            conn.host, conn.port = host, int(port)
            await conn.connect()

    # -- NATS JetStream --

    async def _nats_calls(self) -> list[Call]:
        s = self.spec
        body = os.urandom(s["body_size"])
        out: list[Call] = []
        for k in range(s["clients"]):
            nc = await nats_connect(
                s["servers"][k % 3 :] + s["servers"][: k % 3],
                connect_timeout=2,
                reconnect_time_wait=0.05,
                max_reconnect_attempts=-1,
            )
            self._closers.append(nc.close)
            js = nc.jetstream(timeout=s["request_timeout"])
            subject = f"{s['subject']}.{k % s['queues']}"
            out.append(self._nats_call(js, subject, body))
        return out

    def _nats_call(self, js: Any, subject: str, body: bytes) -> Call:
        batch = self.spec["batch"]

        async def call() -> int | str:
            if batch == 1:
                await js.publish(subject, body)
                return 1
            futs = [await js.publish_async(subject, body) for _ in range(batch)]
            await asyncio.gather(*futs)
            return batch

        return call

    async def _nats_fetch(self, q: int) -> Call:
        """A reader of subject ``<subject>.<q>`` of the stream from its start to its end,
        pages of ``batch`` (an ephemeral pull consumer, no acks)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

        s = self.spec
        nc = await nats_connect(s["servers"], connect_timeout=2)
        self._closers.append(nc.close)
        js = nc.jetstream(timeout=s["request_timeout"])
        cfg = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=60.0,
        )
        sub = await js.pull_subscribe(f"{s['subject']}.{q}", stream=s["stream"], config=cfg)

        async def call() -> int | str:
            msgs = await sub.fetch(s["batch"], timeout=s["request_timeout"])
            if msgs and msgs[-1].metadata.num_pending == 0:
                self._done.add(q)
            return len(msgs)

        return call

    async def _nats_pop(self) -> list[Any]:
        """The durable pull consumer of the stream (explicit acks, ``ack_wait`` the
        receive's invisible time) and one subscription to it per client, each on its
        own connection; the drain's target is the stream's message count."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

        s = self.spec
        nc = await nats_connect(s["servers"], connect_timeout=2)
        self._closers.append(nc.close)
        js = nc.jetstream(timeout=s["request_timeout"])
        s["pop_messages"] = (await js.stream_info(s["stream"])).state.messages
        await js.add_consumer(
            s["stream"],
            ConsumerConfig(
                durable_name=NATS_POP_CONSUMER,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=s["invisible_ms"] / 1000,
                max_ack_pending=4 * s["clients"] * s["batch"],
                max_waiting=max(512, 2 * s["clients"]),
            ),
        )
        subs = []
        for k in range(s["clients"]):
            c = await nats_connect(s["servers"][k % 3 :] + s["servers"][: k % 3], connect_timeout=2)
            self._closers.append(c.close)
            cjs = c.jetstream(timeout=s["request_timeout"])
            subs.append(await cjs.pull_subscribe_bind(NATS_POP_CONSUMER, stream=s["stream"]))
        return subs

    async def _nats_pop_client(self, sub: Any) -> None:
        """http_bench's ``pop_client`` for NATS: fetch ``batch``, ack each message,
        again, until the stream's messages are acked (or the time is up)."""
        s, p = self.spec, self.pop
        wait_s = max(0.001, s["wait_ms"] / 1000)
        sync = s.get("nats_ack") == "ack_sync"
        checked = False
        while time.monotonic() < self.stop_at and p.acked < s["pop_messages"]:
            if time.monotonic() - self.last_ack > s["request_timeout"]:
                break  # nothing acked for that long: the run ends
            t0 = time.monotonic()
            try:
                msgs = await sub.fetch(s["batch"], timeout=wait_s)
            except TimeoutError:  # (nats-py's too) nothing to fetch within the wait
                p.receives += 1
                p.empty += 1
                continue
            except (OSError, *NATS_ERRORS) as e:
                self.tally.error(type(e).__name__)
                await asyncio.sleep(0.05)
                continue
            t1 = time.monotonic()
            p.receives += 1
            if not msgs:
                p.empty += 1
                continue
            p.receive_latencies.append(t1 - t0)
            if not checked:
                if any(len(m.data) != s["body_size"] for m in msgs):
                    raise WrongAnswerError("nats_pop: a fetched message's body is not whole")
                checked = True
            t2 = time.monotonic()
            try:
                if sync:
                    await asyncio.gather(*(m.ack_sync(s["request_timeout"]) for m in msgs))
                else:
                    for m in msgs:
                        await m.ack()
            except (OSError, TimeoutError, *NATS_ERRORS) as e:
                self.tally.error(type(e).__name__)  # redelivered after ack_wait
                continue
            self._pop_round(t0, t2, time.monotonic(), len(msgs), 0)

    # -- etcd ranges --

    async def _etcd_range(self, q: int) -> Call:
        """A reader of the keys ``<key_prefix><q>/...`` in key order, pages of ``batch``
        (serializable reads: the member's own copy, like a pull)."""
        s = self.spec
        conn = ChunkedConnection(s["host"], s["ports"][q % len(s["ports"])])
        await conn.connect()
        self._closers.append(conn.aclose)
        start, end = etcd_key_range(f"{s['key_prefix']}{q}/")
        path = "/v3/kv/range"

        async def call() -> int | str:
            nonlocal start
            body = b'{"key":"%s","range_end":"%s","limit":%d,"serializable":true}' % (
                start,
                end,
                s["batch"],
            )
            req = (path, _post_head(conn.host, conn.port, path, len(body)), body)
            try:
                status, data = await conn.request(req)
            except BaseException:
                conn.close()
                raise
            if status != 200:
                return f"HTTP {status}"
            doc = orjson.loads(data)
            kvs = doc.get("kvs", [])
            if kvs:
                start = _b64(base64.b64decode(kvs[-1]["key"]) + b"\0")
            if not doc.get("more"):
                self._done.add(q)
            return len(kvs)

        return call

    async def _reader(self, q: int, call: Call) -> None:
        """A catch-up reader: ``call`` until its queue is read to the end."""
        while q not in self._done and time.monotonic() < self.stop_at:
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.spec["request_timeout"]):
                    n = await call()
            except (OSError, EOFError, asyncio.IncompleteReadError, HttpError, TimeoutError) as e:
                self.tally.error(type(e).__name__)
                await asyncio.sleep(0.02)
                continue
            t1 = time.monotonic()
            if isinstance(n, str):
                self.tally.error(n)
                await asyncio.sleep(0.02)
                continue
            self.progress.value += 1
            self.tally.latencies.append(t1 - t0)
            self.tally.requests += 1
            self.tally.messages += n
            self.pull_done = max(self.pull_done, t1)

    # -- pysyncobj --

    async def _pysyncobj_calls(self) -> list[Call]:
        import pysyncobj_baseline as psb  # noqa: PLC0415  # needs pysyncobj (the `bench` extra)

        s = self.spec
        members = [psb.Member(a, p) for a, p in zip(s["raft"], s["control"], strict=True)]
        state = {"leader": await psb.find_leader(members, s["request_timeout"])}
        pool = [os.urandom(s["body_size"]) for _ in range(256)]
        frames = [
            psb._append_frame([pool[(f * s["batch"] + k) % 256] for k in range(s["batch"])])
            for f in range(8)
        ]
        out: list[Call] = []
        for k in range(s["clients"]):
            out.append(self._pysyncobj_call(psb, members, state, frames, k))
        return out

    def _pysyncobj_call(
        self, psb: Any, members: list[Any], state: dict[str, int], frames: list[bytes], k: int
    ) -> Call:
        conn: list[Any] = []
        i = k

        async def call() -> int | str:
            nonlocal i
            if not conn:
                conn.extend(await psb._open(members[state["leader"]].control_port, 2.0))
            i += 1
            try:
                code, why = await psb._exchange(conn[0], conn[1], frames[i % len(frames)], 3600)
            except BaseException:
                conn[1].close()
                conn.clear()
                raise
            if code == psb.OK:
                return self.spec["batch"]
            if code == psb.NOT_LEADER:
                state["leader"] = await psb.find_leader(members, self.spec["request_timeout"])
                conn[1].close()
                conn.clear()
            return f"code {code} {why[:40].decode(errors='replace')}".strip()

        return call

    # -- the run --

    async def run(self) -> dict[str, Any]:
        s = self.spec
        if s["kind"] in ("pull", "blob", "pop"):
            result = await super().run()
            result["p999_ms"] = _ms(_pct(self.tally.latencies, 0.999))
            return result
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._done: set[int] = set()
        try:
            return await self._run_own()
        finally:
            for close in self._closers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), 5)

    async def _run_own(self) -> dict[str, Any]:
        s = self.spec
        kind = s["kind"]
        if kind in ("nats_fetch", "etcd_range"):  # readers made before the clock starts
            reader = self._nats_fetch if kind == "nats_fetch" else self._etcd_range
            readers = [await reader(q) for q in range(s["queues"])]
        elif kind == "nats_pop":
            subs = await self._nats_pop()
        else:
            makers = {
                "http": self._http_calls,
                "nats": self._nats_calls,
                "pysyncobj": self._pysyncobj_calls,
            }
            calls = await makers[kind]()
        t0 = time.monotonic()
        self.measure_from = t0 + s["warmup"]
        self.stop_at = self.measure_from + s["seconds"]
        self.last_ack = t0
        window = asyncio.create_task(self._window_events())
        if kind in ("nats_fetch", "etcd_range"):
            await asyncio.gather(*(self._reader(q, c) for q, c in enumerate(readers)))
        elif kind == "nats_pop":
            await asyncio.gather(*(self._nats_pop_client(sub) for sub in subs))
        else:
            await asyncio.gather(*(self._client(c) for c in calls))
        ended = time.monotonic()
        if not window.done():  # the reads or the budget ended before the time was up
            window.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await window
            if self.window_started:
                self.conn.send({"event": "window_end"})
        seconds = s["seconds"]
        if self.pull_done:
            seconds = min(seconds, self.pull_done - self.measure_from)
        elif ended < self.stop_at:
            seconds = max(1e-3, ended - self.measure_from)
        result = self._result(seconds)
        if kind == "nats_pop":
            self.pop.redelivered = None  # (not read from the messages' metadata)
            result.update(self.pop.figures())
        return result

    def _result(self, seconds: float) -> dict[str, Any]:
        t = self.tally
        s = self.spec
        return {
            "requests": t.requests,
            "messages": t.messages,
            "seconds": round(seconds, 3),
            "req_per_s": round(t.requests / seconds, 1),
            "msgs_per_s": round(t.messages / seconds),
            "mb_per_s": round(t.messages * s["body_size"] / seconds / 1e6, 2),
            "p50_ms": _ms(_pct(t.latencies, 0.50)),
            "p99_ms": _ms(_pct(t.latencies, 0.99)),
            "p999_ms": _ms(_pct(t.latencies, 0.999)),
            "max_ms": _ms(max(t.latencies, default=None)),
            "avg_response_bytes": 0,
            "errors": sum(t.errors.values()),
            "error_kinds": t.errors,
            "answered_messages": self.answered,
        }


def _nats_errors() -> tuple[type[BaseException], ...]:
    try:
        import nats.errors  # noqa: PLC0415
    except ImportError:
        return ()
    return (nats.errors.Error,)


def main(conn: Connection, progress: Any) -> None:
    """The load generator process: http_bench's loop over scenarios, with ``PeerLoadGen``."""
    global NATS_ERRORS  # noqa: PLW0603
    NATS_ERRORS = _nats_errors()
    loadgen_main(conn, progress, PeerLoadGen)
