"""The protocol's status codes as the gRPC front answers them: ``status`` and what each of
the broker's refusals becomes (``broker_error_code``)."""

from __future__ import annotations

from broker import errors

from .protocol import definition_pb2 as pb

Code = pb.Code


def status(code: int, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or pb.Code.Name(code))  # type: ignore[arg-type]


OK = status(Code.OK, "OK")


# The protocol's status code for each of the broker's refusals (the first class that
# matches); any other is INTERNAL_SERVER_ERROR.
BROKER_ERROR_CODES: tuple[tuple[type[errors.BrokerError], int], ...] = (
    (errors.PayloadTooLargeError, Code.PAYLOAD_TOO_LARGE),
    (errors.InvalidArgumentError, Code.BAD_REQUEST),
    (errors.TopicNotFoundError, Code.TOPIC_NOT_FOUND),
    (errors.BusyError, Code.TOO_MANY_REQUESTS),
    (errors.LimitReachedError, Code.TOO_MANY_REQUESTS),
    (errors.UnauthenticatedError, Code.UNAUTHORIZED),
    (errors.ForbiddenError, Code.FORBIDDEN),
    (errors.NoMasterError, Code.HA_NOT_AVAILABLE),
    (errors.NotMasterError, Code.HA_NOT_AVAILABLE),
    (errors.UnknownOutcomeError, Code.MASTER_PERSISTENCE_TIMEOUT),
    (errors.TransactionNotFoundError, Code.INVALID_TRANSACTION_ID),
    (errors.TransactionResolvedError, Code.PRECONDITION_FAILED),
    (errors.RecallHandleNotFoundError, Code.NOT_FOUND),
    (errors.AlreadyDeliveredError, Code.PRECONDITION_FAILED),
)


def broker_error_code(e: errors.BrokerError) -> int:
    """The protocol's status code for one of the broker's refusals."""
    for cls, code in BROKER_ERROR_CODES:
        if isinstance(e, cls):
            return int(code)
    return int(Code.INTERNAL_SERVER_ERROR)
