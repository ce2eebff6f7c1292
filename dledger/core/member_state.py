"""``MemberState``: who this node is, its role, term and vote.

Invariants:
- ``curr_term`` never decreases; ``curr_vote_for`` belongs to ``curr_term`` and is cleared
  when the term moves (``next_term``).
- Any change of term or vote sets ``hard_state_dirty``: the node loop makes the pair
  durable before it sends a single message (docs/architecture.md).
- The ledger end index and term are read from the store every time, never cached, so a
  truncate can not leave them stale for votes (DLedger's bug).
- A higher term never makes a node FOLLOWER directly: it becomes CANDIDATE first and
  adopts the term in its candidate loop; ``known_max_term`` carries it there.
- ``config`` is the newest configuration of the log (``membership``); ``peers`` are all
  its members (voters and learners), ``peer_ids`` its voters, self included when it
  votes, ``other_ids`` the other voters and ``replica_ids`` every other member (what a
  leader replicates to). A node that is not a voter never campaigns. ``known``: every
  member of any configuration the log holds; a leader among them that the newest
  configuration leaves out is still followed (its entries may replace that one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .membership import Configuration, same_member
from .messages import Role

if TYPE_CHECKING:
    from ..store.base import LogStore
    from ..store.meta import TermVote


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before replies leave: ``currterm`` in DLedger."""

    term: int
    voted_for: str | None


class MemberState:
    def __init__(
        self,
        group: str,
        self_id: str,
        config: Configuration,
        store: LogStore,
        hard_state: HardState | TermVote,
    ) -> None:
        self.group = group
        self.self_id = self_id
        self.known: dict[str, str] = dict(config.addresses)  # the core keeps it (node)
        self.incarnation = store.incarnation
        # the configuration names this id with another incarnation: this data directory
        # is not the member's (lost, replaced); it never votes nor campaigns
        self.stale_identity: str | None = None
        self.heard_incarnations: dict[str, str] = {}  # what peers' answers said
        # peers whose last answer came from another incarnation than their member's
        self.stale_peers: set[str] = set()
        self.config_index = -1  # the configuration's entry (-1: the bootstrap one)
        self.set_config(config)
        self.store = store
        self.role = Role.CANDIDATE  # a node starts as CANDIDATE
        self.curr_term = hard_state.term
        self.curr_vote_for = hard_state.voted_for
        self.leader_id: str | None = None
        self.known_max_term = hard_state.term
        self.transferee: str | None = None  # leader side: leadership is being handed over
        self.term_to_take_leadership = -1  # transferee side
        self.hard_state_dirty = False

    def set_config(self, config: Configuration) -> None:
        self.config = config
        self.peers = config.addresses  # id -> address, sorted: deterministic
        self.peer_ids = config.voters
        self.other_ids = tuple(p for p in self.peer_ids if p != self.self_id)
        self.replica_ids = tuple(p for p in self.peers if p != self.self_id)
        # what a removed member's answers said is forgotten: added back, it may be
        # another data directory
        for gone in [p for p in self.heard_incarnations if p not in config.members]:
            del self.heard_incarnations[gone]
        self.stale_peers &= set(config.members)
        me = config.members.get(self.self_id)
        self.stale_identity = (
            me.incarnation
            if me is not None and me.incarnation and me.incarnation != self.incarnation
            else None
        )
        self.is_voter = config.is_voter(self.self_id) and self.stale_identity is None

    # ---- derived -----------------------------------------------------------------------

    @property
    def ledger_end_index(self) -> int:
        return self.store.ledger_end_index

    @property
    def ledger_end_term(self) -> int:
        return self.store.ledger_end_term

    @property
    def committed_index(self) -> int:
        return self.store.committed_index

    def answered_as_member(self, node_id: str, incarnation: str) -> bool:
        """Does an answer from ``node_id`` count as its member's (``membership
        .same_member``)? Remembers the incarnation it gave, for the leader to seal."""
        if not same_member(self.config, node_id, incarnation):
            self.stale_peers.add(node_id)
            return False
        self.stale_peers.discard(node_id)
        if incarnation:
            self.heard_incarnations[node_id] = incarnation
        return True

    def is_quorum(self, n: int) -> bool:
        """More than half of the configuration's voters."""
        return n >= len(self.peer_ids) // 2 + 1

    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def is_taking_leadership(self) -> bool:
        return self.term_to_take_leadership != -1

    def hard_state(self) -> HardState:
        return HardState(self.curr_term, self.curr_vote_for)

    # ---- transitions (callers hold the node's single-threaded step) --------------------

    def next_term(self) -> int:
        """Adopt the highest term heard of, else move one past ours; clears the vote."""
        self.curr_term = max(self.known_max_term, self.curr_term + 1)
        self.known_max_term = self.curr_term
        self.curr_vote_for = None
        self.hard_state_dirty = True
        return self.curr_term

    def set_vote(self, candidate: str) -> None:
        self.curr_vote_for = candidate
        self.hard_state_dirty = True

    def change_to_leader(self, term: int) -> None:
        assert term == self.curr_term, f"leader for term {term} at term {self.curr_term}"
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self.term_to_take_leadership = -1

    def change_to_follower(self, term: int, leader_id: str) -> None:
        assert term == self.curr_term, f"follower for term {term} at term {self.curr_term}"
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.transferee = None
        self.term_to_take_leadership = -1

    def change_to_candidate(self, term: int) -> None:
        """Role CANDIDATE; ``curr_term`` is untouched, ``known_max_term`` remembers
        ``term`` for the candidate loop to adopt."""
        self.known_max_term = max(self.known_max_term, term)
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.transferee = None
