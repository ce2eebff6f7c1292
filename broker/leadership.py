"""Leadership transfer as an operator asks for it (``POST /cluster/transfer``).

Invariants (issue 26): the call returns once the target leads, or raises
``TransferFailedError`` saying why while this node is still the master: a failed
transfer changes no role. A full disk does not stop a transfer (moving leadership off a
full node is what an operator may want).
"""

from __future__ import annotations

from dledger.codes import DLedgerCode, DLedgerError
from dledger.runtime.server import DLedgerServer

from . import errors
from .gate import WriteGate
from .history import RoleHistory
from .settings import BrokerSettings


class Leadership:
    def __init__(
        self,
        settings: BrokerSettings,
        gate: WriteGate,
        server: DLedgerServer,
        history: RoleHistory | None = None,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.server = server
        self.history = history  # where a done transfer is recorded (GET /v1/cluster/history)

    def _done(self, to: str) -> None:
        if self.history is not None:
            core = self.server.core
            term = core.member_state.curr_term if core is not None else -1
            role = core.member_state.role.value.upper() if core is not None else "FOLLOWER"
            self.history.transferred(term, to, role)

    async def transfer(self, to: str, timeout_s: float = 5.0) -> None:
        """Returns once ``to`` leads (at once when ``to`` is this master). Otherwise
        ``TransferFailedError`` says why, and this node is still the master."""
        peers = self.settings.peer_map
        if to not in peers:
            raise errors.UnknownNodeError(f"{to} is not a member: {sorted(peers)}")
        self.gate.require_master_role()
        if to == self.settings.node_id:
            return
        code: DLedgerCode
        try:
            done = await self.server.transfer_leadership(to, timeout_s)
        except DLedgerError as e:
            if e.code is DLedgerCode.NOT_LEADER:  # deposed since the check above
                raise self.gate.not_master() from None
            if e.code is DLedgerCode.ILLEGAL_MEMBER_STATE:
                raise errors.NodeFailedError(e.message) from None
            code, reason = e.code, e.message
        else:
            if done.code is DLedgerCode.SUCCESS:
                self._done(to)
                return
            code, reason = done.code, done.reason
        leader = self.gate.leader_id
        if leader == to:
            self._done(to)
            return  # it leads all the same (its answer was lost, say)
        now = f"{leader} leads" if leader is not None else "no leader at the moment"
        raise errors.TransferFailedError(
            f"leadership transfer to {to} failed ({code.name}: {reason or 'no reason given'})"
            f"; {now}",
            to=to,
            reason=code.name,
            leader_id=leader,
        )
