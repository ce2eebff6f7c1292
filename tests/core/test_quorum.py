"""``QuorumAckChecker`` (Raft §5.4.2): the quorum index as a pure function,
held against a brute-force oracle, and the commit rule built on it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.core.quorum import QuorumAckChecker, quorum_index

PEERS = ("n0", "n1", "n2", "n3", "n4")


def oracle(marks: dict[str, int], peer_ids: tuple[str, ...]) -> int:
    """The largest index that more than half of the peers hold, by trying every one."""
    held = [marks.get(p, -1) for p in peer_ids]
    majority = len(peer_ids) // 2 + 1
    candidates = [i for i in {-1, *held} if sum(h >= i for h in held) >= majority]
    return max(candidates)


group_sizes = st.integers(min_value=1, max_value=len(PEERS))


@settings(max_examples=300, deadline=None)
@given(
    n=group_sizes,
    marks=st.dictionaries(
        st.sampled_from((*PEERS, "stranger")), st.integers(min_value=-1, max_value=50)
    ),
)
def test_quorum_index_is_the_highest_index_a_majority_holds(n: int, marks: dict[str, int]) -> None:
    peer_ids = PEERS[:n]
    assert quorum_index(marks, peer_ids) == oracle(marks, peer_ids)


def test_quorum_index_examples() -> None:
    assert quorum_index({"n0": 5, "n1": 3, "n2": -1}, PEERS[:3]) == 3
    assert quorum_index({"n0": 5}, PEERS[:3]) == -1  # a silent majority holds nothing
    assert quorum_index({"n0": 9, "n1": 9, "n2": 1, "n3": 1}, PEERS[:4]) == 1  # 4: needs 3
    assert quorum_index({}, ()) == -1


@settings(max_examples=200, deadline=None)
@given(
    acks=st.lists(
        st.tuples(
            st.sampled_from(PEERS[1:3]),
            st.integers(min_value=1, max_value=4),  # the acked entry's term
            st.integers(min_value=0, max_value=30),
        ),
        max_size=30,
    ),
    term=st.integers(min_value=1, max_value=4),
    own=st.integers(min_value=0, max_value=30),
)
def test_check_commits_only_a_current_term_entry_a_majority_acked(
    acks: list[tuple[str, int, int]], term: int, own: int
) -> None:
    """Whatever the acks, the checker never commits an entry of an earlier term, never
    counts an ack filed under another term, and never moves the commit back."""
    checker = QuorumAckChecker("n0", PEERS[:3])
    entry_terms = [min(term, 1 + i // 8) for i in range(31)]  # terms rise along the log
    for peer, t, index in acks:
        checker.update_peer_watermark(t, peer, index)
    current: dict[str, int] = {}
    for peer, t, index in acks:
        if t == term:
            current[peer] = max(current.get(peer, -1), index)
    got = checker.check(term, own, 2, entry_terms.__getitem__)
    want = oracle({**current, "n0": own}, PEERS[:3])
    if want <= 2 or entry_terms[want] != term:
        assert got is None
    else:
        assert got == want


def test_watermarks_never_move_back_and_old_terms_are_dropped() -> None:
    checker = QuorumAckChecker("n0", PEERS[:3])
    checker.update_peer_watermark(2, "n1", 7)
    checker.update_peer_watermark(2, "n1", 4)  # a late, duplicated ack
    assert checker.watermark("n1", 2) == 7
    checker.update_peer_watermark(1, "n2", 9)
    assert checker.check(2, 7, -1, lambda i: 2) == 7  # n0 and n1 hold 7 in term 2
    assert checker.watermark("n2", 1) == -1  # term 1 can never count again
    assert checker.check(2, 7, 7, lambda i: 2) is None  # nothing new to commit
