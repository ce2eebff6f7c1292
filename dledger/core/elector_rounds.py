"""The elector's rounds: what a candidate, a pre-voting node and a leader collect from the
answers to one round of requests, and what DLedger reads from the counts.

A round replaces one of DLedger's latches: answers are paired with it by ``req_id`` (the
elector drops any other), each is counted once (``answered``), and the round is read as
soon as the latch would open (``complete``) or its deadline passes. Everything here is
pure: no clock, no sends, no member state; ``LeaderElector`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..codes import DLedgerCode
from .messages import ParseResult, VoteResult

Quorum = Callable[[int], bool]
"""``MemberState.is_quorum``: is this many nodes, self included, a majority?"""


@dataclass(slots=True)
class VoteRound:
    """The candidate's counters for one round."""

    term: int
    req_id: int
    deadline_ms: int
    known_max_term: int
    all_num: int = 0
    valid_num: int = 0
    accepted_num: int = 0
    not_ready_term_num: int = 0
    bigger_ledger_num: int = 0
    already_has_leader: bool = False
    answered: set[str] = field(default_factory=set)

    def count(self, voter: str, result: VoteResult, term: int) -> None:
        """The per-answer callback: each of DLedger's vote result codes counted."""
        self.answered.add(voter)
        self.all_num += 1
        if result is not VoteResult.UNKNOWN:
            self.valid_num += 1
        if result is VoteResult.ACCEPT:
            self.accepted_num += 1
        elif result is VoteResult.REJECT_ALREADY_HAS_LEADER:
            self.already_has_leader = True
        elif result in (
            VoteResult.REJECT_TERM_SMALL_THAN_LEDGER,
            VoteResult.REJECT_EXPIRED_VOTE_TERM,
        ):
            self.known_max_term = max(self.known_max_term, term)
        elif result in (
            VoteResult.REJECT_EXPIRED_LEDGER_TERM,
            VoteResult.REJECT_SMALL_LEDGER_END_INDEX,
        ):
            self.bigger_ledger_num += 1
        elif result is VoteResult.REJECT_TERM_NOT_READY:
            self.not_ready_term_num += 1

    def complete(self, q: Quorum, peers: int) -> bool:
        """Would DLedger's latch open: a leader is known, a quorum accepted (or will, once
        the not-ready ones adopt the term), or all ``peers`` answered?"""
        return (
            self.already_has_leader
            or q(self.accepted_num)
            or q(self.accepted_num + self.not_ready_term_num)
            or self.all_num == peers
        )


def parse_vote_round(
    r: VoteRound, q: Quorum, *, election_timeout_ms: int, max_vote_interval_ms: int
) -> tuple[ParseResult, int | None]:
    """From tally to ``ParseResult``, in DLedger's order, with how long past a random
    vote interval the next round waits (None: no new wait; it passed, or revotes now)."""
    if r.known_max_term > r.term:
        return ParseResult.WAIT_TO_VOTE_NEXT, 0
    if r.already_has_leader:
        return ParseResult.WAIT_TO_REVOTE, election_timeout_ms
    if not q(r.valid_num):
        return ParseResult.WAIT_TO_REVOTE, 0
    if not q(r.valid_num - r.bigger_ledger_num):
        return ParseResult.WAIT_TO_REVOTE, max_vote_interval_ms
    if q(r.accepted_num):
        return ParseResult.PASSED, None
    if q(r.accepted_num + r.not_ready_term_num):
        return ParseResult.REVOTE_IMMEDIATELY, None  # same term, next tick
    return ParseResult.WAIT_TO_VOTE_NEXT, 0


@dataclass(slots=True)
class PreVoteRound:
    term: int  # the term the candidate would move to
    req_id: int
    deadline_ms: int
    granted: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    max_term: int = -1
    early: bool = False  # a follower's, after its leader's connection closed (issue 18)

    def count(self, voter: str, result: VoteResult, term: int) -> None:
        self.answered.add(voter)
        self.max_term = max(self.max_term, term)
        if result is VoteResult.ACCEPT:
            self.granted.add(voter)

    def complete(self, q: Quorum, peers: int) -> bool:
        """A quorum granted it, or all ``peers`` answered."""
        return q(len(self.granted)) or len(self.answered) == peers


@dataclass(slots=True)
class HeartbeatRound:
    """``sendHeartbeats`` counters; self counts as answered and successful."""

    term: int
    req_id: int
    deadline_ms: int
    all_num: int = 1
    succ_num: int = 1
    not_ready_num: int = 0
    max_term: int = -1
    inconsistent_leader: bool = False
    answered: set[str] = field(default_factory=set)

    def count(self, voter: str, code: DLedgerCode, term: int) -> None:
        self.answered.add(voter)
        self.all_num += 1
        if code is DLedgerCode.SUCCESS:
            self.succ_num += 1
        elif code is DLedgerCode.EXPIRED_TERM:
            self.max_term = max(self.max_term, term)  # the fix of DLedger's bug: the maximum
        elif code is DLedgerCode.INCONSISTENT_LEADER:
            self.inconsistent_leader = True
        elif code is DLedgerCode.TERM_NOT_READY:
            self.not_ready_num += 1

    def complete(self, q: Quorum, peers: int) -> bool:
        """A quorum answered SUCCESS (or will, once the not-ready ones adopt the term), or
        all ``peers`` answered."""
        return q(self.succ_num) or q(self.succ_num + self.not_ready_num) or self.all_num == peers
