"""DLedger's numeric response codes, shared by the store, core and wire.

Keeping DLedger's numbers lets a reader of DLedger map our frames and logs to theirs.
"""

from __future__ import annotations

from enum import IntEnum


class DLedgerCode(IntEnum):
    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    NEWER_INSTALL_SNAPSHOT_REQUEST_EXIST = 422
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506
    LOAD_SNAPSHOT_ERROR = 507
    INSTALL_SNAPSHOT_ERROR = 508


class DLedgerError(Exception):
    """An expected failure with a DLedger code (the outer layers map it to HTTP)."""

    def __init__(self, code: DLedgerCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
