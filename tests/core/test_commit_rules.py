"""Raft §5.4.2: a leader commits only entries of its own term by counting
replicas; the NOOP (magic 2) it appends on election commits earlier entries at once."""

from __future__ import annotations

from collections.abc import Callable

from dledger.core.messages import PushEntryRequest, PushEntryResponse, PushType, RaftMessage, Role
from dledger.core.settings import CoreSettings
from dledger.store import MAGIC_NOOP

from .harness import Cluster


def acks_from(frm: str, to: str) -> Callable[[RaftMessage], bool]:
    def match(m: RaftMessage) -> bool:
        return isinstance(m, PushEntryResponse) and (m.local_id, m.remote_id) == (frm, to)

    return match


def test_raft_5_4_2_an_old_term_entry_on_a_majority_waits_for_the_new_terms_noop() -> None:
    c = Cluster(3, seed=5, settings=CoreSettings(max_push_entries=1))
    old = c.wait_leader()
    a, b = (i for i in c.ids if i != old)
    # X reaches the old leader and a only, and nobody learns that a has it
    c.cut(old, b)
    c.drop(acks_from(a, old))
    x = c.propose([b"X"]).first_index
    assert c.stores[a].ledger_end_index == x
    assert c.stores[old].committed_index < x
    # the old leader is gone; a, which has X, wins the next term; its NOOP (x + 1)
    # does not reach b, X does
    c.heal()
    c.isolate(old)
    noop_to_b = c.drop(
        lambda m: (
            isinstance(m, PushEntryRequest)
            and m.remote_id == b
            and m.type is PushType.APPEND
            and m.first_index == x + 1
        )
    )
    assert c.tick_until(lambda: c.stores[b].ledger_end_index == x, 5000) is not None
    assert c.leader() == a
    term = c.term(a)
    assert c.stores[a].term_at(x) < term and c.stores[a].term_at(x + 1) == term
    # X is on a majority (a, b) but of an earlier term: counting replicas must not commit it
    c.tick(500)
    assert c.stores[a].committed_index < x
    assert c.cores[a].dispatchers[b].match_index == x
    # the NOOP gets through (resent after push_timeout_ms): X commits with it, in one step
    c.undrop(noop_to_b)
    assert c.tick_until(lambda: c.stores[a].committed_index == x + 1, 2000) is not None
    assert x not in c.commits[a]
    assert c.commits[a][-1] == x + 1
    noop = c.stores[a].get(x + 1)
    assert (noop.magic, noop.term, noop.body) == (MAGIC_NOOP, term, b"")


def test_raft_5_4_2_a_new_leaders_noop_commits_earlier_entries_without_a_client_write() -> None:
    c = Cluster(3, seed=6)
    old = c.wait_leader()
    # X reaches everyone, but no ack gets back: the old leader never commits it
    c.drop(lambda m: isinstance(m, PushEntryResponse) and m.remote_id == old)
    p = c.propose([b"X1", b"X2"])
    assert all(s.ledger_end_index == p.last_index for s in c.stores.values())
    c.heal()
    c.isolate(old)
    assert c.tick_until(lambda: c.leader() not in (None, old), 3000) is not None
    new = c.leader()
    assert new is not None
    first_noop = c.stores[new].ledger_end_index
    assert first_noop == p.last_index + 1
    assert c.stores[new].get(first_noop).magic == MAGIC_NOOP
    assert c.tick_until(lambda: c.stores[new].committed_index == first_noop, 1000) is not None
    assert c.stores[new].get(p.first_index).body == b"X1"  # committed, never proposed to new
    # the old leader could only say "unknown" (TERM_CHANGED); the entries did commit
    assert c.tick_until(lambda: c.role(old) is not Role.LEADER, 2000) is not None
    assert [d.code.name for _, d in c.done[old]] == ["TERM_CHANGED"]
