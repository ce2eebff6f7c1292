"""The client's errors: ``LedgerMQError``, one subclass per error code a caller tells
apart, and the code → class table ``ERROR_CLASSES`` that ``make_error`` reads.

Invariant (tests/api/test_client_errors.py): the typed codes and ``UNTYPED_CODES``
together are exactly the codes a node can answer (docs/operations.md), plus the
client's own ``BROKER_UNAVAILABLE``. A code the broker gains makes that test fail until
it gets a class here or joins ``UNTYPED_CODES``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LedgerMQError(Exception):
    """An error answered by a broker (``code`` is the API's, ``status`` the HTTP status,
    ``fields`` the body's extra fields), or raised by the client itself."""

    CODE = "ERROR"

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.fields: dict[str, Any] = dict(fields or {})


class NotMasterError(LedgerMQError):
    CODE = "NOT_MASTER"

    @property
    def leader_url(self) -> str | None:
        url = self.fields.get("leader_url")
        return url if isinstance(url, str) and url else None


class NoMasterError(LedgerMQError):
    CODE = "NO_MASTER"


class UnknownOutcomeError(LedgerMQError):
    CODE = "UNKNOWN_OUTCOME"


class TopicNotFoundError(LedgerMQError):
    CODE = "TOPIC_NOT_FOUND"


class TopicConflictError(LedgerMQError):
    CODE = "TOPIC_CONFLICT"


class InvalidArgumentError(LedgerMQError):
    CODE = "INVALID_ARGUMENT"


class PayloadTooLargeError(LedgerMQError):
    CODE = "PAYLOAD_TOO_LARGE"


class MessageNotFoundError(LedgerMQError):
    CODE = "MESSAGE_NOT_FOUND"


class GroupNotFoundError(LedgerMQError):
    CODE = "GROUP_NOT_FOUND"


class SequenceTooOldError(LedgerMQError):
    CODE = "SEQUENCE_TOO_OLD"


class BusyError(LedgerMQError):
    CODE = "BUSY"


class LimitReachedError(LedgerMQError):
    """The broker's limit of topics or queues is reached (not retried: room is made by
    deleting a topic or raising the limit)."""

    CODE = "LIMIT_REACHED"


class DiskFullError(LedgerMQError):
    """The master's disk is full: it refuses writes until space returns (by itself); the
    client retries within its deadline, as the answer's ``Retry-After`` says."""

    CODE = "DISK_FULL"


class NodeFailedError(LedgerMQError):
    """The node stopped working and is exiting; another takes over (retried)."""

    CODE = "NODE_FAILED"


class CorruptEntryError(LedgerMQError):
    """That broker's copy of the message is damaged (it refuses to serve it): a read
    goes on to the next broker at once, and raises this only when none served it."""

    CODE = "CORRUPT_ENTRY"


class UnauthenticatedError(LedgerMQError):
    """No token, or one the broker does not know."""

    CODE = "UNAUTHENTICATED"


class ForbiddenError(LedgerMQError):
    """The token's scopes do not cover the request."""

    CODE = "FORBIDDEN"


class GroupModeConflictError(LedgerMQError):
    """The group has the other mode (``offsets`` or ``pop``), fixed when it was made."""

    CODE = "GROUP_MODE_CONFLICT"


class InvalidReceiptHandleError(LedgerMQError):
    """The receipt handle is not current (acked, delivered again, nacked or changed)."""

    CODE = "INVALID_RECEIPT_HANDLE"


class RecallHandleNotFoundError(LedgerMQError):
    """The recall handle names no delay message."""

    CODE = "RECALL_HANDLE_NOT_FOUND"


class AlreadyDeliveredError(LedgerMQError):
    """The delay message was delivered already: too late to recall it."""

    CODE = "ALREADY_DELIVERED"


class TransactionNotFoundError(LedgerMQError):
    """The transaction id names no transaction (or one resolved long ago)."""

    CODE = "TRANSACTION_NOT_FOUND"


class TransactionResolvedError(LedgerMQError):
    """The transaction was resolved the other way (``state`` says how)."""

    CODE = "TRANSACTION_RESOLVED"


class BrokerUnavailableError(LedgerMQError):
    """No broker answered (connection refused, timeouts) within the deadline."""

    CODE = "BROKER_UNAVAILABLE"


ERROR_CLASSES: dict[str, type[LedgerMQError]] = {
    cls.CODE: cls
    for cls in (
        NotMasterError,
        NoMasterError,
        UnknownOutcomeError,
        TopicNotFoundError,
        TopicConflictError,
        InvalidArgumentError,
        PayloadTooLargeError,
        MessageNotFoundError,
        GroupNotFoundError,
        SequenceTooOldError,
        BusyError,
        LimitReachedError,
        DiskFullError,
        NodeFailedError,
        CorruptEntryError,
        UnauthenticatedError,
        ForbiddenError,
        GroupModeConflictError,
        InvalidReceiptHandleError,
        RecallHandleNotFoundError,
        AlreadyDeliveredError,
        TransactionNotFoundError,
        TransactionResolvedError,
        BrokerUnavailableError,
    )
}


def make_error(
    code: str, message: str, status: int | None = None, fields: Mapping[str, Any] | None = None
) -> LedgerMQError:
    """The typed exception for an API error code (``LedgerMQError`` for others)."""
    return ERROR_CLASSES.get(code, LedgerMQError)(code, message, status, fields)


# Codes a node can answer that arrive as a plain ``LedgerMQError`` (``code`` says which):
# none is retried, and a caller does nothing different for one than for another.
UNTYPED_CODES = frozenset(
    {
        "INTERNAL",  # a bug on the node
        "STORAGE_ERROR",  # the store refused a write (a full disk is DISK_FULL)
        "UNKNOWN_NODE",  # a leadership transfer to a node outside the group
        "TRANSFER_FAILED",  # a leadership transfer did not happen; the master serves on
        "MEMBERSHIP_REFUSED",  # a membership change not allowed as asked; nothing changed
        "NOT_ACCEPTABLE",  # an Arrow pull from a node without pyarrow
        "NOT_FOUND",  # the HTTP layer's: no such path
        "METHOD_NOT_ALLOWED",  # nor such method
        "HTTP_ERROR",  # another refusal of the HTTP layer
        "CLIENT_DISCONNECT",  # the client went away: only the node's logs see it
        "HEADERS_TOO_LARGE",  # the request's headers are over the node's caps (431)
        "REQUEST_TIMEOUT",  # the request arrived too slowly (408)
        "TOO_MANY_CONNECTIONS",  # no connection could make room (503): retried
    }
)
# The client's own: no broker answered.
CLIENT_CODES = frozenset({BrokerUnavailableError.CODE})
