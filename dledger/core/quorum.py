"""``QuorumAckChecker``: which index a majority holds, and whether the leader may commit it
(DLedger's ``QuorumAckChecker``; the newer per-term watermarks).

``quorum_index`` is the rule itself, a pure function of the peers' match indexes: the
highest index that at least a majority of the configured peers (self included) hold.
``QuorumAckChecker`` keeps those match indexes ("watermarks") filed under the term of the
acknowledged entry and decides the commit; it touches neither the store nor the node, so
the node reads the store and does the commit.

Invariants:
- a watermark never moves back (a late or duplicated ack cannot lower it);
- only the current term's watermarks count, and only an index whose entry has the current
  term is committed (Raft §5.4.2, checked explicitly as well as by the per-term filing):
  an entry of an earlier term commits only under a current-term entry after it;
- the commit index never moves back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence


def quorum_index(match_index_by_peer: Mapping[str, int], peer_ids: Iterable[str]) -> int:
    """The highest index that a majority of ``peer_ids`` hold (-1: none).

    A peer missing from ``match_index_by_peer`` holds nothing (-1); entries for ids not
    in ``peer_ids`` do not count. With the indexes sorted high to low, the one at
    position ``n // 2`` is held by ``n // 2 + 1`` peers, a majority (DLedger's
    ``isQuorum``)."""
    marks = sorted((match_index_by_peer.get(p, -1) for p in peer_ids), reverse=True)
    if not marks:
        return -1
    return marks[len(marks) // 2]


class QuorumAckChecker:
    """Leader: the peers' watermarks per term, and the commit they allow."""

    def __init__(self, self_id: str, peer_ids: Sequence[str]) -> None:
        self.self_id = self_id
        self.peer_ids = tuple(peer_ids)
        self.peer_watermarks_by_term: dict[int, dict[str, int]] = {}

    def update_peer_watermark(self, term: int, peer_id: str, index: int) -> None:
        """``peer_id`` holds entries up to ``index``, the last of them of ``term``."""
        marks = self.peer_watermarks_by_term.setdefault(term, {})
        marks[peer_id] = max(marks.get(peer_id, -1), index)

    def watermark(self, peer_id: str, term: int) -> int:
        """The highest index ``peer_id`` acknowledged with an entry of ``term``."""
        return self.peer_watermarks_by_term.get(term, {}).get(peer_id, -1)

    def check(
        self, term: int, own_index: int, committed_index: int, term_at: Callable[[int], int]
    ) -> int | None:
        """The index the leader of ``term`` may commit now, or None.

        ``own_index``: what the leader itself holds (durably, in sync mode);
        ``term_at``: the term of a log entry. Older terms' watermarks are dropped: they
        can never count again (a leader's term does not come back)."""
        for old in [t for t in self.peer_watermarks_by_term if t != term]:
            del self.peer_watermarks_by_term[old]
        self.update_peer_watermark(term, self.self_id, own_index)
        index = quorum_index(self.peer_watermarks_by_term[term], self.peer_ids)
        if index <= committed_index:
            return None
        if term_at(index) != term:  # Raft §5.4.2, explicitly
            return None
        return index
