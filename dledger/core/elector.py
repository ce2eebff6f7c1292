"""``LeaderElector``: DLedger's election with pre-vote and check-quorum.

One object per node, driven by ``maintain(now_ms)`` on every tick and by
the vote and heartbeat messages the node routes to it. Rounds replace DLedger's latches:
a round (``elector_rounds``: its counters and what DLedger reads from them) collects
answers paired by ``req_id`` and is read (``_parse_vote_round``,
``_finish_heartbeat_round``) as soon as the latch would open or its deadline passes.

Departures from DLedger, each for Raft safety or failover time (docs/architecture.md):
- Pre-vote (SOFAJRaft's): a candidate raises its term past every term it has heard of
  only after a majority says it would vote for it; a node returning from a partition can
  therefore not push a healthy leader out with an inflated term.
- A follower whose leader went quiet starts its first round in a *new* term (textbook
  Raft) instead of re-asking in the old one, where every voter has already voted:
  that round could only fail and cost a vote interval. Pre-vote keeps it harmless.
- Check-quorum: a leader that has heard from no majority (heartbeat or push answers) for
  an election timeout steps down (DLedger counts heartbeat rounds only).
- ``max_term`` of a heartbeat round keeps the maximum answer (DLedger's bug sets it).
- Early pre-vote (issue 18): a follower whose connection from or to its leader closed
  (``on_peer_connection_lost``: a crashed process's sockets are closed by its kernel)
  pre-votes after a 0..20 ms jitter (followers in turns by id, 40 ms apart) instead of
  an election timeout, still a follower.
  Only a granted pre-vote makes it a candidate. A voter that still hears the leader
  refuses (``leader_alive``), so one follower's broken link deposes nobody; at most one
  early pre-vote per leader and term, so a flapping link cannot cause a storm. A
  paused or partitioned leader closes nothing: that still costs the election timeout.

Invariants of the early pre-vote: it never changes term, vote or role by itself;
``leader_connection_lost`` is set only by a close of the current leader's connection
and cleared whenever the leader is heard from; while it is set this follower counts
its leader as not alive (it grants pre-votes), nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..codes import DLedgerCode
from .elector_rounds import HeartbeatRound, PreVoteRound, VoteRound, parse_vote_round
from .messages import (
    MAX_TERM,
    HeartBeatRequest,
    HeartBeatResponse,
    ParseResult,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)

if TYPE_CHECKING:
    import random

    from .host import ElectorHost
    from .member_state import MemberState
    from .settings import CoreSettings


class LeaderElector:
    """``DLedgerLeaderElector``: the state maintainer's election half, one per node."""

    def __init__(
        self,
        member_state: MemberState,
        settings: CoreSettings,
        rng: random.Random,
        host: ElectorHost,
    ) -> None:
        self.member_state = member_state
        self.settings = settings
        self.rng = rng  # the node's seeded source, for the vote timers
        self.host = host
        self.last_leader_heartbeat_ms = -1
        self.last_send_heartbeat_ms = -1
        self.last_succ_heartbeat_ms = -1
        self.next_time_to_request_vote_ms = -1
        self.need_increase_term_immediately = False
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self.member_state.curr_vote_for == self.member_state.self_id:
            # We may have led this term before a restart. A leader must create at most
            # one entry per (index, term) (Raft §5.3), so campaign in a new term.
            self.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
        elif member_state.config_index >= 0:
            # DLedger's first round in the current term is safe for a fixed voter set
            # only: a majority that elected this term's leader overlaps any majority of
            # the same voters, each of which voted in it. After membership changes the
            # voters of now may never have voted in this term (new members, data
            # directories replaced), and a second leader of it could win (simulator).
            self.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
        self.vote_round: VoteRound | None = None
        self.pre_vote_round: PreVoteRound | None = None
        self.heartbeat_round: HeartbeatRound | None = None
        self.peer_heard_ms: dict[str, int] = {}  # leader: last answer from each peer
        # Follower, issue 18 (see the module docstring): the leader's connection closed
        # and it was not heard from since; when the early pre-vote starts (-1: none);
        # the (term, leader) the one early pre-vote allowed was spent on.
        self.leader_connection_lost = False
        self.early_pre_vote_ms = -1
        self.early_pre_vote_spent: tuple[int, str] | None = None

    # ---- timers --------------------------------------------------------------------------

    def next_time_to_request_vote(self, now_ms: int) -> int:
        """now + a random vote interval (30-100 ms while taking leadership)."""
        s = self.settings
        if self.member_state.is_taking_leadership():
            lo, hi = s.taking_leadership_vote_min_ms, s.taking_leadership_vote_max_ms
        else:
            lo, hi = s.min_vote_interval_ms, s.max_vote_interval_ms
        return now_ms + self.rng.randint(lo, hi)

    def maintain(self, now_ms: int) -> None:
        """``maintainState``, after closing any round whose deadline passed."""
        self._expire_rounds(now_ms)
        if self.host.installing is not None and self.member_state.role is not Role.LEADER:
            # Replacing the log with a snapshot: no election timeout, no (pre-)vote until
            # it is done (SOFAJRaft skips pre-vote while installing).
            return
        if self.member_state.role is Role.LEADER:
            self._maintain_as_leader(now_ms)
        elif self.member_state.role is Role.FOLLOWER:
            self._maintain_as_follower(now_ms)
        else:
            self._maintain_as_candidate(now_ms)

    def _expire_rounds(self, now_ms: int) -> None:
        if self.vote_round and now_ms >= self.vote_round.deadline_ms:
            self._parse_vote_round(now_ms)
        if self.pre_vote_round and now_ms >= self.pre_vote_round.deadline_ms:
            self._finish_pre_vote_round(now_ms)
        if self.heartbeat_round and now_ms >= self.heartbeat_round.deadline_ms:
            self._finish_heartbeat_round(now_ms)

    # ---- role changes ------------------------------------------------------

    def change_role_to_leader(self, term: int, now_ms: int) -> None:
        if self.member_state.curr_term != term or self.member_state.role is not Role.CANDIDATE:
            return
        self.member_state.change_to_leader(term)
        self.last_send_heartbeat_ms = -1  # heartbeat at once
        self.last_succ_heartbeat_ms = now_ms
        self.peer_heard_ms.clear()
        self.host.role_changed(now_ms)

    def change_role_to_candidate(self, term: int, now_ms: int) -> None:
        if term < self.member_state.curr_term:
            return
        was = self.member_state.role
        self.member_state.change_to_candidate(term)
        self.heartbeat_round = None
        if was is Role.LEADER:  # a deposed leader campaigns in a new term, behind pre-vote
            self.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_time_to_request_vote_ms = self.next_time_to_request_vote(now_ms)
        if was is not Role.CANDIDATE:
            self.host.role_changed(now_ms)

    def raise_term_now(self, term: int, now_ms: int) -> None:
        """Become CANDIDATE and adopt ``term`` at the next candidate beat, without
        waiting a vote interval (``needIncreaseTermImmediately``): a peer
        is at a higher term, or this node takes leadership over."""
        self.change_role_to_candidate(term, now_ms)
        self.need_increase_term_immediately = True

    def change_role_to_follower(self, term: int, leader_id: str, now_ms: int) -> None:
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        self.vote_round = self.pre_vote_round = None
        self.member_state.change_to_follower(term, leader_id)
        self.heard_leader(now_ms)
        self.host.role_changed(now_ms)

    # ---- follower -----------------------------------------------------------------

    def heard_leader(self, now_ms: int) -> None:
        """A heartbeat or push of this term's leader arrived: it is alive."""
        self.last_leader_heartbeat_ms = now_ms
        self.leader_connection_lost = False
        self.early_pre_vote_ms = -1

    def _maintain_as_follower(self, now_ms: int) -> None:
        if not self.member_state.is_voter:
            return  # a learner waits for a leader: it never campaigns
        if now_ms - self.last_leader_heartbeat_ms > self.settings.election_timeout_ms:
            self.change_role_to_candidate(self.member_state.curr_term, now_ms)
            # textbook Raft: the next round is in a new term (see the module docstring)
            self.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_time_to_request_vote_ms = -1
            self.early_pre_vote_ms = -1
        elif 0 <= self.early_pre_vote_ms <= now_ms and self.pre_vote_round is None:
            self.early_pre_vote_ms = -1
            self._start_pre_vote(now_ms, self.member_state.curr_term + 1, early=True)

    # ---- early pre-vote: the leader's connection closed (issue 18) ------------------------

    def on_peer_connection_lost(self, peer_id: str, now_ms: int) -> None:
        """The transport saw a connection from or to ``peer_id`` end (EOF, reset, refused
        on reconnect). If ``peer_id`` is this follower's leader: count the leader as not
        heard, and schedule the one early pre-vote of this term and leader, after a
        jitter. Changes neither term, vote nor role."""
        member_state, s = self.member_state, self.settings
        if not (s.pre_vote and s.early_pre_vote) or member_state.role is not Role.FOLLOWER:
            return
        if not member_state.is_voter:
            return
        if peer_id != member_state.leader_id:
            return
        self.leader_connection_lost = True
        if self.early_pre_vote_spent == (member_state.curr_term, peer_id):
            return  # spent: a flapping link waits for the election timeout as before
        self.early_pre_vote_spent = (member_state.curr_term, peer_id)
        # Followers go in turns, by id: the k-th waits k slots of twice the jitter (a
        # 10 ms beat apart at least), so the first one's pre-vote reaches the others
        # before their turn and they stand down (``on_vote_request``): no split vote.
        # A later one goes only if the earlier ones did not (dead, or behind in log).
        turn = [p for p in member_state.peer_ids if p != peer_id].index(member_state.self_id)
        jitter = s.early_pre_vote_jitter_ms
        self.early_pre_vote_ms = now_ms + 2 * jitter * turn + self.rng.randint(0, jitter)
        self.host.log_event("leader_connection_lost", leader=peer_id, term=member_state.curr_term)

    def _finish_early_pre_vote(self, r: PreVoteRound, now_ms: int) -> None:
        """A follower's early round ended: campaign only if a majority granted it and the
        leader has still not been heard from; otherwise stay its follower."""
        member_state = self.member_state
        granted = member_state.is_quorum(len(r.granted))
        self.host.log_event(
            "early_pre_vote", term=r.term, granted=len(r.granted), leader=member_state.leader_id
        )
        if not granted or not self.leader_connection_lost or r.term != member_state.curr_term + 1:
            return
        self.change_role_to_candidate(member_state.curr_term, now_ms)
        member_state.next_term()
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        self.next_time_to_request_vote_ms = now_ms  # a REVOTE_IMMEDIATELY goes next beat
        self._start_vote(now_ms, member_state.curr_term)

    # ---- candidate -------------------------------------------------------

    def _maintain_as_candidate(self, now_ms: int) -> None:
        if not self.member_state.is_voter:
            # A learner (or a removed member) adopts a higher term it heard of, so the
            # leader of that term finds it ready, and never asks for a vote.
            self.vote_round = self.pre_vote_round = None
            if self.need_increase_term_immediately:
                self.need_increase_term_immediately = False
                if self.member_state.known_max_term > self.member_state.curr_term:
                    self.member_state.next_term()
            return
        if self.need_increase_term_immediately:
            # a higher term is known: any round in flight is moot; adopt the term now
            # (a pre-vote waiting on a dead peer would otherwise keep answering
            # TERM_NOT_READY to the candidate that is about to win)
            self.vote_round = self.pre_vote_round = None
        elif self.vote_round or self.pre_vote_round:
            return  # waiting for answers (the latch)
        if self.next_time_to_request_vote_ms == -1 and not self.need_increase_term_immediately:
            self.next_time_to_request_vote_ms = self.next_time_to_request_vote(now_ms)
            if self.last_parse_result is not ParseResult.WAIT_TO_VOTE_NEXT:
                return  # a fresh node waits one random interval: fewer split votes
        if now_ms < self.next_time_to_request_vote_ms and not self.need_increase_term_immediately:
            return
        member_state = self.member_state
        if (
            member_state.curr_term >= MAX_TERM
            and member_state.known_max_term <= member_state.curr_term
        ):
            # No term left to move to (see MAX_TERM; unreachable but by forgery).
            self.host.log_event("term_space_exhausted", term=member_state.curr_term)
            self.need_increase_term_immediately = False
            self.next_time_to_request_vote_ms = self.next_time_to_request_vote(now_ms)
            return
        if self.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT or (
            self.need_increase_term_immediately
        ):
            if (
                self.settings.pre_vote
                and not self.need_increase_term_immediately
                and member_state.known_max_term <= member_state.curr_term
                and not member_state.is_taking_leadership()
            ):
                self._start_pre_vote(now_ms, member_state.curr_term + 1)
                return
            member_state.next_term()
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self.need_increase_term_immediately:  # adopt the term, vote next time
            self.next_time_to_request_vote_ms = self.next_time_to_request_vote(now_ms)
            self.need_increase_term_immediately = False
            return
        self._start_vote(now_ms, member_state.curr_term)

    def _start_vote(self, now_ms: int, term: int) -> None:
        member_state, host = self.member_state, self.host
        req_id = host.next_req_id()
        r = VoteRound(
            term=term,
            req_id=req_id,
            deadline_ms=now_ms + self.settings.vote_response_timeout_ms,
            known_max_term=term,
        )
        self.vote_round = r
        end_index, end_term = member_state.ledger_end_index, member_state.ledger_end_term
        for peer in member_state.peer_ids:
            req = VoteRequest(
                group=member_state.group,
                local_id=member_state.self_id,
                remote_id=peer,
                term=term,
                req_id=req_id,
                leader_id=member_state.self_id,
                ledger_end_index=end_index,
                ledger_end_term=end_term,
                cluster=member_state.config.cluster,
            )
            if peer == member_state.self_id:
                result, resp_term = self.handle_vote(req, now_ms, self_vote=True)
                self._tally(r, member_state.self_id, result, resp_term, now_ms)
            else:
                host.send(req)

    def on_vote_response(self, resp: VoteResponse, now_ms: int) -> None:
        if resp.pre_vote:
            self._on_pre_vote_response(resp, now_ms)
            return
        r = self.vote_round
        if r is None or resp.req_id != r.req_id or resp.local_id in r.answered:
            return
        if not self._counts(resp.local_id, resp.incarnation):
            return  # a learner's (or a removed member's) vote counts for nothing
        self._tally(r, resp.local_id, resp.vote_result, resp.term, now_ms)

    def _counts(self, voter: str, incarnation: str) -> bool:
        """Does this answer count in a round: a voter's, from the incarnation its
        configuration names (not a lost data directory's, come back under its id)?"""
        member_state = self.member_state
        if voter not in member_state.peer_ids:
            return False
        if not member_state.answered_as_member(voter, incarnation):
            self.host.log_event("stranger_incarnation", node=voter, incarnation=incarnation)
            return False
        return True

    def _tally(self, r: VoteRound, voter: str, result: VoteResult, term: int, now_ms: int) -> None:
        r.count(voter, result, term)
        if r.complete(self.member_state.is_quorum, len(self.member_state.peer_ids)):
            self._parse_vote_round(now_ms)

    def _parse_vote_round(self, now_ms: int) -> None:
        """Close the round and act on what it says (``parse_vote_round``): the next
        round's time, a higher term to adopt, or leadership."""
        r, self.vote_round = self.vote_round, None
        assert r is not None
        member_state = self.member_state
        if member_state.role is not Role.CANDIDATE or member_state.curr_term != r.term:
            return  # the round went stale: a heartbeat or a higher term got here first
        # Drawn whatever the result: the node's seeded rng sequence depends on it.
        nxt = self.next_time_to_request_vote(now_ms)
        result, wait_ms = parse_vote_round(
            r,
            member_state.is_quorum,
            election_timeout_ms=self.settings.election_timeout_ms,
            max_vote_interval_ms=self.settings.max_vote_interval_ms,
        )
        if wait_ms is not None:
            self.next_time_to_request_vote_ms = nxt + wait_ms
        if r.known_max_term > r.term:
            self.change_role_to_candidate(r.known_max_term, now_ms)
        self.last_parse_result = result
        self.host.log_event(
            "vote_round",
            term=r.term,
            result=result.value,
            all=r.all_num,
            accepted=r.accepted_num,
            not_ready=r.not_ready_term_num,
            bigger=r.bigger_ledger_num,
            has_leader=r.already_has_leader,
        )
        if result is ParseResult.PASSED:
            self.change_role_to_leader(r.term, now_ms)

    # ---- pre-vote ----------------------------------------------------------------------

    def _start_pre_vote(self, now_ms: int, term: int, *, early: bool = False) -> None:
        member_state, host = self.member_state, self.host
        r = PreVoteRound(
            term=term,
            req_id=host.next_req_id(),
            deadline_ms=now_ms + self.settings.vote_response_timeout_ms,
            early=early,
        )
        self.pre_vote_round = r
        r.granted.add(member_state.self_id)
        r.answered.add(member_state.self_id)
        for peer in member_state.other_ids:
            host.send(
                VoteRequest(
                    group=member_state.group,
                    local_id=member_state.self_id,
                    remote_id=peer,
                    term=term,
                    req_id=r.req_id,
                    leader_id=member_state.self_id,
                    ledger_end_index=member_state.ledger_end_index,
                    ledger_end_term=member_state.ledger_end_term,
                    pre_vote=True,
                    cluster=member_state.config.cluster,
                )
            )
        self._check_pre_vote_round(now_ms)

    def _on_pre_vote_response(self, resp: VoteResponse, now_ms: int) -> None:
        r = self.pre_vote_round
        if r is None or resp.req_id != r.req_id or resp.local_id in r.answered:
            return
        if not self._counts(resp.local_id, resp.incarnation):
            return  # a learner's (or a removed member's) answer counts for nothing
        r.count(resp.local_id, resp.vote_result, resp.term)
        self._check_pre_vote_round(now_ms)

    def _check_pre_vote_round(self, now_ms: int) -> None:
        r = self.pre_vote_round
        assert r is not None
        if r.complete(self.member_state.is_quorum, len(self.member_state.peer_ids)):
            self._finish_pre_vote_round(now_ms)

    def _finish_pre_vote_round(self, now_ms: int) -> None:
        r, self.pre_vote_round = self.pre_vote_round, None
        assert r is not None
        member_state = self.member_state
        if r.early and member_state.role is Role.FOLLOWER:
            self._finish_early_pre_vote(r, now_ms)
            return
        if member_state.role is not Role.CANDIDATE or r.term != member_state.curr_term + 1:
            return
        if self.need_increase_term_immediately:
            return  # another candidate's term arrived meanwhile: adopt it, split no vote
        if r.max_term > member_state.curr_term:
            member_state.known_max_term = max(member_state.known_max_term, r.max_term)
        granted = member_state.is_quorum(len(r.granted))
        self.host.log_event("pre_vote", term=r.term, granted=len(r.granted))
        if not granted:
            self.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_time_to_request_vote_ms = self.next_time_to_request_vote(now_ms)
            return
        member_state.next_term()
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        self._start_vote(now_ms, member_state.curr_term)

    def handle_pre_vote(self, req: VoteRequest, now_ms: int) -> tuple[VoteResult, int]:
        """Would this node vote for ``req.leader_id`` at ``req.term``? Changes nothing."""
        member_state = self.member_state
        if req.leader_id not in member_state.peers or req.leader_id == member_state.self_id:
            return VoteResult.REJECT_UNKNOWN_LEADER, member_state.curr_term
        if req.term <= member_state.curr_term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM, member_state.curr_term
        log_check = self._log_check(req)
        if log_check is not None:
            return log_check, member_state.curr_term
        if self.leader_alive(now_ms):
            return VoteResult.REJECT_ALREADY_HAS_LEADER, member_state.curr_term
        return VoteResult.ACCEPT, member_state.curr_term

    def leader_alive(self, now_ms: int) -> bool:
        """This node leads, or heard its leader within an election timeout and has not
        seen its connection close since (issue 18)."""
        if self.member_state.role is Role.LEADER:
            return True
        return (
            self.member_state.role is Role.FOLLOWER
            and not self.leader_connection_lost
            and now_ms - self.last_leader_heartbeat_ms <= self.settings.election_timeout_ms
        )

    # ---- voter -------------------------------------------------------------

    def _log_check(self, req: VoteRequest) -> VoteResult | None:
        """Is the candidate's log at least as up to date as ours?"""
        end_term, end_index = self.member_state.ledger_end_term, self.member_state.ledger_end_index
        if req.ledger_end_term < end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if req.ledger_end_term == end_term and req.ledger_end_index < end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        return None

    def handle_vote(  # noqa: PLR0911  # DLedger's decision order: one return per rule
        self, req: VoteRequest, now_ms: int, *, self_vote: bool = False
    ) -> tuple[VoteResult, int]:
        """``handleVote``: the decision order DLedger follows; returns (result, term)."""
        member_state = self.member_state
        cand = req.leader_id
        if cand not in member_state.peers:
            return VoteResult.REJECT_UNKNOWN_LEADER, member_state.curr_term
        if not self_vote and cand == member_state.self_id:
            return VoteResult.REJECT_UNEXPECTED_LEADER, member_state.curr_term
        log_check = self._log_check(req)
        if log_check is not None:
            return log_check, member_state.curr_term
        if req.term < member_state.curr_term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM, member_state.curr_term
        if req.term == member_state.curr_term:
            if member_state.curr_vote_for is not None and member_state.curr_vote_for != cand:
                if member_state.leader_id is not None:
                    return VoteResult.REJECT_ALREADY_HAS_LEADER, member_state.curr_term
                return VoteResult.REJECT_ALREADY_VOTED, member_state.curr_term
        else:  # a vote is only granted at equal terms
            self.raise_term_now(req.term, now_ms)
            return VoteResult.REJECT_TERM_NOT_READY, member_state.curr_term
        if req.term < member_state.ledger_end_term:
            return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, member_state.ledger_end_term
        if (
            not self_vote
            and member_state.is_taking_leadership()
            and req.ledger_end_term == member_state.ledger_end_term
            and member_state.ledger_end_index >= req.ledger_end_index
        ):
            return VoteResult.REJECT_TAKING_LEADERSHIP, member_state.curr_term
        member_state.set_vote(cand)
        return VoteResult.ACCEPT, member_state.curr_term

    def on_vote_request(self, req: VoteRequest, now_ms: int) -> VoteResponse:
        if req.pre_vote:
            result, term = self.handle_pre_vote(req, now_ms)
            if result is VoteResult.ACCEPT:
                # Another follower campaigns already: leave it to it (no split vote;
                # should it fail, the election timeout is still there).
                self.early_pre_vote_ms = -1
        else:
            result, term = self.handle_vote(req, now_ms)
        return VoteResponse(
            group=self.member_state.group,
            local_id=self.member_state.self_id,
            remote_id=req.local_id,
            term=term,
            req_id=req.req_id,
            vote_result=result,
            pre_vote=req.pre_vote,
            incarnation=self.member_state.incarnation,
        )

    # ---- leader heartbeats ---------------------------------------------------

    def _maintain_as_leader(self, now_ms: int) -> None:
        s, member_state = self.settings, self.member_state
        if s.check_quorum:
            # The last moment a majority (self included) had answered: the n-th most
            # recent answer, n = the other peers a quorum needs. Recording that moment,
            # not "now, while some answer is younger than a timeout", makes the leader
            # go one election timeout after it last heard a majority, not two.
            answered = sorted(
                (self.peer_heard_ms.get(p, -(10**15)) for p in member_state.other_ids), reverse=True
            )
            need = len(member_state.peer_ids) // 2
            quorum_heard_ms = answered[need - 1] if need else now_ms
            self.last_succ_heartbeat_ms = max(self.last_succ_heartbeat_ms, quorum_heard_ms)
            if now_ms - self.last_succ_heartbeat_ms > s.election_timeout_ms:
                self.host.log_event(
                    "check_quorum_step_down",
                    quorum_silent_ms=now_ms - self.last_succ_heartbeat_ms,
                    election_timeout_ms=s.election_timeout_ms,
                )
                self.change_role_to_candidate(member_state.curr_term, now_ms)
                return
        if (
            self.heartbeat_round is None
            and now_ms - self.last_send_heartbeat_ms > s.heartbeat_interval_ms
        ) or self.last_send_heartbeat_ms == -1:
            self._send_heartbeats(now_ms)

    def _send_heartbeats(self, now_ms: int) -> None:
        member_state, host = self.member_state, self.host
        self.last_send_heartbeat_ms = now_ms
        r = HeartbeatRound(
            term=member_state.curr_term,
            req_id=host.next_req_id(),
            deadline_ms=now_ms + self.settings.heartbeat_interval_ms,
        )
        self.heartbeat_round = r
        for peer in member_state.other_ids:
            host.send(
                HeartBeatRequest(
                    group=member_state.group,
                    local_id=member_state.self_id,
                    remote_id=peer,
                    term=r.term,
                    req_id=r.req_id,
                    leader_id=member_state.self_id,
                    cluster=member_state.config.cluster,
                    leader_addr=member_state.peers.get(member_state.self_id, ""),
                )
            )
        if len(member_state.peer_ids) == 1:
            self._finish_heartbeat_round(now_ms)

    def on_heartbeat_response(self, resp: HeartBeatResponse, now_ms: int) -> None:
        if not self._counts(resp.local_id, resp.incarnation):
            return  # not a voter's, or a lost data directory's: it is not heard from
        if resp.code is not DLedgerCode.NETWORK_ERROR:
            self.peer_heard_ms[resp.local_id] = now_ms
        r = self.heartbeat_round
        if r is None or resp.req_id != r.req_id or resp.local_id in r.answered:
            return
        r.count(resp.local_id, resp.code, resp.term)
        if r.complete(self.member_state.is_quorum, len(self.member_state.peer_ids)):
            self._finish_heartbeat_round(now_ms)

    def _finish_heartbeat_round(self, now_ms: int) -> None:
        """Result handling in the newer order (the fix of DLedger's bug)."""
        r, self.heartbeat_round = self.heartbeat_round, None
        assert r is not None
        member_state = self.member_state
        if member_state.role is not Role.LEADER or member_state.curr_term != r.term:
            return
        if r.max_term > r.term:
            self.change_role_to_candidate(r.max_term, now_ms)
            return
        if member_state.is_quorum(r.succ_num):
            self.last_succ_heartbeat_ms = now_ms
        elif member_state.is_quorum(r.succ_num + r.not_ready_num):
            self.last_send_heartbeat_ms = -1
        elif r.inconsistent_leader or (
            now_ms - self.last_succ_heartbeat_ms > self.settings.election_timeout_ms
        ):
            self.change_role_to_candidate(r.term, now_ms)

    # ---- follower side of heartbeats ----------------------------------------------------

    def on_heartbeat_request(self, req: HeartBeatRequest, now_ms: int) -> HeartBeatResponse:
        member_state = self.member_state
        code = self._heartbeat_code(req, now_ms)
        return HeartBeatResponse(
            group=member_state.group,
            local_id=member_state.self_id,
            remote_id=req.local_id,
            term=member_state.curr_term,
            req_id=req.req_id,
            code=code,
            incarnation=member_state.incarnation,
        )

    def _heartbeat_code(self, req: HeartBeatRequest, now_ms: int) -> DLedgerCode:
        member_state = self.member_state
        if req.leader_id not in member_state.known:
            return DLedgerCode.UNKNOWN_MEMBER
        if req.leader_id == member_state.self_id:
            return DLedgerCode.UNEXPECTED_MEMBER
        if req.term < member_state.curr_term:
            return DLedgerCode.EXPIRED_TERM
        if req.term == member_state.curr_term:
            if member_state.leader_id is None:
                self.change_role_to_follower(req.term, req.leader_id, now_ms)
                return DLedgerCode.SUCCESS
            if member_state.leader_id == req.leader_id:
                self.heard_leader(now_ms)
                return DLedgerCode.SUCCESS
            self.host.log_event(
                "inconsistent_leader",
                term=req.term,
                theirs=req.leader_id,
                ours=member_state.leader_id,
            )
            return DLedgerCode.INCONSISTENT_LEADER
        self.raise_term_now(req.term, now_ms)
        return DLedgerCode.TERM_NOT_READY

    def check_leader_request(self, term: int, leader_id: str, now_ms: int) -> DLedgerCode | None:
        """``handlePush``'s checks: a push (or a snapshot) is taken only from this term's
        leader. None: take it (this node is now its follower); else the refusal code."""
        member_state = self.member_state
        if term < member_state.curr_term:
            return DLedgerCode.EXPIRED_TERM
        if term > member_state.curr_term:
            self.raise_term_now(term, now_ms)
            return DLedgerCode.TERM_NOT_READY
        if member_state.role is Role.LEADER:
            self.host.log_event("two_leaders", term=term, other=leader_id)
            return DLedgerCode.INCONSISTENT_LEADER
        if member_state.leader_id is None:
            self.change_role_to_follower(term, leader_id, now_ms)
        elif member_state.leader_id != leader_id:
            return DLedgerCode.INCONSISTENT_LEADER
        self.heard_leader(now_ms)
        return None
