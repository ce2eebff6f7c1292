"""Failover: kill -9 of the leader under a produce load, ``--kills`` rounds, and what was lost.

Every system takes the same load: 4 producers, each sending batches of 10 messages of
``--body-size`` bytes back to back, every message carrying its own id
(``<producer>-<batch>-<k>``), waiting ``--client-timeout`` s for an answer. Each round
waits until every replica caught up, lets the load run ``--fault-after`` s, kills the
leader with SIGKILL, measures the time to the next acknowledged write, then restarts the
killed replica. After the last round every message is read back: ``lost`` counts the
acknowledged ids that are not there (Jepsen's "lost"; duplicates are not counted).

- LedgerMQ: ``bench/failover_bench.py`` as it is (``Load``'s producer threads with the
  project's ``Producer`` and its producer session, ``_round``: kill -9 of the master,
  ``first_ms`` = the first batch acknowledged by another node), with the producers'
  bodies made unique by ``CountingLoad``;
- NATS, etcd, pysyncobj: the same load from asyncio tasks (``PeerFailover``): NATS
  publishes with a ``Nats-Msg-Id`` (JetStream deduplicates a retry), etcd writes one
  key per message in a transaction (a retry rewrites the same keys), pysyncobj appends
  through the node's control port. The unavailability is the time from the kill to the
  first acknowledgement the new leader gave: one of a request sent after the kill, or
  from a later Raft term (etcd's answers carry theirs), or, where the answer does not
  say, one arriving more than ``GRACE_S`` (100 ms) after the kill (the dead leader may
  have committed a request that a survivor answers late on a busy machine). The
  leader is the NATS stream leader of ``FO``, etcd's Raft leader, pysyncobj's leader.
  pysyncobj cannot be read back: its ``lost`` is acknowledged minus applied entries
  (a count, not ids).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import failover_bench
import httpx

from ledgermq.client import LedgerMQError, Producer

from . import procs
from .loadgen import nats_connect
from .systems import Etcd, LedgerMQ, Nats, PySyncObj, System

PRODUCERS = 4
BATCH = 10


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50": round(statistics.median(ordered), 1),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "max": round(ordered[-1], 1),
    }


def _pad(ident: str, size: int) -> str:
    return ident + "|" + "x" * max(0, size - len(ident) - 1)


# ---- LedgerMQ: bench/failover_bench.py -------------------------------------------------------


class CountingLoad(failover_bench.Load):
    """``failover_bench.Load`` whose messages carry unique ids, remembered when acked."""

    def __init__(self, c: Any, a: argparse.Namespace) -> None:
        super().__init__(c, a)
        self.body_size = a.body_size
        self.acked_ids: set[str] = set()

    def _run(self, i: int) -> None:
        seq = 0
        with Producer(self.brokers, settings=self.settings) as p:
            while not self.stop.is_set():
                ids = [f"{i}-{seq}-{k}" for k in range(self.batch)]
                seq += 1
                try:
                    p.send(failover_bench.TOPIC, [{"body": _pad(x, self.body_size)} for x in ids])
                except LedgerMQError:
                    with self.lock:
                        self.errors += 1
                    continue
                with self.lock:
                    self.acks[i].append((time.monotonic(), p.master))
                    self.acked_ids.update(ids)


def _ledgermq_ids(s: LedgerMQ) -> list[str]:
    """Every message id in topic ``fo``, read from the master."""
    url = s.cluster.urls[s.master()]
    out: list[str] = []
    with httpx.Client(timeout=s.a.timeout) as client:
        for q in range(8):
            offset = 0
            while True:
                r = client.get(
                    f"{url}/v1/topics/{failover_bench.TOPIC}/queues/{q}/messages",
                    params={"offset": offset, "max_messages": 1000},
                )
                r.raise_for_status()
                doc = r.json()
                for m in doc.get("messages", []):
                    body = m["body"]
                    if m.get("encoding") == "base64":
                        body = base64.b64decode(body).decode(errors="replace")
                    out.append(body.split("|", 1)[0])
                if doc["status"] != "FOUND" or doc["next_offset"] <= offset:
                    break
                offset = doc["next_offset"]
    return out


def ledgermq_failover(s: LedgerMQ, a: argparse.Namespace) -> dict[str, Any]:
    fa = argparse.Namespace(
        producers=PRODUCERS,
        batch=BATCH,
        body_size=a.body_size,
        client_timeout=a.client_timeout,
        timeout=a.timeout,
        fault_after=a.fault_after,
        mode="kill",
    )
    load = CountingLoad(s.cluster, fa)
    load.start()
    rounds = []
    stopped = None
    try:
        for k in range(a.kills):
            r = failover_bench._round(s.cluster, load, fa)
            rounds.append({"unavailable_ms": r["first_ms"], "all_ms": r["all_ms"], **r})
            print(f"failover | {s.key} round {k + 1}: {r['first_ms']} ms", file=sys.stderr)
    except FAILURES as e:
        stopped = f"round {len(rounds) + 1}: {type(e).__name__}: {e}"
    finally:
        load.close()
    present = None
    try:
        for n in s.cluster.ids:
            if not s.cluster.alive(n):
                s.cluster.start(n)
        failover_bench._caught_up(s.cluster, a.timeout)
        present = _ledgermq_ids(s)
    except (*FAILURES, httpx.HTTPError) as e:
        stopped = stopped or f"read back: {type(e).__name__}: {e}"
    return _verdict(s.key, rounds, load.acked_ids, present, load.errors, None, stopped)


def _verdict(
    key: str,
    rounds: list[dict[str, Any]],
    acked: set[str],
    present: list[str] | None,
    errors: int,
    applied: int | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    """The summary of the rounds done; ``stopped`` says why they ended early."""
    out: dict[str, Any] = {
        "kills": len(rounds),
        "stopped": stopped,
        "unavailable_ms": summary([r["unavailable_ms"] for r in rounds]),
        "acked_messages": len(acked),
        "client_errors": errors,
        "rounds": rounds,
    }
    if present is not None:
        seen = set(present)
        out["lost"] = len(acked - seen)
        out["duplicates"] = len(present) - len(seen)
        out["lost_check"] = "ids read back"
    elif applied is not None:
        out["lost"] = max(0, len(acked) - applied)
        out["lost_check"] = "count: acknowledged - applied entries"
    print(
        f"failover | {key}: unavailable {out['unavailable_ms']}, lost {out.get('lost')}"
        + (f", stopped at {stopped}" if stopped else ""),
        file=sys.stderr,
    )
    return out


# ---- the peers: one asyncio load --------------------------------------------------------------

# Send one batch; its answer's Raft term if the answer says (etcd), else None.
Write = Callable[[list[str]], Awaitable[int | None]]
# An acknowledgement of a request sent before the kill counts as the new leader's only
# this long after it (or from a later term): the dead leader may have committed the
# request and a survivor answered it late on a busy machine.
GRACE_S = 0.1


class PeerFailover:
    """The rounds against a peer, given its hooks (writer, leader, caught-up, read-back)."""

    def __init__(self, s: System, a: argparse.Namespace) -> None:
        self.s = s
        self.a = a
        self.acks: list[tuple[float, float, int | None]] = []  # (sent, acknowledged, term)
        self.acked: set[str] = set()
        self.errors = 0
        self.stop = asyncio.Event()

    async def producer(self, i: int, write: Write) -> None:
        seq = 0
        while not self.stop.is_set():
            ids = [f"{i}-{seq}-{k}" for k in range(BATCH)]
            seq += 1
            sent = time.monotonic()
            try:
                async with asyncio.timeout(self.a.client_timeout):
                    term = await write(ids)
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.01)
                continue
            self.acks.append((sent, time.monotonic(), term))
            self.acked.update(ids)

    def first_ack_after(self, t0: float, term0: int | None) -> float | None:
        """The first acknowledgement that the new leader gave: of a request sent after
        the kill, or from a later term than the dead leader's, or (no term known) later
        than ``GRACE_S`` after the kill."""
        got = []
        for sent, acked, term in self.acks:
            if acked <= t0:
                continue
            if term is not None and term0 is not None:
                new = term > term0
            else:
                new = sent >= t0 or acked - t0 > GRACE_S
            if new:
                got.append(acked)
        return min(got) if got else None

    async def wait(self, cond: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + self.a.timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.s.key} failover: {what}: not within {self.a.timeout} s")
            await asyncio.sleep(0.005)

    async def run(self, hooks: PeerHooks) -> dict[str, Any]:
        await hooks.caught_up()
        await hooks.begin()
        writers = [await hooks.writer(i) for i in range(PRODUCERS)]
        tasks = [asyncio.create_task(self.producer(i, w)) for i, w in enumerate(writers)]
        rounds: list[dict[str, Any]] = []
        stopped = None
        try:
            for k in range(self.a.kills):
                await hooks.caught_up()
                n = len(self.acks)
                await self.wait(lambda n=n: len(self.acks) >= n + PRODUCERS, "load before the kill")
                await asyncio.sleep(self.a.fault_after)
                leader, term0 = await hooks.leader()
                t0 = time.monotonic()
                hooks.group.kill(leader)
                t1 = await self.wait(
                    lambda t0=t0, term0=term0: self.first_ack_after(t0, term0),
                    "an ack after the kill",
                )
                ms = round((t1 - t0) * 1000, 1)
                rounds.append({"killed": leader, "unavailable_ms": ms})
                print(f"failover | {self.s.key} round {k + 1}: {ms} ms", file=sys.stderr)
                hooks.group.start(leader)
        except FAILURES as e:
            stopped = f"round {len(rounds) + 1}: {type(e).__name__}: {e}"
        finally:
            self.stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
            for close in hooks.closers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), 5)
        present, applied = None, None
        try:
            for i in range(len(hooks.group.commands)):
                if not hooks.group.alive(i):
                    hooks.group.start(i)
            await hooks.caught_up()
            present, applied = await hooks.read_back()
        except FAILURES as e:
            stopped = stopped or f"read back: {type(e).__name__}: {e}"
        out = _verdict(self.s.key, rounds, self.acked, present, self.errors, applied, stopped)
        out["server_log"] = _critical_lines(hooks.group)
        return out


FAILURES = (TimeoutError, RuntimeError, OSError)


def _critical_lines(group: procs.Group, most: int = 3) -> list[str]:
    """The first distinct CRITICAL/FATAL/panic lines of the replicas' logs (pysyncobj
    says so when a restarted node's state machine diverged)."""
    out: list[str] = []
    for i in range(len(group.commands)):
        try:
            lines = group.log(i).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if any(w in line for w in ("CRITICAL", "FATAL", "panic:")) and line not in out:
                out.append(f"{group.name}{i}: {line[:300]}")
    return out[:most]


class PeerHooks:
    """What ``PeerFailover`` needs of a peer."""

    group: procs.Group
    closers: list[Callable[[], Awaitable[Any]]]

    async def begin(self) -> None:
        """Before the load starts."""

    async def writer(self, i: int) -> Write:
        raise NotImplementedError

    async def leader(self) -> tuple[int, int | None]:
        """The leader's index, and its term if the answers carry one."""
        raise NotImplementedError

    async def caught_up(self) -> None:
        raise NotImplementedError

    async def read_back(self) -> tuple[list[str] | None, int | None]:
        raise NotImplementedError


class NatsHooks(PeerHooks):
    def __init__(self, s: Nats, a: argparse.Namespace) -> None:
        self.s, self.a, self.group = s, a, s.group
        self.closers = []
        self.pad = os.urandom(max(0, a.body_size - 16)).hex()[: max(0, a.body_size - 16)]

    async def _connect(self, i: int = 0) -> Any:
        servers = self.s.servers[i % 3 :] + self.s.servers[: i % 3]
        nc = await nats_connect(
            servers, connect_timeout=1, reconnect_time_wait=0.05, max_reconnect_attempts=-1
        )
        self.closers.append(nc.close)
        return nc

    async def writer(self, i: int) -> Write:
        js = (await self._connect(i)).jetstream(timeout=self.a.client_timeout)

        async def write(ids: list[str]) -> None:
            futs = [
                await js.publish_async(
                    f"fo.{i}", _pad(x, self.a.body_size).encode(), headers={"Nats-Msg-Id": x}
                )
                for x in ids
            ]
            await asyncio.gather(*futs)
            return None

        return write

    async def _info(self) -> Any:
        nc = await self._connect()
        try:
            return await nc.jetstream(timeout=1).stream_info("FO")
        finally:
            await nc.close()

    async def leader(self) -> tuple[int, int | None]:
        info = await self._info()
        return int(info.cluster.leader.removeprefix("n")), None

    async def caught_up(self) -> None:
        deadline = time.monotonic() + self.a.timeout
        while True:
            with contextlib.suppress(Exception):
                if all(self.s.healthy(i) for i in range(3)):
                    info = await self._info()
                    reps = info.cluster.replicas or []
                    if info.cluster.leader and len(reps) == 2 and all(r.current for r in reps):
                        return
            if time.monotonic() > deadline:
                raise TimeoutError("nats: FO replicas not current")
            await asyncio.sleep(0.05)

    async def read_back(self) -> tuple[list[str] | None, int | None]:
        from nats.js.api import AckPolicy, ConsumerConfig  # noqa: PLC0415

        nc = await self._connect()
        out: list[str] = []
        try:
            js = nc.jetstream(timeout=self.a.timeout)
            info = await js.stream_info("FO")
            total = info.state.messages
            sub = await js.pull_subscribe(
                "fo.>", stream="FO", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
            )
            while len(out) < total:
                for m in await sub.fetch(1000, timeout=5):
                    out.append(m.data.split(b"|", 1)[0].decode())
        finally:
            await nc.close()
        return out, None


class EtcdHooks(PeerHooks):
    def __init__(self, s: Etcd, a: argparse.Namespace) -> None:
        self.s, self.a, self.group = s, a, s.group
        self.closers = []
        self.value = base64.b64encode(os.urandom(a.body_size)).decode()

    async def writer(self, i: int) -> Write:
        client = httpx.AsyncClient(timeout=self.a.client_timeout)
        self.closers.append(client.aclose)
        member = [i % 3]

        async def write(ids: list[str]) -> None:
            ops = [
                {"request_put": {"key": base64.b64encode(f"fo/{x}".encode()).decode(),
                                 "value": self.value}}
                for x in ids
            ]  # fmt: skip
            try:
                r = await client.post(self.s.urls[member[0]] + "/v3/kv/txn", json={"success": ops})
                r.raise_for_status()
            except Exception:
                member[0] = (member[0] + 1) % 3  # the next member, next time
                raise
            return int(r.json()["header"]["raft_term"])

        return write

    async def leader(self) -> tuple[int, int | None]:
        i = await asyncio.to_thread(self.s.leader)
        st = None if i is None else await asyncio.to_thread(self.s.status, i)
        if i is None or st is None:
            raise RuntimeError("etcd: no agreed leader")
        return i, int(st["raftTerm"])

    async def caught_up(self) -> None:
        """Every member healthy, then every member applied what the most advanced one
        had when asked (the load keeps writing; a v2 ``/health`` check is itself a Raft
        entry, so it is not polled in the second loop)."""

        def healthy() -> bool:
            return all(self.s.healthy(i) for i in range(3))

        target = [0]

        def applied() -> bool:
            st = [self.s.status(i) for i in range(3)]
            if None in st:
                return False
            if not target[0]:
                target[0] = max(int(x["raftIndex"]) for x in st if x)
            return min(int(x["raftAppliedIndex"]) for x in st if x) >= target[0]

        deadline = time.monotonic() + self.a.timeout
        for cond in (healthy, applied):
            while not await asyncio.to_thread(cond):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd: members not caught up ({cond.__name__})")
                await asyncio.sleep(0.05)

    async def read_back(self) -> tuple[list[str] | None, int | None]:
        start, end = base64.b64encode(b"fo/").decode(), base64.b64encode(b"fo0").decode()
        out: list[str] = []
        async with httpx.AsyncClient(timeout=self.a.timeout) as client:
            while True:
                r = await client.post(
                    self.s.urls[(await self.leader())[0]] + "/v3/kv/range",
                    json={"key": start, "range_end": end, "limit": 10000, "keys_only": True},
                )
                r.raise_for_status()
                doc = r.json()
                kvs = doc.get("kvs", [])
                out += [base64.b64decode(kv["key"]).decode()[3:] for kv in kvs]
                if not doc.get("more") or not kvs:
                    return out, None
                start = base64.b64encode(base64.b64decode(kvs[-1]["key"]) + b"\0").decode()


class PySyncObjHooks(PeerHooks):
    def __init__(self, s: PySyncObj, a: argparse.Namespace) -> None:
        import pysyncobj_baseline as psb  # noqa: PLC0415

        self.s, self.a, self.group, self.psb = s, a, s.group, psb
        self.closers = []
        self.members = [psb.Member(r, p) for r, p in zip(s.raft, s.control, strict=True)]
        self.current = 0

    async def writer(self, i: int) -> Write:
        psb = self.psb
        conn: list[Any] = []

        async def write(ids: list[str]) -> None:
            frame = psb._append_frame([_pad(x, self.a.body_size).encode() for x in ids])
            try:
                if not conn:
                    conn.extend(await psb._open(self.members[self.current].control_port, 0.5))
                code, _ = await psb._exchange(conn[0], conn[1], frame, self.a.client_timeout)
            except BaseException:
                if conn:
                    conn[1].close()
                    conn.clear()
                await self._find()
                raise
            if code != psb.OK:
                conn[1].close()
                conn.clear()
                await self._find()
                raise RuntimeError(f"pysyncobj answered {code}")
            return None

        return write

    async def _find(self) -> None:
        with contextlib.suppress(TimeoutError):
            self.current = await self.psb.find_leader(self.members, 0.5)

    async def leader(self) -> tuple[int, int | None]:
        self.current = await self.psb.find_leader(self.members, self.a.timeout)
        return self.current, None

    async def _statuses(self) -> list[dict[str, Any] | None]:
        return list(await asyncio.gather(*(self.psb.query_status(p) for p in self.s.control)))

    async def caught_up(self) -> None:
        deadline = time.monotonic() + self.a.timeout
        target = None
        while True:
            st = await self._statuses()
            if all(x is not None and x["is_ready"] for x in st):
                if target is None:
                    target = max(x["commit_idx"] for x in st if x)
                if min(x["last_applied"] for x in st if x) >= target:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("pysyncobj: nodes not caught up")
            await asyncio.sleep(0.05)

    async def _entries(self) -> int:
        return max(x["entries"] for x in await self._statuses() if x is not None)

    async def begin(self) -> None:
        self.entries_before = await self._entries()

    async def read_back(self) -> tuple[list[str] | None, int | None]:
        return None, await self._entries() - self.entries_before


def peer_failover(s: System, a: argparse.Namespace) -> dict[str, Any]:
    hooks: PeerHooks
    if isinstance(s, Nats):
        hooks = NatsHooks(s, a)
    elif isinstance(s, Etcd):
        hooks = EtcdHooks(s, a)
    elif isinstance(s, PySyncObj):
        hooks = PySyncObjHooks(s, a)
    else:
        raise TypeError(s.key)
    return asyncio.run(PeerFailover(s, a).run(hooks))


def run_failover(s: System, a: argparse.Namespace) -> dict[str, Any]:
    """The failover figures of ``s`` (``not_measured`` says why there are none)."""
    if isinstance(s, LedgerMQ):
        return ledgermq_failover(s, a)
    if isinstance(s, Nats | Etcd | PySyncObj):
        return peer_failover(s, a)
    return {"not_measured": "no replicas to fail over"}
