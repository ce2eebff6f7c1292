"""The group's membership as an operator changes it (issue 33; ``dledger.core.membership``
has the rule): add a learner, promote it once it caught up, remove a member, replace
one by the other.

Invariants:
- one change at a time, each through the log; a call returns once its entry is
  committed, or raises a ``BrokerError`` saying why and what to do (a refusal changes
  nothing);
- removing the master hands leadership to the most caught-up other voter first, then
  answers ``NOT_MASTER`` with the new master's URL: the client asks it again there;
- a node's HTTP URL is the one its configuration entry names, else ``--peer-urls``'.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.membership import AddLearner, MembershipChange, Promote, Remove
from dledger.runtime.server import AppendOutcomeUnknownError, DLedgerServer, NotLeaderError

from . import errors
from .gate import WriteGate
from .leadership import Leadership
from .settings import BrokerSettings

RETRY_MS = 200  # a change refused while the last one commits is asked again after this
CATCH_UP_POLL_S = 0.1


class Membership:
    def __init__(
        self,
        settings: BrokerSettings,
        gate: WriteGate,
        server: DLedgerServer,
        leadership: Leadership,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.server = server
        self.leadership = leadership

    # ---- views -----------------------------------------------------------------------------

    def url_of(self, node_id: str | None) -> str | None:
        """A node's HTTP URL: its configuration's, else ``--peer-urls``'."""
        return None if node_id is None else self.gate.url_of(node_id)

    def addresses(self) -> dict[str, str]:
        """Every member's Raft address (the configuration in force; before the node
        started, ``--peers``)."""
        core = self.server.core
        return core.member_state.config.addresses if core is not None else self.settings.peer_map

    def voters(self) -> frozenset[str]:
        core = self.server.core
        if core is None:
            return frozenset(self.settings.peer_map)
        return frozenset(core.member_state.config.voters)

    def members(self) -> dict[str, Any]:
        """The configuration in force, as this node sees it: every member with its
        role, addresses and, on the master, how far it has the log."""
        core = self.server.core
        if core is None:
            return {"config_index": -1, "leader_id": None, "members": []}
        st = core.status()
        config = core.member_state.config
        out = []
        for node_id, m in config.members.items():
            peer = st["peers"].get(node_id)
            match = peer["match_index"] if peer else None
            if node_id == self.settings.node_id and st["role"] == "LEADER":
                match = st["ledger_end_index"]
            out.append(
                {
                    "node_id": node_id,
                    "role": "voter" if m.voter else "learner",
                    "raft_addr": m.addr,
                    "http_url": self.url_of(node_id),
                    "incarnation": m.incarnation or None,
                    "match_index": match,
                }
            )
        return {"config_index": st["config_index"], "leader_id": st["leader_id"], "members": out}

    # ---- changes ---------------------------------------------------------------------------

    async def add(
        self, node_id: str, raft_addr: str, http_url: str | None, timeout_s: float
    ) -> int:
        """Add ``node_id`` as a learner: it receives the log, it does not vote."""
        return await self._change(AddLearner(node_id, raft_addr, http_url or ""), timeout_s)

    async def promote(self, node_id: str, timeout_s: float) -> int:
        """Make learner ``node_id`` a voter once it is within ``max_learner_lag`` entries
        of the log's end: waits (up to ``timeout_s``) for it to catch up."""
        return await self._change(Promote(node_id), timeout_s, wait_catch_up=True)

    async def remove(self, node_id: str, timeout_s: float) -> int:
        """Remove ``node_id`` (a dead one too). The master itself hands leadership over
        first and answers ``NOT_MASTER``: the new master removes it."""
        self.gate.require_master_role()
        if node_id == self.settings.node_id:
            core = self.server.core
            assert core is not None
            others = [p for p in core.member_state.other_ids]
            if not others:
                raise errors.MembershipRefusedError(
                    f"{node_id} is the only voter", reason=DLedgerCode.UNEXPECTED_ARGUMENT.name
                )
            st = core.status()["peers"]
            to = max(others, key=lambda p: st.get(p, {}).get("match_index", -1))
            await self.leadership.transfer(to, timeout_s)
            raise self.gate.not_master()
        return await self._change(Remove(node_id), timeout_s)

    async def _change(
        self, change: MembershipChange, timeout_s: float, *, wait_catch_up: bool = False
    ) -> int:
        self.gate.require_master_role()
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                return await self.server.change_membership(change, max(left, 0.1))
            except NotLeaderError:
                raise self.gate.not_master() from None
            except AppendOutcomeUnknownError as e:
                raise errors.UnknownOutcomeError(
                    f"{change}: {e.message}; `cluster members` shows whether it happened"
                ) from None
            except DLedgerError as e:
                retry = e.code in (DLedgerCode.LEADER_NOT_READY, DLedgerCode.LEADER_PENDING_FULL)
                retry |= wait_catch_up and e.code is DLedgerCode.FALL_BEHIND_TOO_MUCH
                if not retry:
                    raise self._refused(change, e) from None
                if left <= 0:
                    raise errors.BusyError(
                        f"{change} not taken within {timeout_s:g} s: {e.message}",
                        reason=e.code.name,
                        retry_after_ms=RETRY_MS,
                    ) from None
                await asyncio.sleep(min(CATCH_UP_POLL_S, left))

    def _refused(self, change: MembershipChange, e: DLedgerError) -> errors.BrokerError:
        if e.code is DLedgerCode.ILLEGAL_MEMBER_STATE:
            return errors.NodeFailedError(e.message)
        if e.code is DLedgerCode.LEADER_TRANSFERRING:
            return errors.BusyError(
                f"{change}: a leadership transfer runs", reason=e.code.name, retry_after_ms=RETRY_MS
            )
        if e.code is DLedgerCode.UNKNOWN_MEMBER:
            return errors.UnknownNodeError(e.message)
        return errors.MembershipRefusedError(f"{change}: {e.message}", reason=e.code.name)
