"""Handling one :class:`~dledger.core.node.Ready`: the node loop's fixed order.

persist → send → apply → notify (docs/architecture.md, etcd's Ready contract). The asyncio node and
the deterministic simulator both call these two functions, so the order the simulator
checks is the order production runs:

- :func:`persist_ready` is the blocking part (term/vote file, an installed snapshot,
  log sync). The asyncio runtime runs it in a thread; nothing is sent until it returns.
- :func:`deliver_ready` sends the messages and hands commits, finished proposals,
  transfers and role changes to the callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..core.messages import RaftMessage
from ..core.node import DLedgerCore, Ready
from ..core.snapshot import Snapshot
from ..store.base import LogStore
from ..store.meta import TermVote

SnapshotInstaller = Callable[[Snapshot], None]
"""``install(snapshot)``: the application makes ``snapshot.data`` its state, durably,
covering the entries up to ``snapshot.last_index``; it returns only when that is done."""


def persist_ready(
    store: LogStore, ready: Ready, *, sync_log: bool, install: SnapshotInstaller | None = None
) -> int | None:
    """Make the Ready's state durable. Returns the index synced up to, if it synced.

    The term/vote pair is written first (atomically: temp file, fsync, rename). Then an
    installed snapshot: the application's ``install`` first, the log's restart right
    after the snapshot (``store.reset``, durable when it returns) second, so a crash in
    between leaves the application ahead of the log, never behind it. Then the log is
    synced when entries were written and the node runs with ``flush=sync``.
    """
    if ready.hard_state is not None:
        hs = ready.hard_state
        store.save_term_vote(TermVote(hs.term, hs.voted_for))
    snap = ready.install_snapshot
    if snap is not None:
        if install is not None:
            install(snap)
        store.reset(
            snap.last_index + 1, snap.next_pos, snap.last_term, snap.last_chain, snap.config
        )
    if ready.must_sync and sync_log:
        end = store.ledger_end_index
        store.sync()
        return end
    return None


def deliver_ready(
    core: DLedgerCore,
    ready: Ready,
    synced_index: int | None,
    *,
    send: Callable[[Iterable[RaftMessage]], None],
    on_ready: Callable[[Ready], None],
) -> None:
    """Send, then apply and notify (``on_ready`` sees commits, proposals, transfers and
    role changes, in that order of fields). Call on the thread that owns ``core``, after
    :func:`persist_ready` returned."""
    if ready.install_snapshot is not None:
        core.on_snapshot_installed(ready.install_snapshot)
    if synced_index is not None:
        core.on_synced(synced_index)
    if ready.messages:
        send(ready.messages)
    on_ready(ready)
