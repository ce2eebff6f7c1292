"""The broker's expected errors: typed, each with a stable upper-case code (docs/http.md) and
the HTTP status the API layer answers with. A broken invariant is not one of these: it
is an ``AssertionError`` or a ``StoreCorruptionError`` that stops the node."""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """An expected refusal. ``code`` is the API's error code, ``http_status`` the hint
    for the outer layer, ``fields`` extra body fields that help the client."""

    code = "INTERNAL"
    http_status = 500

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.fields}


class InvalidArgumentError(BrokerError):
    """Bad input, refused before anything is written."""

    code = "INVALID_ARGUMENT"
    http_status = 422


class PayloadTooLargeError(BrokerError):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class TopicNotFoundError(BrokerError):
    code = "TOPIC_NOT_FOUND"
    http_status = 404


class TopicConflictError(BrokerError):
    """The topic exists with another queue count."""

    code = "TOPIC_CONFLICT"
    http_status = 409


class MessageNotFoundError(BrokerError):
    code = "MESSAGE_NOT_FOUND"
    http_status = 404


class GroupNotFoundError(BrokerError):
    code = "GROUP_NOT_FOUND"
    http_status = 404


class GroupModeConflictError(BrokerError):
    """The group has another mode (``offsets`` or ``pop``), fixed when it was made."""

    code = "GROUP_MODE_CONFLICT"
    http_status = 409


class InvalidReceiptHandleError(BrokerError):
    """The receipt handle is not current: its message was acked, handed out again,
    nacked or its invisible time changed (a new handle); nothing changed."""

    code = "INVALID_RECEIPT_HANDLE"
    http_status = 409


class SequenceTooOldError(BrokerError):
    """A producer session retried a sequence below its last one: those results are gone."""

    code = "SEQUENCE_TOO_OLD"
    http_status = 409


class UnauthenticatedError(BrokerError):
    """No valid bearer token (docs/operations.md)."""

    code = "UNAUTHENTICATED"
    http_status = 401


class ForbiddenError(BrokerError):
    """The bearer token is valid but its scopes do not cover the request (docs/operations.md)."""

    code = "FORBIDDEN"
    http_status = 403


class RecallHandleNotFoundError(BrokerError):
    """A recall handle that names no delay message."""

    code = "RECALL_HANDLE_NOT_FOUND"
    http_status = 404


class AlreadyDeliveredError(BrokerError):
    """A recall of a delay message that was delivered already."""

    code = "ALREADY_DELIVERED"
    http_status = 409


class TransactionNotFoundError(BrokerError):
    """A transaction id that names no transaction (or one resolved long ago)."""

    code = "TRANSACTION_NOT_FOUND"
    http_status = 404


class TransactionResolvedError(BrokerError):
    """A commit of a transaction rolled back, or a rollback of one committed."""

    code = "TRANSACTION_RESOLVED"
    http_status = 409


class UnknownNodeError(BrokerError):
    """A node id that is not a member of the group."""

    code = "UNKNOWN_NODE"
    http_status = 409


class TransferFailedError(BrokerError):
    """A leadership transfer did not happen: ``reason`` (DLedger's code: the target
    refused, is too far behind, went silent, its connection was lost, time ran out) says
    why; this node is still the master and takes writes (``leader_id``)."""

    code = "TRANSFER_FAILED"
    http_status = 409


class MembershipRefusedError(BrokerError):
    """A membership change is not allowed as asked (``reason``: DLedger's code): the
    member exists already, is unknown, its address is another's, or it is the last
    voter. Nothing changed."""

    code = "MEMBERSHIP_REFUSED"
    http_status = 409


class NotMasterError(BrokerError):
    """This broker is a SLAVE; writes go to the master (``leader_id``, ``leader_addr``,
    ``leader_url`` when known)."""

    code = "NOT_MASTER"
    http_status = 307

    def __init__(
        self,
        message: str,
        *,
        leader_id: str | None,
        leader_addr: str | None,
        leader_url: str | None,
    ) -> None:
        super().__init__(
            message, leader_id=leader_id, leader_addr=leader_addr, leader_url=leader_url
        )
        self.leader_id = leader_id
        self.leader_addr = leader_addr
        self.leader_url = leader_url


class NoMasterError(BrokerError):
    """No master is known (an election or a new master's catch-up is under way)."""

    code = "NO_MASTER"
    http_status = 503


class UnknownOutcomeError(BrokerError):
    """Proposed, but whether it committed is unknown (leadership lost, quorum timeout).
    Retrying may duplicate unless the request carries a producer session."""

    code = "UNKNOWN_OUTCOME"
    http_status = 503


class BusyError(BrokerError):
    """Back-pressure: too many appends are waiting for a quorum."""

    code = "BUSY"
    http_status = 429


class LimitReachedError(BrokerError):
    """A node-wide limit (topics, queues) is reached: the create is refused, nothing is
    written; it succeeds again once room is made (a topic deleted) or the limit raised."""

    code = "LIMIT_REACHED"
    http_status = 429


class StorageError(BrokerError):
    """The log refused the write (disk full, body over the store's limit)."""

    code = "STORAGE_ERROR"
    http_status = 507


class DiskFullError(StorageError):
    """The node's disk is full (or dispatch is stalled on it): writes are refused until
    space returns, reads go on; ``retry_after_ms`` says when to try again."""

    code = "DISK_FULL"


class CorruptEntryError(BrokerError):
    """This replica's copy of a committed entry is damaged (its CRC does not hold): the
    read is refused, never served wrong, and another replica serves it (``node_id``
    and ``commitlog_offset`` say which copy and where)."""

    code = "CORRUPT_ENTRY"
    http_status = 503


class NodeFailedError(BrokerError):
    """The node stopped working (crash-only: a failed fsync, a dead task) and is exiting;
    another node serves."""

    code = "NODE_FAILED"
    http_status = 503
