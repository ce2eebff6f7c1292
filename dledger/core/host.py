"""The narrow seams between ``DLedgerCore`` and its collaborators, as ``typing.Protocol``s.

DLedger's Java classes get the member state, the store and the RPC service, never the
server (``DLedgerLeaderElector(config, memberState, rpcService)``); hashicorp/raft gives
each collaborator a small interface of its own. Here the elector, the entry dispatcher
and the entry handler get ``MemberState``, the store and ``CoreSettings`` as they are, and
reach everything else of the node through one of these hosts. Each lists what its
collaborator truly calls, so a reader sees the whole reach of a collaborator here, and a
test can drive one with a small fake host.

Invariants the node keeps for every host:
- ``send`` only queues into the current ``Ready``: nothing leaves before the caller has
  made the Ready's hard state and entries durable (the Ready order in ``node``);
- ``next_req_id`` numbers this node's requests, strictly increasing, one sequence for
  every kind of request (answers are paired by it);
- ``log_event`` has no effect on the protocol: it is for traces and the simulator.

No module of the core's collaborators imports ``node``; ``node`` imports them (a test
checks that the package has no import circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .messages import RaftMessage
    from .snapshot import Snapshot


class Outbox(Protocol):
    """What every collaborator does to the world: queue a message, record an event."""

    def send(self, msg: RaftMessage) -> None:
        """Queue ``msg`` into the current Ready (sent after step 1 of its handling)."""
        ...

    def log_event(self, name: str, **fields: Any) -> None:
        """Record a protocol event (role changes, refusals, rounds) for traces."""
        ...


class ElectorHost(Outbox, Protocol):
    """The node as ``LeaderElector`` sees it."""

    def next_req_id(self) -> int: ...

    @property
    def installing(self) -> Snapshot | None:
        """The snapshot a follower is replacing its log with, if any: no election then."""
        ...

    def role_changed(self, now_ms: int) -> None:
        """``MemberState`` changed role, term or leader: report it and let the node's
        other collaborators follow (fail proposals, drop held pushes, append a NOOP)."""
        ...


class DispatcherHost(Outbox, Protocol):
    """The node as an ``EntryDispatcher`` (leader side, one per peer) sees it."""

    def next_req_id(self) -> int: ...

    @property
    def snapshot(self) -> Snapshot | None:
        """The newest snapshot the application registered (INSTALL_SNAPSHOT sends it)."""
        ...

    def update_peer_watermark(self, term: int, peer_id: str, index: int) -> None:
        """``peer_id`` holds entries up to ``index``, the last of them of ``term``
        (``updatePeerWaterMark``, filed under the entry's term)."""
        ...


class HandlerHost(Outbox, Protocol):
    """The node as the ``EntryHandler`` (follower side) sees it."""

    @property
    def installing(self) -> Snapshot | None: ...

    def wrote_entries(self) -> None:
        """The log changed: the Ready must sync it before any answer leaves."""
        ...

    def commit_to(self, index: int) -> None:
        """Move the committed index forward to ``index`` (the store checks it)."""
        ...

    def begin_install(self, snap: Snapshot) -> None:
        """Hand ``snap`` to the application through the Ready (step 1 installs it)."""
        ...

    def diverged(self, why: str, index: int, leader_term: int) -> None:
        """This node holds a committed entry (``index``) that its leader contradicts:
        the group lost what it acknowledged (a correct Raft never gets here; a node
        restarted with an empty disk under its old id does). Kept and reported."""
        ...
