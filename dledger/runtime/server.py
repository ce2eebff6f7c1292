"""``DLedgerServer``: one node of a DLedger group on an asyncio event loop (docs/architecture.md).

The node loop is the Ready contract: inputs (the 10 ms tick, peer messages, client
appends, transfers) go straight into the core on the loop thread; one task drains
``core.ready()`` and handles each Ready in the fixed order persist → send → apply →
notify with the same two functions the simulator uses (``ready.py``). Persisting (the
``currterm`` file, the log sync) runs in a worker thread, so the loop never blocks on
fsync, and everything that arrives meanwhile is batched into the next Ready: a group
commit.

Public surface (docs/architecture.md): ``append(bodies)`` → [(index, pos)] after quorum commit;
``get(index)`` and ``read_entries(spans)`` (both checked: a damaged copy is refused),
``read(pos, size)`` (raw bytes); ``committed_index``/``committed_pos`` and
``wait_committed``; ``add_append_hook``; ``add_role_change_handler``;
``transfer_leadership``; ``status()``.

Snapshots (INSTALL_SNAPSHOT): an application that lets retention delete
the log head registers its snapshots with ``set_snapshot`` and installs the ones a leader
sends through ``set_snapshot_installer``; see those two methods for the contract.

Its own thread (``ServerConfig.own_thread``): the node loop (ticks, the transport, the
Ready task) then runs on an event loop of its own in a thread of its own, so work on the
application's loop (an HTTP request that takes seconds of Python) delays no heartbeat and
no vote: the thread gets the interpreter every switch interval (5 ms) whatever the other
loop does. The public surface stays the application's: it is called on the loop that
called ``start`` (the home loop) and answers there. Off by default for a bare server
(one loop, as the runtime's tests read it); the broker turns it on (``--raft-thread``).
Invariants of that split:

- the core and the transport are touched only under ``_lock`` (the core) and only on the
  node loop (the transport), except ``append_nowait``, which proposes under the lock on
  the caller's thread, so a refusal still raises before anything is in the log;
- whatever the application sees happen (a proposal's future, a role change, a transfer's
  outcome, the commit watermark, a failure) is handed to the home loop in the order the
  Ready carried it (``_at_home``: one FIFO queue per loop);
- the snapshot installer runs as before: a plain function in a worker thread, a
  coroutine on the home loop, and no Ready is handled until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..codes import DLedgerCode, DLedgerError
from ..core.membership import MembershipChange
from ..core.messages import (
    PEER_MESSAGE_TYPES,
    AppendRequest,
    AppendResponse,
    GetRequest,
    GetResponse,
    MetadataRequest,
    MetadataResponse,
    RaftMessage,
    Role,
)
from ..core.node import DLedgerCore, Ready, RoleChange, TransferDone
from ..core.settings import CoreSettings
from ..core.snapshot import Snapshot
from ..store import AppendHook, Entry, FileStore, StoreSettings, node_dir
from .events import EventLog
from .ready import deliver_ready, persist_ready
from .transport import Transport, TransportSettings, is_loopback, parse_address
from .watermark import Watermark
from .wire import WireMessage

log = logging.getLogger(__name__)

TICK_MS = 10  # the state maintainer's beat
LOOP_STALL_MS = 100  # a tick this late is logged (loop_stall): the loop was busy elsewhere
PERSIST_RETRY_MAX_S = 1.0  # backoff cap while the term/vote file cannot be written

CLIENT_REQUESTS_ALL = frozenset({"append", "get", "metadata"})
"""The client protocol's requests (``python -m dledger client``): a plain log serves all
three. An application that owns the log's contents, like the broker, serves only
``metadata``: appends and reads then go through it (its checks, its tokens)."""

RoleChangeHandler = Callable[[RoleChange], None]
SnapshotInstaller = Callable[[int, bytes], Awaitable[None] | None]
"""``installer(last_index, data)``: see :meth:`DLedgerServer.set_snapshot_installer`."""


class NotLeaderError(DLedgerError):
    """This node does not lead; ``leader_id`` is where to go (may be None)."""

    def __init__(self, code: DLedgerCode, message: str, leader_id: str | None) -> None:
        super().__init__(code, message)
        self.leader_id = leader_id


class AppendOutcomeUnknownError(DLedgerError):
    """The append was proposed but its commit is unknown (leadership lost, quorum timeout):
    it may or may not be in the log. Retrying may duplicate."""


def parse_peers(spec: str) -> dict[str, str]:
    """DLedger's peer format ``n0-host:port;n1-host:port`` → {id: address}."""
    peers: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(";"))):
        node_id, sep, addr = item.partition("-")
        if not sep or not node_id or ":" not in addr:
            raise ValueError(f"bad peer {item!r}: want id-host:port")
        if node_id in peers:
            raise ValueError(f"peer id {node_id!r} appears twice")
        peers[node_id] = addr
    if not peers:
        raise ValueError("no peers given")
    return peers


@dataclass(frozen=True, slots=True)
class ServerConfig:
    group: str
    self_id: str
    peers: dict[str, str]
    data_dir: Path
    core: CoreSettings = field(default_factory=CoreSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    seed: int | None = None  # the core's RNG; None: from the OS
    # Which client requests the Raft port answers (CLIENT_REQUESTS_ALL); the others get
    # UNSUPPORTED. The broker allows only "metadata": its log is written by the broker.
    client_requests: frozenset[str] = CLIENT_REQUESTS_ALL
    # Run the node loop on an event loop and thread of its own (see the module docstring)
    own_thread: bool = False
    # Ids among ``peers`` that start as learners (a node joining a running cluster names
    # itself here); like ``peers``, this counts on the first start only
    learners: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.client_requests - CLIENT_REQUESTS_ALL
        if unknown:
            raise ValueError(f"unknown client requests {sorted(unknown)}")

    @property
    def store_dir(self) -> Path:
        return node_dir(self.data_dir, self.group, self.self_id)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _loop_like(home: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """A new event loop of ``home``'s kind (uvloop's under the node), else asyncio's."""
    try:
        loop = type(home)()
    except TypeError:
        return asyncio.new_event_loop()
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else asyncio.new_event_loop()


def _resolve(
    fut: asyncio.Future[Any], result: Any = None, *, error: BaseException | None = None
) -> None:
    """Settle ``fut`` on its own loop: a proposal of the Raft port's client protocol
    waits on the node loop, the application's on the home loop."""

    def settle() -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    loop = fut.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        settle()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(settle)


class DLedgerServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store: FileStore | None = None
        self.core: DLedgerCore | None = None
        self.transport: Transport | None = None
        self._hooks: list[AppendHook] = []
        self._handlers: list[RoleChangeHandler] = []
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # The core is stepped under this lock: on the node loop, and by ``append_nowait``
        # on the caller's thread (with ``own_thread`` those are two threads).
        self._lock = threading.RLock()
        self._home: asyncio.AbstractEventLoop | None = None  # the application's loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the node loop
        self._thread: threading.Thread | None = None
        self._proposal_futs: dict[int, asyncio.Future[list[tuple[int, int]]]] = {}
        self._proposal_started: dict[int, float] = {}
        # Called with (seconds from proposal to quorum commit, entries) per committed
        # proposal: the commit-latency histogram of /metrics.
        self.commit_observers: list[Callable[[float, int], None]] = []
        self._transfer_futs: dict[int, asyncio.Future[TransferDone]] = {}
        self._committed = Watermark()  # the store's commit index, as last seen
        # Moves once per Ready that ends a transfer or changes the role (wait_no_transfer)
        self._transfer_moves = Watermark(0)
        self._stopping = False
        self._pump_scheduled = False  # a call_soon of _pump_proposals is pending
        self._installer: SnapshotInstaller | None = None
        self.failed: BaseException | None = None  # the node stopped working: see the log
        self._failure_handlers: list[Callable[[BaseException], None]] = []
        self._event = EventLog(log)  # the core's events, in the node's log
        self.stats = {
            "readies": 0,
            "syncs": 0,
            "proposals": 0,
            "snapshot_installs": 0,
            "client_refused": 0,
            "loop_stalls": 0,  # ticks that came LOOP_STALL_MS or more late
            "max_tick_late_ms": 0,
        }

    # ---- lifecycle -------------------------------------------------------------------------

    async def open(self) -> FileStore:
        """Open the log (once): what is built over it (a broker's dispatcher) can be made
        before ``start`` joins the group. ``start`` opens it when nobody did."""
        if self.store is None:
            # The node loop syncs before replies leave (flush=sync); the store's own
            # thread then only moves the checkpoint. With flush=async it flushes.
            cfg = self.config
            self.store = await asyncio.to_thread(FileStore, cfg.store_dir, cfg.store)
            for hook in self._hooks:
                self.store.add_append_hook(hook)
        return self.store

    async def start(self) -> None:
        await self.open()
        self._home = asyncio.get_running_loop()
        if not self.config.own_thread:
            self._loop = self._home
            await self._start_here()
            return
        loop = _loop_like(self._home)
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"dledger-{self.config.self_id}", daemon=True
        )
        self._thread.start()
        try:
            await self._on_node_loop(self._start_here())
        except BaseException:
            self._end_thread()
            raise

    async def _on_node_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the node loop and wait for it here."""
        assert self._loop is not None
        if self._loop is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()
        self._thread = None

    def _at_home(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` on the home loop: now when we are on it, else queued there
        (in order: one queue per loop)."""
        home = self._home
        if self._thread is None or home is None:
            fn(*args)
        elif not home.is_closed():
            home.call_soon_threadsafe(fn, *args)

    def _on_node_thread(self) -> bool:
        """Whether the caller runs on the node loop's thread (always, without one)."""
        return self._thread is None or threading.get_ident() == self._thread.ident

    def _node_soon(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the node loop in its next turn (from any thread)."""
        loop = self._loop
        assert loop is not None
        if self._on_node_thread():
            loop.call_soon(fn)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def _poke(self) -> None:
        """Wake the Ready task (from any thread)."""
        if self._on_node_thread():
            self._kick.set()
        else:
            self._node_soon(self._kick.set)

    async def _start_here(self) -> None:
        cfg = self.config
        assert self.store is not None
        seed = cfg.seed if cfg.seed is not None else random.SystemRandom().getrandbits(64)
        self.core = DLedgerCore(
            group=cfg.group,
            self_id=cfg.self_id,
            peers=cfg.peers,
            store=self.store,
            rng=random.Random(seed),
            settings=cfg.core,
            now_ms=_now_ms(),
            event_log=self._event,
            learners={i: cfg.peers[i] for i in cfg.learners},
        )
        self.transport = Transport(
            cfg.self_id,
            {**self.core.member_state.known, cfg.self_id: cfg.peers[cfg.self_id]},
            group=cfg.group,
            listen=cfg.peers[cfg.self_id],
            on_peer_message=self._on_peer_message,
            on_client_request=self._on_client_request,
            is_peer_message=lambda m: isinstance(m, PEER_MESSAGE_TYPES),
            settings=cfg.transport,
            on_peer_lost=self._on_peer_lost,
        )
        await self.transport.start()
        self._tasks = [
            asyncio.create_task(self._tick_loop(), name="dledger-tick"),
            asyncio.create_task(self._ready_loop(), name="dledger-ready"),
        ]
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        self._warn_if_exposed()
        log.info(
            "node %s of %s listening on %s, data in %s",
            cfg.self_id,
            cfg.group,
            cfg.peers[cfg.self_id],
            cfg.store_dir,
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._loop is not None and not self._loop.is_closed():
            await self._on_node_loop(self._stop_here())
        self._end_thread()
        self._answer_waiters("node stopped")
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    async def _stop_here(self) -> None:
        for t in self._tasks:
            t.cancel()
        # A task that died already was reported (it failed the node); stop goes on.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.transport is not None:
            await self.transport.close()

    async def __aenter__(self) -> DLedgerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _warn_if_exposed(self) -> None:
        """docs/operations.md: without a peer secret, whoever reaches the Raft port can pose as a
        member. Fine on loopback (tests, one host); say so loudly anywhere else."""
        cfg = self.config
        if cfg.transport.peer_secret is not None:
            return
        host, _ = parse_address(cfg.peers[cfg.self_id])
        if not is_loopback(host):
            log.warning(
                "the Raft port %s listens beyond loopback without a peer secret: anyone who"
                " reaches it can pose as a member of %s (forge votes, pushes, snapshots)."
                " Set --peer-secret (or LEDGERMQ_PEER_SECRET_FILE) on every node.",
                cfg.peers[cfg.self_id],
                cfg.group,
            )

    # ---- failure: crash-only -------------------------------------------------------------

    def add_failure_handler(self, handler: Callable[[BaseException], None]) -> None:
        """``handler(error)`` runs once if the node stops working (a task died, the store
        failed, a snapshot install failed). The process should then exit: the node's
        state is not to be trusted until recovery has run again."""
        self._failure_handlers.append(handler)

    def fail(self, what: str, e: BaseException) -> None:
        """Stop working (crash-only): the node or its application found it cannot go on
        (``what`` failed with ``e``). Runs the failure handlers once."""
        if self.failed is not None:
            return
        self.failed = e
        self._stopping = True  # no more input into a core that may be half-updated
        log.critical("node %s stops working: %s: %r", self.config.self_id, what, e, exc_info=e)
        # No Ready may ever be handled again (the ready task may be what died): whoever
        # waits for a commit or a transfer is answered now, not never.
        self._at_home(self._answer_waiters, f"node failed: {what}")
        self._at_home(self._run_failure_handlers, e)

    def _run_failure_handlers(self, e: BaseException) -> None:
        for handler in self._failure_handlers:
            try:
                handler(e)
            except Exception:
                log.exception("failure handler %r failed", handler)

    def _answer_waiters(self, why: str) -> None:
        """Fail every proposal and transfer still waiting (proposed entries may yet
        commit elsewhere: an unknown outcome)."""
        for pfut in self._proposal_futs.values():
            if not pfut.done():
                e = AppendOutcomeUnknownError(DLedgerCode.ILLEGAL_MEMBER_STATE, why)
                _resolve(pfut, error=e)
        for tfut in self._transfer_futs.values():
            if not tfut.done():
                _resolve(tfut, error=DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, why))

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        e = task.exception()
        self.fail(f"task {task.get_name()} ended", e or RuntimeError("returned"))

    # ---- the node loop ---------------------------------------------------------------------

    def _live_core(self) -> DLedgerCore:
        if self.core is None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, "server not started")
        return self.core

    async def _tick_loop(self) -> None:
        core = self._live_core()
        last = _now_ms()
        while True:
            await asyncio.sleep(TICK_MS / 1000)
            now = _now_ms()
            late, last = now - last - TICK_MS, now
            if late >= LOOP_STALL_MS:
                # The loop ran something else that long: this node neither sent nor read
                # meanwhile, so its peers' timers and its own see silence that was a stall.
                self.stats["loop_stalls"] += 1
                self.stats["max_tick_late_ms"] = max(self.stats["max_tick_late_ms"], late)
                self._event("loop_stall", {"late_ms": late, "stalls": self.stats["loop_stalls"]})
            with self._lock:
                core.tick(now)
            self._kick.set()

    async def _ready_loop(self) -> None:
        core, store = self._live_core(), self.store
        assert store is not None
        sync_log = self.config.core.flush == "sync"
        home = self._home
        assert home is not None
        while True:
            await self._kick.wait()
            self._kick.clear()
            for _ in range(1000):  # bounded; the kick brings us back
                with self._lock:
                    ready = core.ready()
                if not ready:
                    break
                self.stats["readies"] += 1
                synced = None
                snap = ready.install_snapshot
                if snap is not None:
                    try:
                        synced = await asyncio.to_thread(
                            persist_ready,
                            store,
                            ready,
                            sync_log=sync_log,
                            install=lambda s: self._install(home, s),
                        )
                    except Exception as e:
                        # The log and the application may now disagree; answering the
                        # leader would claim an install that did not happen. Stop here.
                        self.fail(f"installing snapshot {snap}", e)
                        return
                    self.stats["snapshot_installs"] += 1
                elif ready.hard_state is not None or (ready.must_sync and sync_log):
                    self.stats["syncs"] += 1
                    synced = await self._persist(store, ready, sync_log)
                with self._lock:
                    deliver_ready(core, ready, synced, send=self._send, on_ready=self._on_ready)

    async def _persist(self, store: FileStore, ready: Ready, sync_log: bool) -> int | None:
        """``persist_ready`` in a thread. The term/vote file is a new file each time, so a
        full disk can refuse it: then nothing of the Ready has happened (it is written
        first) and nothing may leave before it is durable, so wait and retry; the node
        is silent meanwhile, as if partitioned. Any other error ends the node."""
        delay_s = 0.05
        while True:
            try:
                return await asyncio.to_thread(persist_ready, store, ready, sync_log=sync_log)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT) or ready.hard_state is None:
                    raise
                self._event("persist_no_space", {"dir": str(store.dir), "error": e.strerror})
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, PERSIST_RETRY_MAX_S)

    def _install(self, loop: asyncio.AbstractEventLoop, snap: Snapshot) -> None:
        """Run the application's installer (in the persist thread): a coroutine is run on
        the event loop and waited for here."""
        installer = self._installer
        if installer is None:
            log.warning("no snapshot installer: the data of %s is dropped", snap)
            return
        result = installer(snap.last_index, snap.data)
        if inspect.isawaitable(result):
            aw = result

            async def run() -> None:
                await aw

            asyncio.run_coroutine_threadsafe(run(), loop).result()

    def _send(self, msgs: Iterable[RaftMessage]) -> None:
        assert self.transport is not None
        for m in msgs:
            self.transport.send(m)

    def _on_ready(self, ready: Ready) -> None:
        if ready.addresses is not None and self.transport is not None:
            self.transport.set_peers(ready.addresses)
        if (
            ready.committed_index is not None
            or ready.proposals
            or ready.transfers
            or ready.role_changes
        ):
            self._at_home(self._settle, ready)

    def _settle(self, ready: Ready) -> None:
        """What a Ready tells the application, on the home loop."""
        if ready.committed_index is not None:
            self._committed.advance(self.committed_index)
        for done in ready.proposals:
            fut = self._proposal_futs.pop(done.proposal.proposal_id, None)
            started = self._proposal_started.pop(done.proposal.proposal_id, None)
            if fut is None or fut.done():
                continue
            p = done.proposal
            if done.code is DLedgerCode.SUCCESS:
                if started is not None:
                    took = time.monotonic() - started
                    for observe in self.commit_observers:
                        observe(took, len(p.positions))
                _resolve(fut, [(p.first_index + i, pos) for i, pos in enumerate(p.positions)])
            else:
                _resolve(fut, error=AppendOutcomeUnknownError(done.code, "commit unknown"))
        for t in ready.transfers:
            tf = self._transfer_futs.pop(t.transfer_id, None)
            if tf is not None and not tf.done():
                _resolve(tf, t)
        if ready.transfers or ready.role_changes:
            self._transfer_moves.advance(self._transfer_moves.index + 1)
        for change in ready.role_changes:
            for handler in self._handlers:
                try:
                    handler(change)
                except Exception:  # one handler's failure must not stop the others
                    log.exception("role change handler %r failed", handler)

    def _on_peer_message(self, m: WireMessage) -> None:
        core = self.core
        if core is None or self._stopping:
            return
        try:
            with self._lock:
                core.step(m, _now_ms())  # type: ignore[arg-type]
        except Exception as e:
            # Not a protocol refusal (those are answers): a bug or a failed store, and
            # the core may be half-updated. Crash-only: stop taking input.
            self.fail(f"handling {type(m).__name__} from {m.local_id}", e)
            return
        self._kick.set()

    def _on_peer_lost(self, peer_id: str) -> None:
        """The transport saw ``peer_id``'s connection end: an input of the core."""
        core = self.core
        if core is None or self._stopping:
            return
        with self._lock:
            core.peer_connection_lost(peer_id, _now_ms())
        self._kick.set()

    # ---- public surface --------------------------------------------------------------------

    def add_append_hook(self, hook: AppendHook) -> None:
        """Runs on every leader append after pos is fixed, before the bytes are written."""
        self._hooks.append(hook)
        if self.store is not None:
            self.store.add_append_hook(hook)

    def add_role_change_handler(self, handler: RoleChangeHandler) -> None:
        self._handlers.append(handler)

    def set_snapshot(self, last_index: int, data: bytes) -> Snapshot:
        """Register the application's snapshot ``data`` of its state after applying the
        committed entries up to ``last_index``. Call it on the event loop once the
        snapshot is durable, and again after every restart (the node keeps only the
        newest one, in memory).

        A leader sends it (in chunks of ``CoreSettings.snapshot_chunk_bytes``; at most
        ``CoreSettings.max_snapshot_bytes``) to a follower whose next entry it no longer
        holds. It can be sent only while the log continues right after it
        (``last_index >= ledger_begin_index - 1``), so let
        retention delete no further than the returned ``Snapshot.next_pos``, e.g.
        ``store.set_retention_floor(min(snap.next_pos, other_floor))``.

        Raises ``DLedgerError(UNEXPECTED_ARGUMENT)`` when ``last_index`` is above the
        committed index or below ``ledger_begin_index - 1``."""
        core = self._live_core()
        with self._lock:
            return core.set_snapshot(last_index, data)

    def set_snapshot_installer(self, installer: SnapshotInstaller | None) -> None:
        """``installer(last_index, data)`` installs a snapshot a leader sent: it makes
        ``data`` the application's state covering the entries up to ``last_index``,
        durably, before it returns. A plain function runs in a worker thread (it may
        block on fsync); a coroutine function runs on the event loop. Either way:

        - the node is between two Readies: the store still holds the old log and its old
          committed index; no message leaves and no other Ready is handled meanwhile;
        - after it returns, the log is reset to begin at ``last_index + 1`` (every entry
          up to ``last_index`` counts as committed; ``get``/``read`` below that fail),
          and only then does the node answer the leader;
        - after a crash between the two the node restarts with the application ahead of
          its log: the application skips committed entries up to its snapshot's index.

        An application that applies committed entries (the broker's dispatcher) resumes
        from ``last_index + 1`` after it: e.g. the broker's installer loads its metadata
        snapshot from ``data``, resets the consume queues and the dispatch position to
        ``last_index``, and writes them durably. It must not wait for this node's own
        commits (``append``, ``wait_committed``): no Ready is handled until it returns.
        If it raises, the node stops working (``self.failed``; the process should be
        restarted). Without an installer the data is dropped (fine for a pure log)."""
        self._installer = installer

    async def append(
        self, bodies: Sequence[bytes | bytearray | memoryview]
    ) -> list[tuple[int, int]]:
        """Append as leader; resolves after quorum commit with (index, pos) per body."""
        return await self.append_nowait(bodies)

    def append_nowait(
        self, bodies: Sequence[bytes | bytearray | memoryview]
    ) -> asyncio.Future[list[tuple[int, int]]]:
        """Propose now, synchronously, and return the future of the commit.

        A refusal (NotLeaderError, LEADER_PENDING_FULL, a store error) raises here, before
        anything is in the log; once this returns the entries are in the leader's log and
        the future fails only with ``AppendOutcomeUnknownError``. The broker relies on that
        split to roll back queue offsets it assigned for a refused batch."""
        core = self._live_core()
        if self.failed is not None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, f"node failed: {self.failed!r}")
        try:
            with self._lock:
                p = core.propose(bodies, _now_ms(), pump=False)
        except DLedgerError as e:
            if e.code in (DLedgerCode.NOT_LEADER, DLedgerCode.LEADER_TRANSFERRING):
                raise NotLeaderError(e.code, e.message, core.member_state.leader_id) from None
            raise
        self.stats["proposals"] += 1
        fut: asyncio.Future[list[tuple[int, int]]] = asyncio.get_running_loop().create_future()
        self._proposal_futs[p.proposal_id] = fut
        if self.commit_observers:
            self._proposal_started[p.proposal_id] = time.monotonic()
        if not self._pump_scheduled:  # one push per follower for this loop turn's appends
            self._pump_scheduled = True
            self._node_soon(self._pump_proposals)
        self._poke()
        return fut

    def _pump_proposals(self) -> None:
        self._pump_scheduled = False
        core = self.core
        if core is None or self._stopping:
            return
        try:
            with self._lock:
                core.pump(_now_ms())
        except Exception as e:  # as in _on_peer_message: the core may be half-updated
            self.fail("pushing new entries", e)
            return
        self._kick.set()

    def get(self, index: int) -> Entry:
        """A committed entry by index."""
        store = self._store()
        if index > store.committed_index:
            raise DLedgerError(
                DLedgerCode.INDEX_OUT_OF_RANGE,
                f"index {index} is not committed (at {store.committed_index})",
            )
        return store.get(index)

    def read(self, pos: int, size: int) -> bytes:
        """Raw committed bytes at [pos, pos + size)."""
        store = self._store()
        if pos + size > store.committed_pos:
            raise DLedgerError(
                DLedgerCode.INDEX_OUT_OF_RANGE,
                f"[{pos}, {pos + size}) is beyond committed pos {store.committed_pos}",
            )
        return store.read(pos, size)

    def view(self, pos: int, size: int) -> contextlib.AbstractContextManager[memoryview]:
        """A zero-copy view of committed bytes (``FileStore.view``: keep it open briefly)."""
        store = self._store()
        return store.view(pos, size, limit_pos=store.committed_pos)

    def read_entries(self, spans: Sequence[tuple[int, int | None]]) -> list[bytes]:
        """The committed entries at each ``(pos, body_size)``, header and body, checked
        under one hold of the store's lock (``FileStore.read_entries_at``; a body size of
        None: ``pos`` is a guess): ``CorruptEntryError`` if a copy here is damaged."""
        store = self._store()
        return store.read_entries_at(spans, max_end=store.committed_pos)

    def _store(self) -> FileStore:
        if self.store is None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, "server not started")
        return self.store

    @property
    def committed_index(self) -> int:
        return self._store().committed_index

    @property
    def committed_pos(self) -> int:
        return self._store().committed_pos

    @property
    def ledger_end_index(self) -> int:
        """The last entry of the log here, committed or not."""
        return self._store().ledger_end_index

    async def wait_committed(self, index: int, timeout_s: float) -> bool:
        """Wait until ``committed_index >= index``; False on timeout. The core moves the
        store's commit index as it steps, before the Ready that reports it: look first."""
        self._committed.advance(self.committed_index)
        return await self._committed.wait(index, timeout_s)

    async def transfer_leadership(self, to: str, timeout_s: float = 5.0) -> TransferDone:
        """Hand leadership to ``to``; its outcome (``DLedgerCore.transfer_leadership``
        ends every transfer within twice ``leadership_transfer_timeout_ms``). A refusal
        raises ``DLedgerError`` before anything started; ``timeout_s`` only guards
        against a core that never answers (then the outcome is ``TIMEOUT``)."""
        core = self._live_core()
        if self.failed is not None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, f"node failed: {self.failed!r}")
        with self._lock:
            tid = core.transfer_leadership(to, _now_ms())
        fut: asyncio.Future[TransferDone] = asyncio.get_running_loop().create_future()
        self._transfer_futs[tid] = fut
        self._poke()
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            return TransferDone(tid, DLedgerCode.TIMEOUT, f"no outcome within {timeout_s:g} s")
        finally:
            self._transfer_futs.pop(tid, None)

    async def change_membership(self, change: MembershipChange, timeout_s: float = 10.0) -> int:
        """Append the configuration ``change`` makes (``DLedgerCore.change_membership``)
        and wait until it commits; its entry's index. A refusal raises ``DLedgerError``
        (``NotLeaderError`` with the leader's id) before anything is in the log; after
        that, ``AppendOutcomeUnknownError`` when the outcome is not known in time."""
        core = self._live_core()
        if self.failed is not None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, f"node failed: {self.failed!r}")
        try:
            with self._lock:
                p = core.change_membership(change, _now_ms())
        except DLedgerError as e:
            if e.code in (DLedgerCode.NOT_LEADER, DLedgerCode.LEADER_TRANSFERRING):
                raise NotLeaderError(e.code, e.message, core.member_state.leader_id) from None
            raise
        fut: asyncio.Future[list[tuple[int, int]]] = asyncio.get_running_loop().create_future()
        self._proposal_futs[p.proposal_id] = fut
        self._poke()
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except TimeoutError:
            raise AppendOutcomeUnknownError(
                DLedgerCode.WAIT_QUORUM_ACK_TIMEOUT, f"not committed within {timeout_s:g} s"
            ) from None
        finally:
            self._proposal_futs.pop(p.proposal_id, None)
        return p.first_index

    @property
    def members(self) -> dict[str, Any]:
        """The configuration in force: voters and learners with their addresses."""
        core = self._live_core()
        with self._lock:
            config = core.member_state.config
            return {
                "config_index": core.config_index,
                "members": {
                    i: {"addr": m.addr, "voter": m.voter} for i, m in config.members.items()
                },
            }

    @property
    def transferee(self) -> str | None:
        """The node this leader is handing leadership to, while a transfer runs."""
        core = self.core
        return core.member_state.transferee if core is not None else None

    async def wait_no_transfer(self, timeout_s: float) -> bool:
        """Wait until no leadership transfer runs here (it ended, or this node stepped
        down); True then, False after ``timeout_s``. The core ends every transfer within
        twice ``leadership_transfer_timeout_ms``, most within a heartbeat or two."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.transferee is not None:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await self._transfer_moves.wait(self._transfer_moves.index + 1, left)
        return True

    @property
    def role(self) -> Role:
        return self._live_core().member_state.role

    @property
    def leader_id(self) -> str | None:
        return self._live_core().member_state.leader_id

    def status(self) -> dict[str, Any]:
        core = self._live_core()
        with self._lock:
            st = core.status()
        if self.transport is not None:
            st["links"] = {
                p: {
                    "connected": link.connected,
                    "sent": link.sent,
                    "dropped": link.dropped,
                    "auth_failures": link.auth_failures,
                }
                for p, link in self.transport.links.items()
            }
            # Inbound connections refused: bad frames, failed peer handshakes (docs/operations.md).
            st["refused"] = {
                "bad_frames": self.transport.bad_frames,
                "auth_failures": self.transport.auth_failures,
                "stranger_frames": self.transport.stranger_frames,
                "limited": self.transport.limited,
                "client_requests": self.stats["client_refused"],
            }
        st["stats"] = dict(self.stats)
        if self.failed is not None:
            st["failed"] = repr(self.failed)
        return st

    # ---- the client protocol ---------------------------------------------------------------

    async def _on_client_request(self, m: WireMessage) -> WireMessage | None:
        cfg = self.config
        base: dict[str, Any] = {
            "group": cfg.group,
            "local_id": cfg.self_id,
            "remote_id": m.local_id,
            "term": self.core.member_state.curr_term if self.core else -1,
            "req_id": m.req_id,
        }
        allowed = cfg.client_requests
        if isinstance(m, AppendRequest):
            if "append" not in allowed:
                return self._client_refused(m, AppendResponse(**base, code=DLedgerCode.UNSUPPORTED))
            return await self._client_append(m, base)
        if isinstance(m, GetRequest):
            if "get" not in allowed:
                return self._client_refused(m, GetResponse(**base, code=DLedgerCode.UNSUPPORTED))
            return self._client_get(m, base)
        if isinstance(m, MetadataRequest):
            if "metadata" not in allowed:
                return self._client_refused(
                    m, MetadataResponse(**base, code=DLedgerCode.UNSUPPORTED)
                )
            return MetadataResponse(
                **base, code=DLedgerCode.SUCCESS, status_json=orjson.dumps(self.status())
            )
        return None

    def _client_refused(self, m: WireMessage, resp: WireMessage) -> WireMessage:
        self.stats["client_refused"] += 1
        self._event(
            "client_request_refused",
            {"request": type(m).__name__, "from": m.local_id, "why": "not served on this node"},
        )
        return resp

    async def _client_append(self, m: AppendRequest, base: dict[str, Any]) -> AppendResponse:
        leader = (self.core.member_state.leader_id if self.core else None) or ""
        if m.group != self.config.group:
            return AppendResponse(**base, code=DLedgerCode.UNKNOWN_GROUP, leader_id=leader)
        try:
            result = await self.append(list(m.bodies))
        except DLedgerError as e:
            return AppendResponse(**base, code=e.code, leader_id=leader)
        return AppendResponse(
            **base,
            code=DLedgerCode.SUCCESS,
            leader_id=leader,
            first_index=result[0][0],
            positions=tuple(p for _, p in result),
        )

    def _client_get(self, m: GetRequest, base: dict[str, Any]) -> GetResponse:
        store = self._store()
        if m.index < store.ledger_begin_index or m.index > store.committed_index:
            return GetResponse(**base, code=DLedgerCode.INDEX_OUT_OF_RANGE)
        n = max(1, min(m.max_count, store.committed_index - m.index + 1, 10_000))
        raw, _, _ = store.read_batch(m.index, 4 << 20, n)
        return GetResponse(**base, code=DLedgerCode.SUCCESS, entries=raw)
