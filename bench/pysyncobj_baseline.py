"""Baseline: replicated-append throughput and commit latency of pysyncobj, 3 local nodes.

Run from the repository root (needs ``pip install pysyncobj``)::

    python bench/pysyncobj_baseline.py run [--duration 20] [--base-port 23000]
                                           [--batch 64] [--in-flight 16] [--body-size 1024]
                                           [--bodies random|zeros] [--append-period 0.1]
                                           [--workdir DIR] [--keep-files]

It prints one JSON object on stdout; the progress bar goes to stderr.

What is measured
----------------
Three pysyncobj nodes run as separate processes on 127.0.0.1. Each node is a ``SyncObj`` whose
only replicated method, ``append(body)``, counts the body and its bytes (the bodies themselves
are not kept in the state machine, but every body travels through the Raft log: it is part of
the pickled command that the leader appends to its journal, sends to the followers in
AppendEntries, and that every node applies once it is committed). The journal is pysyncobj's
``FileJournal`` (``journalFile``) and log compaction writes ``fullDumpFile``, both under the
node's ``--journal-dir``. Note that pysyncobj's file journal writes through ``mmap`` and never
fsyncs, so its "durability" is the page cache.

Bodies are random bytes by default. pysyncobj zlib-compresses (level 3) every message between
nodes, so the body content matters a lot to it: random bodies are incompressible and make zlib
the leader's main cost, ``--bodies zeros`` is its best case. Compare like with like.

pysyncobj has no client protocol, so each node also runs a tiny control server on
``--control-port``: a client sends ``APPEND`` frames carrying N bodies, the node calls
``append(body, callback=...)`` once per body (non-blocking) and answers the frame when all N
callbacks have fired, i.e. when the leader has applied all N committed entries. The load
generator is a separate client (the process calling :func:`run_pysyncobj`), not the leader.
It keeps ``in_flight`` frames of ``batch`` bodies outstanding against the leader (one TCP
connection per outstanding frame) for ``duration_s`` seconds, then waits for the frames still
in flight.

Reported: entries acknowledged, the time from the first send to the last acknowledgement,
entries/s, MB/s (10^6 bytes of bodies per second), and the p50/p99 of the per-frame commit
latency (send of the frame until its acknowledgement), plus the number of frames that failed.

Wire format of the control port (all integers big-endian)::

    request  = u32 length | u8 op | payload
        op 1 APPEND: u32 count | count x (u32 size | body)
        op 2 STATUS: (empty)
    response = u32 length | u8 code | payload
        code 0 OK:   APPEND -> u32 count | u64 index of the last body; STATUS -> JSON object
        code 1 NOT_LEADER, 2 FAILED, 3 TIMEOUT, 4 BAD_REQUEST: UTF-8 text (the leader's
        Raft address for NOT_LEADER, the pysyncobj FAIL_REASON for FAILED)

Node mode (started by :func:`run_pysyncobj`, one process per node)::

    python bench/pysyncobj_baseline.py node --self 127.0.0.1:23000 \\
        --partners 127.0.0.1:23001,127.0.0.1:23002 --control-port 23100 --journal-dir DIR

A node stops on SIGTERM/SIGINT and when its parent process goes away.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pysyncobj import SyncObj, SyncObjConf, replicated  # type: ignore[import-untyped]
from tqdm import tqdm

log = logging.getLogger("pysyncobj_baseline")

MB = 1_000_000  # throughput is reported in decimal MB/s, like bench/store_bench.py
CONTROL_PORT_OFFSET = 100  # node i: Raft port base_port + i, control port base_port + 100 + i
NODES = 3
BodyKind = Literal["random", "zeros"]

OP_APPEND = 1
OP_STATUS = 2

OK = 0
NOT_LEADER = 1
FAILED = 2
TIMEOUT = 3
BAD_REQUEST = 4

MAX_FRAME = 64 << 20
_LEN = struct.Struct(">I")
_APPEND_HEAD = struct.Struct(">BI")  # op, count
_APPEND_OK = struct.Struct(">BIQ")  # code, count, last index

# pysyncobj settings shared by every node (the node CLI can override the tunable ones).
RAFT_MIN_TIMEOUT_S = 0.6  # election timeout drawn from [0.6, 1.2) s, like a 600 ms election
RAFT_MAX_TIMEOUT_S = 1.2  # timeout with Raft's usual randomisation up to 2x
DEFAULT_APPEND_PERIOD_S = 0.1
DEFAULT_BATCH_BYTES = 1 << 20
DEFAULT_COMPACTION_ENTRIES = 50_000


# ---- node ------------------------------------------------------------------------------


class ReplicatedLog(SyncObj):  # type: ignore[misc]
    """An append-only log replicated by pysyncobj; the state machine keeps counters only."""

    def __init__(self, self_address: str, partners: Sequence[str], conf: Any) -> None:
        super().__init__(self_address, list(partners), conf)
        # Attributes set after SyncObj.__init__ are the replicated state (pysyncobj serialises
        # them into fullDumpFile at log compaction).
        self.entries = 0
        self.total_bytes = 0

    @replicated  # type: ignore[untyped-decorator]
    def append(self, body: bytes) -> int:
        """Append one body; return its 1-based position among the appended bodies."""
        self.entries += 1
        self.total_bytes += len(body)
        return self.entries


def make_conf(
    journal_dir: Path,
    *,
    append_period: float = DEFAULT_APPEND_PERIOD_S,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    compaction_entries: int = DEFAULT_COMPACTION_ENTRIES,
    use_batch: bool = True,
) -> Any:
    """The ``SyncObjConf`` of a benchmark node (tuned for throughput; files in ``journal_dir``)."""
    return SyncObjConf(
        # Leader -> follower AppendEntries cadence. With appendEntriesUseBatch, pysyncobj sends
        # new entries only every appendEntriesPeriod, so this is its replication batching
        # interval as well as its heartbeat.
        appendEntriesPeriod=append_period,
        appendEntriesUseBatch=use_batch,
        appendEntriesBatchSizeBytes=batch_bytes,
        raftMinTimeout=max(RAFT_MIN_TIMEOUT_S, 3 * append_period + 0.01),
        raftMaxTimeout=max(RAFT_MAX_TIMEOUT_S, 6 * append_period + 0.02),
        connectionTimeout=3.5,
        leaderFallbackTimeout=5.0,
        autoTickPeriod=0.01,
        commandsQueueSize=1_000_000,
        # Fail fast instead of queueing commands while there is no leader.
        commandsWaitLeader=False,
        dynamicMembershipChange=False,
        journalFile=str(journal_dir / "journal.bin"),
        fullDumpFile=str(journal_dir / "dump.bin"),
        logCompactionMinEntries=compaction_entries,
        sendBufferSize=1 << 20,
        recvBufferSize=1 << 20,
        bindRetryTime=0.5,
        maxBindRetries=20,
    )


class _PendingBatch:
    """Counts the callbacks of one APPEND frame; resolves ``future`` after the last one."""

    __slots__ = ("first_error", "future", "last_index", "lock", "loop", "remaining")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.remaining = count
        self.first_error: int | None = None
        self.last_index = 0
        self.lock = threading.Lock()
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def on_result(self, result: Any, error: int) -> None:
        """pysyncobj callback; runs on pysyncobj's tick thread (or the caller's, on QUEUE_FULL)."""
        with self.lock:
            self.remaining -= 1
            if error != 0:
                if self.first_error is None:
                    self.first_error = error
            elif isinstance(result, int) and result > self.last_index:
                self.last_index = result
            done = self.remaining == 0
        if done:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the node is stopping
                self.loop.call_soon_threadsafe(_resolve, self.future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _frame(code_or_op: int, payload: bytes = b"") -> bytes:
    return _LEN.pack(1 + len(payload)) + bytes((code_or_op,)) + payload


def _status(node: ReplicatedLog) -> dict[str, Any]:
    leader = node._getLeader()
    return {
        "self": node.selfNode.id,
        "is_leader": bool(node._isLeader()),
        "leader": None if leader is None else leader.id,
        "is_ready": bool(node.isReady()),
        "has_quorum": bool(node.hasQuorum),
        "term": node.raftCurrentTerm,
        "commit_idx": node.raftCommitIndex,
        "last_applied": node.raftLastApplied,
        "entries": node.entries,
        "bytes": node.total_bytes,
    }


async def _handle_append(node: ReplicatedLog, payload: memoryview, timeout: float) -> bytes:
    if len(payload) < 4:
        return _frame(BAD_REQUEST, b"short APPEND frame")
    (count,) = struct.unpack_from(">I", payload, 0)
    bodies: list[bytes] = []
    pos = 4
    for _ in range(count):
        if pos + 4 > len(payload):
            return _frame(BAD_REQUEST, b"truncated APPEND frame")
        (size,) = struct.unpack_from(">I", payload, pos)
        pos += 4
        if pos + size > len(payload):
            return _frame(BAD_REQUEST, b"truncated APPEND body")
        bodies.append(bytes(payload[pos : pos + size]))
        pos += size
    if not node._isLeader():
        leader = node._getLeader()
        return _frame(NOT_LEADER, b"" if leader is None else leader.id.encode())
    if not bodies:
        return _LEN.pack(_APPEND_OK.size) + _APPEND_OK.pack(OK, 0, 0)
    pending = _PendingBatch(len(bodies), asyncio.get_running_loop())
    for body in bodies:
        node.append(body, callback=pending.on_result)
    try:
        await asyncio.wait_for(asyncio.shield(pending.future), timeout)
    except TimeoutError:
        return _frame(TIMEOUT, f"{pending.remaining} of {len(bodies)} not applied".encode())
    if pending.first_error is not None:
        return _frame(FAILED, f"pysyncobj FAIL_REASON {pending.first_error}".encode())
    return _LEN.pack(_APPEND_OK.size) + _APPEND_OK.pack(OK, len(bodies), pending.last_index)


async def _serve_connection(
    node: ReplicatedLog,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    timeout: float,
) -> None:
    try:
        while True:
            (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
            if not 1 <= length <= MAX_FRAME:
                writer.write(_frame(BAD_REQUEST, b"bad frame length"))
                break
            data = memoryview(await reader.readexactly(length))
            op = data[0]
            if op == OP_APPEND:
                reply = await _handle_append(node, data[1:], timeout)
            elif op == OP_STATUS:
                reply = _frame(OK, json.dumps(_status(node)).encode())
            else:
                reply = _frame(BAD_REQUEST, f"unknown op {op}".encode())
            writer.write(reply)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone; stopping", parent_pid)
            stop.set()
            return
        await asyncio.sleep(0.5)


async def _node_main(
    node: ReplicatedLog, control_port: int, timeout: float, parent_pid: int
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch_parent(parent_pid, stop))
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(node, r, w, timeout), "127.0.0.1", control_port
    )
    log.info("control server on 127.0.0.1:%d", control_port)
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        server.close()


def run_node(args: argparse.Namespace) -> int:
    """The ``node`` subcommand: one pysyncobj node plus its control server, until stopped."""
    parent_pid = os.getppid()
    journal_dir = Path(args.journal_dir)
    journal_dir.mkdir(parents=True, exist_ok=True)
    partners = [p for p in args.partners.split(",") if p]
    conf = make_conf(
        journal_dir,
        append_period=args.append_period,
        batch_bytes=args.batch_bytes,
        compaction_entries=args.compaction_entries,
        use_batch=not args.no_batch,
    )
    node = ReplicatedLog(args.self_address, partners, conf)
    try:
        node.waitBinded()  # bounded: maxBindRetries x bindRetryTime
        if os.getppid() != parent_pid:
            return 1
        asyncio.run(_node_main(node, args.control_port, args.request_timeout, parent_pid))
    finally:
        node.destroy()  # the tick thread closes the transport and flushes the journal
        deadline = time.monotonic() + 5.0
        while node.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if node.tick_thread_alive():
            log.error("pysyncobj tick thread did not stop within 5 s; exiting hard")
            logging.shutdown()
            os._exit(1)
    return 0


# ---- client ----------------------------------------------------------------------------


@dataclass(slots=True)
class Member:
    """One node as the client sees it: its Raft address and its control port."""

    raft_address: str
    control_port: int


@dataclass(slots=True)
class _LoadState:
    members: list[Member]
    leader: int
    entries: int = 0
    batches: int = 0
    errors: int = 0
    last_ack: float = 0.0
    latencies: list[float] = field(default_factory=list)
    leader_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes, timeout: float
) -> tuple[int, bytes]:
    async with asyncio.timeout(timeout):
        writer.write(frame)
        await writer.drain()
        (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
        if not 1 <= length <= MAX_FRAME:
            raise ConnectionError(f"bad reply length {length}")
        data = await reader.readexactly(length)
    return data[0], data[1:]


async def _open(port: int, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    async with asyncio.timeout(timeout):
        return await asyncio.open_connection("127.0.0.1", port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


async def query_status(control_port: int, timeout: float = 1.0) -> dict[str, Any] | None:
    """A node's status via its control port, or None if it does not answer in time."""
    try:
        reader, writer = await _open(control_port, timeout)
    except (OSError, TimeoutError):
        return None
    try:
        code, payload = await _exchange(reader, writer, _frame(OP_STATUS), timeout)
        if code != OK:
            return None
        status: dict[str, Any] = json.loads(payload)
        return status
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        return None
    finally:
        await _close(writer)


async def find_leader(members: Sequence[Member], timeout: float) -> int:
    """Index of the ready leader that every answering node agrees on (a majority must answer)."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = await asyncio.gather(*(query_status(m.control_port) for m in members))
        answered = [s for s in statuses if s is not None]
        leaders = [
            i for i, s in enumerate(statuses) if s is not None and s["is_leader"] and s["is_ready"]
        ]
        if len(leaders) == 1 and 2 * len(answered) > len(members):
            address = members[leaders[0]].raft_address
            if all(s["leader"] == address for s in answered):
                return leaders[0]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no agreed leader within {timeout:.0f} s: {statuses}")
        await asyncio.sleep(0.1)


def _append_frame(bodies: Sequence[bytes]) -> bytes:
    parts = [_APPEND_HEAD.pack(OP_APPEND, len(bodies))]
    for body in bodies:
        parts.append(_LEN.pack(len(body)))
        parts.append(body)
    payload = b"".join(parts)
    return _LEN.pack(len(payload)) + payload


async def _refresh_leader(state: _LoadState, seen: int, deadline: float) -> None:
    async with state.leader_lock:
        if state.leader != seen:  # another worker already found the new leader
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        with contextlib.suppress(TimeoutError):
            state.leader = await find_leader(state.members, min(remaining, 10.0))


async def _worker(
    state: _LoadState,
    frames: Sequence[bytes],
    batch: int,
    offset: int,
    deadline: float,
    request_timeout: float,
) -> None:
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    leader = state.leader
    i = offset
    try:
        while time.monotonic() < deadline:
            if conn is None or leader != state.leader:
                if conn is not None:
                    await _close(conn[1])
                    conn = None
                leader = state.leader
                try:
                    conn = await _open(state.members[leader].control_port, 2.0)
                except (OSError, TimeoutError):
                    state.errors += 1
                    await _refresh_leader(state, leader, deadline)
                    await asyncio.sleep(0.05)
                    continue
            frame = frames[i % len(frames)]
            i += 1
            sent = time.perf_counter()
            try:
                code, payload = await _exchange(conn[0], conn[1], frame, request_timeout)
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                state.errors += 1
                await _close(conn[1])
                conn = None
                await _refresh_leader(state, leader, deadline)
                continue
            acked = time.perf_counter()
            if code == OK:
                state.entries += batch
                state.batches += 1
                state.latencies.append(acked - sent)
                state.last_ack = max(state.last_ack, acked)
            else:
                state.errors += 1
                log.debug("frame failed: code %d %s", code, payload.decode(errors="replace"))
                if code == NOT_LEADER:
                    await _refresh_leader(state, leader, deadline)
                else:
                    await asyncio.sleep(0.05)
    finally:
        if conn is not None:
            await _close(conn[1])


def _percentile_ms(sorted_seconds: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile in milliseconds, rounded to 0.01 (None without samples)."""
    if not sorted_seconds:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_seconds)))
    return round(sorted_seconds[rank - 1] * 1000, 2)


async def _progress(state: _LoadState, started: float, duration_s: float) -> None:
    total = max(1, math.ceil(duration_s))
    with tqdm(total=total, unit="s", desc="pysyncobj", file=sys.stderr, leave=True) as bar:
        shown = 0
        last_entries = 0
        while True:
            await asyncio.sleep(1.0)
            elapsed = min(total, int(time.perf_counter() - started))
            bar.update(elapsed - shown)
            shown = elapsed
            bar.set_postfix(
                entries=state.entries,
                per_s=state.entries - last_entries,
                errors=state.errors,
                refresh=False,
            )
            last_entries = state.entries
            bar.refresh()


async def _run_load(
    members: list[Member],
    duration_s: float,
    body_size: int,
    batch: int,
    in_flight: int,
    leader_timeout: float,
    request_timeout: float,
    progress: bool,
    bodies: BodyKind,
) -> dict[str, Any]:
    leader = await find_leader(members, leader_timeout)
    state = _LoadState(members=members, leader=leader)
    # Bodies from a pre-built pool, so building frames costs the client no time while it
    # measures. pysyncobj zlib-compresses its messages: random bodies are its worst case.
    if bodies == "random":
        pool = [os.urandom(body_size) for _ in range(max(batch, 256))]
    else:
        pool = [bytes(body_size)]
    frames = [
        _append_frame([pool[(f * batch + k) % len(pool)] for k in range(batch)]) for f in range(8)
    ]
    # Warm-up: one frame must commit before the clock starts.
    reader, writer = await _open(members[leader].control_port, 2.0)
    try:
        code, payload = await _exchange(reader, writer, frames[0], request_timeout)
    finally:
        await _close(writer)
    if code != OK:
        raise RuntimeError(f"warm-up append failed: code {code} {payload!r}")

    started = time.perf_counter()
    state.last_ack = started
    deadline = time.monotonic() + duration_s
    ticker = asyncio.create_task(_progress(state, started, duration_s)) if progress else None
    try:
        workers = [
            asyncio.create_task(_worker(state, frames, batch, w, deadline, request_timeout))
            for w in range(in_flight)
        ]
        # Workers stop sending at the deadline; a frame in flight then finishes or times out.
        await asyncio.wait_for(
            asyncio.gather(*workers), duration_s + request_timeout + leader_timeout
        )
    finally:
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    seconds = max(state.last_ack - started, 1e-9)
    latencies = sorted(state.latencies)
    return {
        "entries": state.entries,
        "seconds": round(seconds, 3),
        "entries_per_s": round(state.entries / seconds, 1),
        "mb_per_s": round(state.entries * body_size / MB / seconds, 3),
        "p50_ms": _percentile_ms(latencies, 50),
        "p99_ms": _percentile_ms(latencies, 99),
        "errors": state.errors,
        "batches": state.batches,
        "max_ms": _percentile_ms(latencies, 100),
    }


def _check_ports_free(ports: Sequence[int]) -> None:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # Like the nodes' servers: connections of a previous run in TIME_WAIT don't count.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise RuntimeError(f"port {port} on 127.0.0.1 is not free: {e}") from e


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5.0)


def run_pysyncobj(
    duration_s: float,
    body_size: int = 1024,
    batch: int = 64,
    in_flight: int = 16,
    *,
    base_port: int,
    workdir: Path,
    progress: bool = True,
    append_period: float = DEFAULT_APPEND_PERIOD_S,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    compaction_entries: int = DEFAULT_COMPACTION_ENTRIES,
    use_batch: bool = True,
    bodies: BodyKind = "random",
    leader_timeout: float = 30.0,
    request_timeout: float = 10.0,
    keep_files: bool = False,
) -> dict[str, Any]:
    """Start 3 pysyncobj nodes, drive them from a client for ``duration_s``, stop them.

    Node i uses Raft port ``base_port + i`` and control port ``base_port + 100 + i``; its
    journal lives in a fresh directory under ``workdir`` that is deleted afterwards unless
    ``keep_files``. ``bodies`` is ``"random"`` (incompressible) or ``"zeros"``; the other
    keyword arguments after ``progress`` are the pysyncobj settings of :func:`make_conf` and
    the client's timeouts.

    Returns ``entries``, ``seconds``, ``entries_per_s``, ``mb_per_s``, ``p50_ms``, ``p99_ms``,
    ``errors`` (failed frames), ``batches`` and ``max_ms``, plus the settings of the run
    (latencies are None if no frame was acknowledged).
    Raises ``TimeoutError`` if no leader is agreed within ``leader_timeout`` and
    ``RuntimeError`` if a node exits early or a port is taken.
    """
    if bodies not in ("random", "zeros"):
        raise ValueError(f"bodies must be 'random' or 'zeros', not {bodies!r}")
    if duration_s <= 0 or body_size < 0 or batch < 1 or in_flight < 1:
        raise ValueError("need duration_s > 0, body_size >= 0, batch >= 1, in_flight >= 1")
    members = [
        Member(f"127.0.0.1:{base_port + i}", base_port + CONTROL_PORT_OFFSET + i)
        for i in range(NODES)
    ]
    _check_ports_free([base_port + i for i in range(NODES)] + [m.control_port for m in members])
    workdir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix="pysyncobj-", dir=workdir))
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for i, member in enumerate(members):
            node_dir = rundir / f"node{i}"
            node_dir.mkdir()
            partners = ",".join(m.raft_address for m in members if m is not member)
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "node",
                "--self",
                member.raft_address,
                "--partners",
                partners,
                "--control-port",
                str(member.control_port),
                "--journal-dir",
                str(node_dir),
                "--append-period",
                str(append_period),
                "--batch-bytes",
                str(batch_bytes),
                "--compaction-entries",
                str(compaction_entries),
                "--request-timeout",
                str(request_timeout),
            ]
            if not use_batch:
                cmd.append("--no-batch")
            log_path = rundir / f"node{i}.log"
            logs.append(log_path)
            with log_path.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                    )
                )

        async def main() -> dict[str, Any]:
            load = asyncio.create_task(
                _run_load(
                    members,
                    duration_s,
                    body_size,
                    batch,
                    in_flight,
                    leader_timeout,
                    request_timeout,
                    progress,
                    bodies,
                )
            )
            while not load.done():
                dead = [i for i, p in enumerate(procs) if p.poll() is not None]
                if dead:
                    load.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await load
                    i = dead[0]
                    raise RuntimeError(
                        f"node {i} exited with code {procs[i].returncode}:\n{_tail(logs[i])}"
                    )
                await asyncio.wait({load}, timeout=0.5)
            return load.result()

        result = asyncio.run(main())
    finally:
        _stop_processes(procs)
        if not keep_files:
            shutil.rmtree(rundir, ignore_errors=True)
    result.update(
        body_size=body_size,
        batch=batch,
        in_flight=in_flight,
        append_period_s=append_period,
        append_batch_bytes=batch_bytes,
        use_batch=use_batch,
        bodies=bodies,
    )
    return result


# ---- CLI -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)

    def tunables(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--append-period",
            type=float,
            default=DEFAULT_APPEND_PERIOD_S,
            help="pysyncobj appendEntriesPeriod in s: heartbeat and replication cadence",
        )
        sp.add_argument(
            "--batch-bytes",
            type=int,
            default=DEFAULT_BATCH_BYTES,
            help="pysyncobj appendEntriesBatchSizeBytes",
        )
        sp.add_argument(
            "--compaction-entries",
            type=int,
            default=DEFAULT_COMPACTION_ENTRIES,
            help="pysyncobj logCompactionMinEntries",
        )
        sp.add_argument(
            "--no-batch",
            action="store_true",
            help="appendEntriesUseBatch=False: send AppendEntries per command",
        )
        sp.add_argument(
            "--request-timeout", type=float, default=10.0, help="per-frame timeout in s"
        )

    run = sub.add_parser("run", help="start 3 nodes, run the load, print JSON")
    run.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    run.add_argument("--base-port", type=int, default=23000)
    run.add_argument("--body-size", type=int, default=1024)
    run.add_argument("--batch", type=int, default=64, help="bodies per APPEND frame")
    run.add_argument("--in-flight", type=int, default=16, help="outstanding frames")
    run.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    run.add_argument("--keep-files", action="store_true", help="keep journals and node logs")
    run.add_argument(
        "--bodies",
        choices=("random", "zeros"),
        default="random",
        help="body content: random (incompressible, default) or zeros (best case for zlib)",
    )
    run.add_argument("--no-progress", action="store_true")
    tunables(run)

    node = sub.add_parser("node", help="one pysyncobj node with its control server")
    node.add_argument("--self", dest="self_address", required=True, help="host:port for Raft")
    node.add_argument("--partners", required=True, help="comma-separated host:port")
    node.add_argument("--control-port", type=int, required=True)
    node.add_argument("--journal-dir", required=True)
    tunables(node)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.command == "node":
        return run_node(args)
    workdir: Path = args.workdir or Path(tempfile.gettempdir())
    result = run_pysyncobj(
        args.duration,
        args.body_size,
        args.batch,
        args.in_flight,
        base_port=args.base_port,
        workdir=workdir,
        progress=not args.no_progress,
        append_period=args.append_period,
        batch_bytes=args.batch_bytes,
        compaction_entries=args.compaction_entries,
        use_batch=not args.no_batch,
        bodies=args.bodies,
        request_timeout=args.request_timeout,
        keep_files=args.keep_files,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
