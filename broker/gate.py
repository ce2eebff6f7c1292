"""``WriteGate``: whether this node takes a write now, and what a client is told when it
does not (docs/http.md, its errors).

Every write (a produce, a topic's create or delete, an offset commit, a leadership
transfer) passes the gate before it is appended, and an append the log refuses is
answered through it (``append_error``). The gate holds the broker role: MASTER or SLAVE,
and the term it is for. Only ``RoleChangeHandler`` (``broker/role.py``) sets it, from
Raft's role changes (``tests/test_layers.py`` checks that): a refused append or a failed
leadership transfer changes no role (issue 26).

Invariants:
- ``require_master`` returns only on the MASTER of a term whose leadership is not being
  handed over, whose node has not failed, whose disk holds the reserve and whose
  dispatch is not stalled; otherwise it raises the error a client should get: the
  master's address, a short Retry-After, disk full, node failed;
- the queue-offset table of the commit log is valid only while the role is MASTER
  (``set_role`` clears it on every other role);
- ``require_master_soon`` waits at most ``transfer_hold_ms``.
"""

from __future__ import annotations

import logging
import shutil
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from dledger.codes import DLedgerCode, DLedgerError
from dledger.runtime.server import AppendOutcomeUnknownError, DLedgerServer, NotLeaderError

from . import errors
from .commitlog import DLedgerCommitLog
from .settings import BrokerSettings

if TYPE_CHECKING:
    from .dispatch import Dispatch

log = logging.getLogger(__name__)

# The Retry-After hints of 503 NO_MASTER (the client waits at least this, or its backoff):
PROMOTING_RETRY_AFTER_MS = 20  # this node leads and is becoming MASTER
NO_LEADER_RETRY_AFTER_MS = 50  # no leader known: an election is under way
TRANSFER_RETRY_AFTER_MS = 50  # leadership is being handed over: it ends in a beat or two


class BrokerRole(StrEnum):
    MASTER = "MASTER"
    SLAVE = "SLAVE"


class WriteGate:
    def __init__(
        self,
        settings: BrokerSettings,
        server: DLedgerServer,
        commitlog: DLedgerCommitLog,
    ) -> None:
        self.settings = settings
        self.server = server
        self.commitlog = commitlog
        # The dispatcher, whose stall refuses writes; it comes with the open log
        # (``watch``): there is no write to refuse before.
        self.dispatch: Dispatch | None = None
        self.role = BrokerRole.SLAVE
        self.role_term = -1
        self._disk_checked_at = -1e18
        self._disk_free_bytes = 1 << 62

    def watch(self, dispatch: Dispatch) -> None:
        """Refuse writes while ``dispatch`` is stalled on a disk error."""
        self.dispatch = dispatch

    @property
    def is_master(self) -> bool:
        return self.role is BrokerRole.MASTER

    def set_role(self, role: BrokerRole, term: int, why: str) -> None:
        """The broker role for ``term`` (``RoleChangeHandler`` alone calls this)."""
        if role is not BrokerRole.MASTER:
            self.commitlog.clear_queue_table()
        if role is not self.role or term != self.role_term:
            log.info(
                "node %s term %d: broker role %s → %s (%s)",
                self.settings.node_id,
                term,
                self.role.value,
                role.value,
                why,
            )
        self.role, self.role_term = role, term

    async def require_master_soon(self) -> None:
        """``require_master``, after waiting (``transfer_hold_ms`` at most) for a
        leadership transfer under way here to end: a write then goes to the new
        master (a redirect) or is taken here if the transfer failed."""
        if self.role is BrokerRole.MASTER and self.server.transferee is not None:
            await self.server.wait_no_transfer(self.settings.transfer_hold_ms / 1000)
        self.require_master()

    def require_master(self) -> None:
        """Refuse a write unless this node is MASTER and can make it readable:
        ``NotMasterError`` (the master's address) on a SLAVE, ``NoMasterError`` (a short
        Retry-After) while there is none or while leadership is being handed over,
        ``DiskFullError`` or ``NodeFailedError``."""
        self.require_master_role()
        transferee = self.server.transferee
        if transferee is not None:
            # Raft refuses appends while it hands leadership over; the transfer ends
            # (either way) within a heartbeat or two, and the client's retry finds
            # the new master, or this one serving again.
            raise errors.NoMasterError(
                f"leadership is being handed to {transferee}; retry shortly",
                retry_after_ms=TRANSFER_RETRY_AFTER_MS,
            )
        self._require_writable()

    def require_master_role(self) -> None:
        """``NotMasterError`` or ``NoMasterError`` unless the broker role is MASTER."""
        if self.role is not BrokerRole.MASTER:
            raise self.not_master()

    def not_master(self) -> errors.BrokerError:
        """Where a write goes when this node does not take it, from Raft's view now."""
        leader = self.leader_id
        if leader is None or leader == self.settings.node_id:
            # No leader, or we lead but are still catching up: nobody takes writes yet.
            # The promotion takes milliseconds, an election after a crash tens (issue 18):
            # the client's own backoff, which grows, covers longer waits.
            retry_ms = PROMOTING_RETRY_AFTER_MS if leader is not None else NO_LEADER_RETRY_AFTER_MS
            return errors.NoMasterError(
                "no master at the moment; retry shortly", retry_after_ms=retry_ms
            )
        return errors.NotMasterError(
            f"this broker is a SLAVE; the master is {leader}",
            leader_id=leader,
            leader_addr=self._members().get(leader, self.settings.peer_map.get(leader)),
            leader_url=self.url_of(leader),
        )

    def _members(self) -> dict[str, str]:
        core = self.server.core
        return core.member_state.config.addresses if core is not None else {}

    def url_of(self, node_id: str) -> str | None:
        """The node's HTTP URL: its configuration's (a member added while running),
        else ``--peer-urls``'."""
        core = self.server.core
        m = core.member_state.config.members.get(node_id) if core is not None else None
        return m.url if m is not None and m.url else self.settings.peer_urls.get(node_id)

    @property
    def leader_id(self) -> str | None:
        """The Raft leader this node knows of, or None (also before the server starts)."""
        core = self.server.core
        return core.member_state.leader_id if core is not None else None

    def append_error(self, e: DLedgerError) -> errors.BrokerError:
        """What the client is told when the log refused an append. The broker role is
        not touched here: it follows Raft's role changes alone (``RoleChangeHandler``).
        A refusal during a leadership transfer is not a lost leadership, and a transfer
        that fails changes no role, so setting SLAVE here would last for good (issue 26);
        a real loss of leadership reaches the handler as a role change anyway."""
        if isinstance(e, AppendOutcomeUnknownError):
            return errors.UnknownOutcomeError(
                f"commit unknown ({e.code.name}); retry may duplicate"
            )
        if e.code is DLedgerCode.LEADER_TRANSFERRING:
            return errors.NoMasterError(
                f"leadership is being handed over ({e.message}); retry shortly",
                retry_after_ms=TRANSFER_RETRY_AFTER_MS,
            )
        if isinstance(e, NotLeaderError):
            return self.not_master()
        if e.code is DLedgerCode.LEADER_PENDING_FULL:
            return errors.BusyError("too many appends waiting for a quorum", retry_after_ms=100)
        if e.code is DLedgerCode.DISK_FULL:
            return errors.DiskFullError(e.message, retry_after_ms=1000)
        if e.code in (DLedgerCode.DISK_ERROR, DLedgerCode.UNEXPECTED_ARGUMENT):
            return errors.StorageError(e.message)
        return errors.NoMasterError(f"append refused: {e.code.name}", retry_after_ms=200)

    def _require_writable(self) -> None:
        """Refuse a write the node could not make readable: while dispatch is stalled on
        a disk error nothing new reaches the consume queues (it resumes by itself)."""
        if self.server.failed is not None:
            raise errors.NodeFailedError(f"node failed: {self.server.failed!r}")
        if self.disk_short():
            free = self._disk_free()
            raise errors.DiskFullError(
                f"writes refused: {free >> 20} MiB free in {self.settings.data_dir}, under the"
                f" reserve of {self.settings.disk_reserve >> 20} MiB kept for the consume"
                " queues and the key index; reads go on, writes resume when space returns",
                retry_after_ms=1000,
            )
        stall = self.dispatch.stall if self.dispatch is not None else None
        if stall is not None:
            raise errors.DiskFullError(
                f"writes refused: dispatch is stalled on a disk error ({stall.strerror or stall});"
                " reads go on, writes resume when it moves again",
                retry_after_ms=1000,
            )

    def disk_short(self) -> bool:
        """Less than the reserve is free where the data lives: as master the node refuses
        writes (507 DISK_FULL)."""
        return self._disk_free() < self.settings.disk_reserve

    def _disk_free(self) -> int:
        """Free bytes where the data lives, looked up at most once per interval."""
        now = time.monotonic()
        if now - self._disk_checked_at >= self.settings.disk_check_interval_ms / 1000:
            self._disk_checked_at = now
            try:
                self._disk_free_bytes = shutil.disk_usage(self.settings.data_dir).free
            except OSError as e:  # the directory went away: say so, refuse nothing more
                log.warning("cannot read the free space of %s: %s", self.settings.data_dir, e)
        return self._disk_free_bytes
