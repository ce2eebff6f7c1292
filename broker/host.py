"""The narrow seams between ``Broker`` and the collaborators it delegates to, as
``typing.Protocol``s (as ``dledger/core/host.py`` does for the Raft core's).

The reads (``broker/reads.py``), the consumer groups (``broker/groups.py``) and the
produce path (``broker/produce.py``) get the plain objects they work on (settings, the
commit log, the consume queues, the key index, the metadata, the stats) as they are,
and reach everything else of the node through one of these hosts: what depends on the
node's role, its Raft server and its dispatcher, which come and go with ``start``. Each
lists what its collaborator truly calls, so a reader sees the whole reach of it here,
and a test can drive one with a small fake host. ``RoleHost`` (``broker/role.py``) is
the promotion's.

Invariants the broker keeps for every host:
- ``require_master`` raises the error a client should get (redirect, retry later, disk
  full, node failed) unless this node takes writes now;
- waits are bounded by their ``timeout_s`` and answer whether the target was reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dledger.codes import DLedgerError
    from dledger.store import FileStore

    from .errors import BrokerError
    from .metadata import TopicMeta


class ReadHost(Protocol):
    """The broker as the reads see it."""

    @property
    def store(self) -> FileStore: ...

    @property
    def installing(self) -> bool:
        """A leader's snapshot is replacing the consume queues and the key index."""
        ...

    def topic(self, name: str) -> TopicMeta:
        """The topic, or ``TopicNotFoundError``."""
        ...

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool:
        """Until the queue holds a message at ``queue_offset`` (long polling)."""
        ...

    def correct_min_offsets(self) -> None:
        """Move every queue's min offset past log retention has deleted (now, rather
        than at the dispatcher's next beat)."""
        ...


class GroupHost(Protocol):
    """The broker as the consumer groups see it."""

    def require_master(self) -> None: ...

    def topic(self, name: str) -> TopicMeta: ...

    async def append_meta(self, op: dict[str, Any]) -> int:
        """Append a metadata operation (an offset commit) and wait until it is applied."""
        ...

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool: ...


class ProduceHost(Protocol):
    """The broker as the produce path sees it."""

    @property
    def store(self) -> FileStore: ...

    @property
    def store_host(self) -> tuple[str, int]:
        """STOREHOST of every record this node writes."""
        ...

    @property
    def is_master(self) -> bool: ...

    @property
    def role_term(self) -> int:
        """The term of the broker role (MASTER is per term)."""
        ...

    @property
    def committed_index(self) -> int: ...

    @property
    def dispatched_index(self) -> int: ...

    def require_master(self) -> None: ...

    def append_error(self, e: DLedgerError) -> BrokerError:
        """What the client is told when the log refused an append."""
        ...

    async def wait_committed(self, index: int, timeout_s: float) -> bool: ...

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool: ...
