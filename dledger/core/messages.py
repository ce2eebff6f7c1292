"""The protocol's messages: frozen, slotted values the core takes in and puts out.

Every message names its ``group``, its sender (``local_id``) and receiver (``remote_id``),
the sender's ``term``, and a ``req_id``: requests number themselves per sender, and a
response echoes the number of the request it answers, so the core can pair them without
any RPC machinery (the runtime's wire format carries the same fields).

Vocabulary follows DLedger: ``VoteRequest``/``VoteResponse`` with every ``VoteResult``
, ``HeartBeatRequest``, ``PushEntryRequest`` of type APPEND, COMMIT,
COMPARE or TRUNCATE, ``LeadershipTransferRequest`` and
``InstallSnapshotRequest`` (Raft §7: the application's snapshot for a follower
whose next entry the leader no longer holds). A vote request with ``pre_vote=True`` is
SOFAJRaft's pre-vote: it asks "would you vote for me at ``term``?" and changes
nothing on the receiver.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import get_args

from ..codes import DLedgerCode

MAX_TERM = (1 << 62) - 1
"""The highest term a node adopts or sends. The wire refuses a frame beyond it (and
beyond ``MAX_INDEX``), so ``term + 1`` always fits the wire's i64 and a forged frame
cannot push a group past what it can encode; ``CoreSettings.max_term_jump`` keeps
strangers from walking it there one frame at a time."""

MAX_INDEX = (1 << 62) - 1
"""The highest entry index (or byte position) a frame may name."""


class Role(Enum):
    """Raft roles (the broker maps them to MASTER/SLAVE in one place)."""

    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"


class RequestCode(IntEnum):
    """DLedger's request codes (``DLedgerRequestCode``); the wire format uses them."""

    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005
    # Ours: DLedger gives INSTALL_SNAPSHOT no number (it sends it as a PUSH type); it has
    # its own messages here, so the next free code of the peer range.
    INSTALL_SNAPSHOT = 51006


class VoteResult(IntEnum):
    """Every vote result code, in DLedger's order."""

    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2
    REJECT_UNEXPECTED_LEADER = 3
    REJECT_EXPIRED_VOTE_TERM = 4
    REJECT_ALREADY_VOTED = 5
    REJECT_ALREADY_HAS_LEADER = 6
    REJECT_TERM_NOT_READY = 7
    REJECT_TERM_SMALL_THAN_LEDGER = 8
    REJECT_EXPIRED_LEDGER_TERM = 9
    REJECT_SMALL_LEDGER_END_INDEX = 10
    REJECT_TAKING_LEADERSHIP = 11


class ParseResult(Enum):
    """The candidate's reading of a vote round."""

    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"
    PASSED = "PASSED"
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"


class PushType(IntEnum):
    """``PushEntryRequest.Type``."""

    APPEND = 0
    COMMIT = 1
    COMPARE = 2
    TRUNCATE = 3
    INSTALL_SNAPSHOT = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRequest:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    leader_id: str  # the candidate (DLedger's field name)
    ledger_end_index: int
    ledger_end_term: int
    pre_vote: bool = False
    cluster: str = ""  # the sender's cluster id (``membership``); "" not known yet


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse:
    group: str
    local_id: str
    remote_id: str
    term: int  # the voter's term (its ledger end term for REJECT_TERM_SMALL_THAN_LEDGER)
    req_id: int
    vote_result: VoteResult
    pre_vote: bool = False
    incarnation: str = ""  # the voter's data directory's (``membership``); "" unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartBeatRequest:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    leader_id: str
    cluster: str = ""
    leader_addr: str = ""  # the leader's Raft address (a node that does not know it yet)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartBeatResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    incarnation: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PushEntryRequest:
    """APPEND carries ``entries``: the leader's raw entry bytes for indexes
    ``first_index .. first_index + count - 1``, which the follower writes as they are."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    leader_id: str
    type: PushType
    commit_index: int
    pre_log_index: int = -1
    pre_log_term: int = -1
    first_index: int = -1
    count: int = 0
    cluster: str = ""
    leader_addr: str = ""
    entries: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class PushEntryResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    type: PushType
    index: int = -1  # first entry index of the APPEND answered
    count: int = 0
    begin_index: int = -1
    end_index: int = -1
    x_term: int = -1  # follower's term at the conflict point (COMPARE), -1 if none
    x_index: int = -1  # first index of x_term on the follower
    incarnation: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeadershipTransferRequest:
    """Sent by the leader (``local_id``) to the transferee."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    transfer_id: str  # the leader giving up leadership
    transferee_id: str
    take_leadership_ledger_index: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class LeadershipTransferResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshotRequest:
    """The leader's snapshot for a follower behind the leader's log head.

    The snapshot (``total`` bytes) covers entries up to ``last_included_index`` (of
    ``last_included_term``, chain CRC ``before_begin_chain``); the follower's log
    restarts at ``last_included_index + 1`` at byte ``next_pos``. One request carries one
    chunk of it, ``data`` = the snapshot's bytes ``offset .. offset + len(data)`` (at
    most ``CoreSettings.snapshot_chunk_bytes``; Raft §7's ``offset``, and ``done`` is
    ``offset + len(data) == total``)."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    leader_id: str
    last_included_index: int
    last_included_term: int
    before_begin_chain: int  # u32
    next_pos: int
    commit_index: int
    offset: int = 0
    total: int = 0
    # the configuration in force at the snapshot: its entry's index and term, and its
    # body (``membership.Configuration.encode``); "" for none
    config_index: int = -1
    config_term: int = 0
    config: str = ""
    cluster: str = ""
    leader_addr: str = ""
    data: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshotResponse:
    """SUCCESS with ``received`` < the snapshot's size: the follower holds the first
    ``received`` bytes of that snapshot and wants the chunk from there. SUCCESS with
    ``received`` = the size: it holds everything up to ``last_included_index`` (installed
    now, or it had it); its log's range after the answer is ``begin_index .. end_index``."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    last_included_index: int = -1
    begin_index: int = -1
    end_index: int = -1
    received: int = 0
    incarnation: str = ""


# ---- client protocol (served by the runtime, not the core) -------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequest:
    """A client's batch append; answered after quorum commit (or with an error code)."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    bodies: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    leader_id: str = ""  # where to go instead (AP-04)
    first_index: int = -1
    positions: tuple[int, ...] = ()  # pos of each appended entry, in order


@dataclass(frozen=True, slots=True, kw_only=True)
class GetRequest:
    """Read committed entries ``index ..`` (at most ``max_count`` of them)."""

    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    index: int
    max_count: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class GetResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    leader_id: str = ""
    entries: bytes = b""  # raw entry bytes as stored


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataRequest:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataResponse:
    group: str
    local_id: str
    remote_id: str
    term: int
    req_id: int
    code: DLedgerCode
    status_json: bytes = b"{}"  # the node's status() as JSON


Request = (
    VoteRequest
    | HeartBeatRequest
    | PushEntryRequest
    | LeadershipTransferRequest
    | InstallSnapshotRequest
)
Response = (
    VoteResponse
    | HeartBeatResponse
    | PushEntryResponse
    | LeadershipTransferResponse
    | InstallSnapshotResponse
)
RaftMessage = Request | Response
ClientRequest = AppendRequest | GetRequest | MetadataRequest
ClientResponse = AppendResponse | GetResponse | MetadataResponse
PEER_MESSAGE_TYPES: tuple[type, ...] = get_args(RaftMessage)  # what peers send each other

REQUEST_CODE_OF: dict[type, RequestCode] = {
    VoteRequest: RequestCode.VOTE,
    VoteResponse: RequestCode.VOTE,
    HeartBeatRequest: RequestCode.HEART_BEAT,
    HeartBeatResponse: RequestCode.HEART_BEAT,
    PushEntryRequest: RequestCode.PUSH,
    PushEntryResponse: RequestCode.PUSH,
    LeadershipTransferRequest: RequestCode.LEADERSHIP_TRANSFER,
    LeadershipTransferResponse: RequestCode.LEADERSHIP_TRANSFER,
    InstallSnapshotRequest: RequestCode.INSTALL_SNAPSHOT,
    InstallSnapshotResponse: RequestCode.INSTALL_SNAPSHOT,
    AppendRequest: RequestCode.APPEND,
    AppendResponse: RequestCode.APPEND,
    GetRequest: RequestCode.GET,
    GetResponse: RequestCode.GET,
    MetadataRequest: RequestCode.METADATA,
    MetadataResponse: RequestCode.METADATA,
}
