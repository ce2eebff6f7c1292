"""Membership changes through the log (``dledger.core.membership``; issue 33): learners,
promotion, removal, one change at a time, a configuration that is in force as soon as
it is appended, that leaves with its entry when the entry is truncated, that survives a
restart, and that a snapshot carries to a node that never saw the entry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.membership import (
    AddLearner,
    Configuration,
    Member,
    MembershipChange,
    Promote,
    Remove,
    changed_voters,
    check_change,
)
from dledger.core.messages import (
    PushEntryRequest,
    PushEntryResponse,
    Role,
    VoteRequest,
    VoteResponse,
)
from dledger.core.settings import CoreSettings
from dledger.store import MAGIC_CONFIG, FileStore, MemoryStore, TermVote
from dledger.store.configs import ConfigJournal
from dledger.store.entry import ConfigRecord
from dledger.store.meta import MetaFileError

from ..conftest import TINY
from .harness import Cluster

THREE = {"n0": "a:1", "n1": "a:2", "n2": "a:3"}


def _change(c: Cluster, change: MembershipChange) -> int:
    """Propose ``change`` at the leader, run until it commits there; its entry's index."""
    leader = c.wait_leader()
    # the leader's first entry (its NOOP) must be committed before a change is taken
    assert c.tick_until(lambda: _term_committed(c, leader), 3000) is not None
    p = c.run(leader, lambda core: core.change_membership(change, c.now_ms))
    assert c.tick_until(lambda: c.stores[leader].committed_index >= p.first_index, 5000) is not None
    return p.first_index


def _term_committed(c: Cluster, nid: str) -> bool:
    s = c.stores[nid]
    return s.committed_index >= 0 and s.term_at(s.committed_index) == c.term(nid)


# ---- the rule itself ---------------------------------------------------------------------


def test_a_configuration_round_trips_and_refuses_what_is_not_one() -> None:
    cfg = Configuration.of(THREE, {"n3": "a:4"})
    assert Configuration.decode(cfg.encode()) == cfg
    assert cfg.voters == ("n0", "n1", "n2") and cfg.learners == ("n3",)
    for bad in (b"", b"{}", b"[1]", b'{"version":2,"members":{}}', b"\xff", b'{"version":1}'):
        with pytest.raises(ValueError, match="not a configuration"):
            Configuration.decode(bad)
    with pytest.raises(ValueError, match="needs a voter"):
        Configuration.decode(b'{"version":1,"members":{"n0":{"addr":"a:1","voter":false}}}')


def test_every_change_moves_at_most_one_voter() -> None:
    cfg = Configuration.of(THREE)
    added = check_change(cfg, AddLearner("n3", "a:4"), "n0")
    assert added.learners == ("n3",) and changed_voters(cfg, added) == 0
    promoted = check_change(added, Promote("n3"), "n0")
    assert promoted.voters == ("n0", "n1", "n2", "n3") and changed_voters(added, promoted) == 1
    removed = check_change(promoted, Remove("n1"), "n0")
    assert removed.voters == ("n0", "n2", "n3") and changed_voters(promoted, removed) == 1
    refusals: list[tuple[MembershipChange, str]] = [
        (AddLearner("n1", "a:9"), "already a voter"),
        (AddLearner("n9", "a:2"), "another member's address"),
        (Promote("n9"), "not a member"),
        (Promote("n1"), "already votes"),
        (Remove("n9"), "not a member"),
        (Remove("n0"), "hand leadership to another voter first"),
    ]
    for change, why in refusals:
        with pytest.raises(DLedgerError, match=why):
            check_change(cfg, change, "n0")
    with pytest.raises(DLedgerError, match="needs a voter"):
        check_change(
            Configuration({"n0": Member("a:1"), "n1": Member("a:2", False)}), Remove("n0"), ""
        )


# ---- learners ------------------------------------------------------------------------------


def test_a_learner_receives_the_log_but_neither_votes_nor_counts_for_commit() -> None:
    c = Cluster(3, seed=1)
    leader = c.wait_leader()
    c.propose([b"before"])
    c.add_node("n3")
    index = _change(c, AddLearner("n3", "mem://n3"))
    assert c.cores[leader].member_state.config.learners == ("n3",)
    c.propose([b"after"])
    assert c.tick_until(lambda: c.stores["n3"].committed_index >= index + 1, 5000) is not None
    assert c.stores["n3"].get(index + 1).body == b"after"
    assert c.cores["n3"].member_state.config.learners == ("n3",)
    assert not c.cores["n3"].member_state.is_voter
    # With both other voters down, the leader and the learner are not a majority.
    for f in [i for i in ("n0", "n1", "n2") if i != leader]:
        c.stop(f)
    p = c.propose([b"no quorum"])
    c.tick(3000)
    assert c.stores[leader].committed_index < p.first_index
    assert c.stores["n3"].ledger_end_index >= p.first_index  # it did receive it
    # and the learner never campaigns, whatever it hears
    assert not c.sent_of(VoteRequest, local_id="n3")


def test_a_learners_vote_is_not_counted() -> None:
    c = Cluster(3, seed=2)
    c.wait_leader()
    c.add_node("n3")
    _change(c, AddLearner("n3", "mem://n3"))
    cand = c.wait_leader()
    core = c.cores[cand]
    # A forged grant from the learner in the candidate's round changes nothing.
    core.member_state.role = Role.CANDIDATE
    before = core.member_state.curr_term
    c.run(
        cand,
        lambda k: k.step(
            VoteResponse(
                group="g0",
                local_id="n3",
                remote_id=cand,
                term=before,
                req_id=1,
                vote_result=1,  # type: ignore[arg-type]
            ),
            c.now_ms,
        ),
        deliver=False,
    )
    assert core.elector.vote_round is None or "n3" not in core.elector.vote_round.answered


def test_a_learner_is_promoted_only_once_it_caught_up() -> None:
    c = Cluster(3, seed=3, settings=CoreSettings(max_learner_lag=5))
    leader = c.wait_leader()
    c.add_node("n3")
    c.isolate("n3")
    _change(c, AddLearner("n3", "mem://n3"))
    for i in range(10):
        c.propose([f"m{i}".encode()])
    with pytest.raises(DLedgerError) as e:
        c.cores[leader].change_membership(Promote("n3"), c.now_ms)
    assert e.value.code is DLedgerCode.FALL_BEHIND_TOO_MUCH
    c.heal()
    end = c.stores[leader].ledger_end_index
    assert c.tick_until(lambda: c.stores["n3"].ledger_end_index >= end, 5000) is not None
    _change(c, Promote("n3"))
    for nid in c.ids:
        assert c.cores[nid].member_state.config.voters == ("n0", "n1", "n2", "n3")
    # four voters: two down of four leaves no majority; one down leaves one
    others = [i for i in c.ids if i != leader]
    c.stop(others[0])
    p = c.propose([b"three of four"])
    assert c.tick_until(lambda: c.stores[leader].committed_index >= p.first_index, 5000) is not None
    c.stop(others[1])
    p = c.propose([b"two of four"])
    c.tick(3000)
    assert c.stores[leader].committed_index < p.first_index


# ---- removal -------------------------------------------------------------------------------


def test_a_removed_member_is_no_longer_replicated_to_nor_heard() -> None:
    c = Cluster(3, seed=4)
    leader = c.wait_leader()
    gone = next(i for i in c.ids if i != leader)
    _change(c, Remove(gone))
    core = c.cores[leader]
    assert gone not in core.dispatchers and gone not in core.member_state.peers
    assert core.member_state.peer_ids == tuple(sorted(set(c.ids) - {gone}))
    c.stop(gone)  # two voters now: both are needed, and both are here
    p = c.propose([b"two voters"])
    assert c.tick_until(lambda: c.stores[leader].committed_index >= p.first_index, 5000) is not None
    # a frame from the removed member is dropped, not answered
    c.down.discard(gone)
    since = len(c.sent)
    c.inject(
        VoteRequest(
            group="g0",
            local_id=gone,
            remote_id=leader,
            term=c.term(leader) + 1,
            req_id=1,
            leader_id=gone,
            ledger_end_index=10**6,
            ledger_end_term=c.term(leader) + 1,
        )
    )
    assert not c.sent_of(VoteResponse, since=since, remote_id=gone)
    assert c.role(leader) is Role.LEADER


def test_one_change_at_a_time_and_only_after_the_leaders_term_committed() -> None:
    c = Cluster(3, seed=5)
    leader = c.wait_leader()
    assert c.tick_until(lambda: _term_committed(c, leader), 3000) is not None
    others = [i for i in c.ids if i != leader]
    for f in others:
        c.stop(f)  # nothing commits from here
    core = c.cores[leader]
    c.add_node("n3")
    core.change_membership(AddLearner("n3", "mem://n3"), c.now_ms)
    with pytest.raises(DLedgerError) as e:
        core.change_membership(AddLearner("n4", "mem://n4"), c.now_ms)
    assert e.value.code is DLedgerCode.LEADER_PENDING_FULL
    with pytest.raises(DLedgerError) as e:
        c.cores[others[0]].change_membership(Remove(leader), c.now_ms)
    assert e.value.code is DLedgerCode.NOT_LEADER


def test_a_new_leader_changes_nothing_before_its_first_entry_commits() -> None:
    c = Cluster(3, seed=6)
    c.drop(lambda m: isinstance(m, PushEntryResponse))  # no entry of any term commits
    assert c.tick_until(lambda: c.leader() is not None) is not None
    leader = c.leader()
    assert leader is not None
    assert not _term_committed(c, leader)
    with pytest.raises(DLedgerError) as e:
        c.cores[leader].change_membership(AddLearner("n3", "mem://n3"), c.now_ms)
    assert e.value.code is DLedgerCode.LEADER_NOT_READY


# ---- the configuration in force ------------------------------------------------------------


def test_a_configuration_is_in_force_when_appended_and_leaves_with_its_entry() -> None:
    c = Cluster(3, seed=7)
    leader = c.wait_leader()
    assert c.tick_until(lambda: _term_committed(c, leader), 3000) is not None
    c.isolate(leader)
    c.add_node("n3")
    p = c.run(leader, lambda k: k.change_membership(AddLearner("n3", "mem://n3"), c.now_ms))
    assert c.cores[leader].member_state.config.learners == ("n3",)  # uncommitted, in force
    assert c.stores[leader].get_meta(p.first_index).magic == MAGIC_CONFIG
    # the others elect a leader of a higher term and write over the entry
    others = [i for i in c.ids if i not in (leader, "n3")]
    assert (
        c.tick_until(lambda: any(c.role(i) is Role.LEADER for i in others), 10_000, nodes=others)
        is not None
    )
    new = next(i for i in others if c.role(i) is Role.LEADER)
    c.propose([b"the new leader's"], new)
    c.heal()
    assert (
        c.tick_until(
            lambda: (
                c.stores[leader].ledger_end_index >= p.first_index
                and c.stores[leader].get_meta(p.first_index).magic != MAGIC_CONFIG
            ),
            10_000,
        )
        is not None
    )
    assert c.cores[leader].member_state.config.learners == ()  # gone with its entry
    assert "n3" not in c.cores[leader].dispatchers


def test_the_configuration_survives_a_restart_and_outranks_the_bootstrap_peers(
    tmp_path: Path,
) -> None:
    stores = {i: MemoryStore() for i in ("n0", "n1", "n2")}
    c = Cluster(3, seed=8, stores=stores)
    leader = c.wait_leader()
    gone = next(i for i in c.ids if i != leader)
    _change(c, Remove(gone))
    survivor = next(i for i in c.ids if i not in (leader, gone))
    c.stop(survivor)
    core = c.restart(survivor)  # bootstrap peers still name all three
    assert core.member_state.peer_ids == tuple(sorted(set(c.ids) - {gone}))
    assert core.status()["voters"] == list(core.member_state.peer_ids)
    # and a file store keeps it on disk
    s = FileStore(tmp_path / "f", TINY)
    s.bootstrap_config(Configuration.of(THREE).encode())
    s.append_as_leader(1, [Configuration.of({"n0": "a:1"}).encode()], MAGIC_CONFIG)
    s.close()
    s = FileStore(tmp_path / "f", TINY)
    s.bootstrap_config(Configuration.of(THREE).encode())  # ignored: it has one
    assert [r.index for r in s.config_records()] == [-1, 0]
    assert Configuration.decode(s.config_records()[-1].body).voters == ("n0",)
    s.close()


def test_a_snapshot_carries_the_configuration_to_a_node_that_never_saw_its_entry() -> None:
    stores = {i: MemoryStore() for i in ("n0", "n1", "n2")}
    c = Cluster(3, seed=9, stores=stores)
    leader = c.wait_leader()
    gone = next(i for i in c.ids if i != leader)
    index = _change(c, Remove(gone))
    c.propose([b"x"])
    last = c.stores[leader].committed_index
    live = [i for i in c.ids if i != gone]
    assert c.tick_until(lambda: all(c.stores[i].committed_index >= last for i in live)) is not None
    for nid in c.ids:
        if nid != gone:
            c.cores[nid].set_snapshot(last, b"state")
            c.stores[nid].delete_before(last + 1)
    c.add_node("n3")
    _change(c, AddLearner("n3", "mem://n3"))
    assert c.tick_until(lambda: bool(c.installed["n3"]), 5000) is not None
    snap = c.installed["n3"][0]
    assert snap.config is not None and snap.config.index == index
    assert (
        c.tick_until(lambda: c.cores["n3"].member_state.config.learners == ("n3",), 5000)
        is not None
    )
    assert gone not in c.cores["n3"].member_state.peers


# ---- the journal beside the log ------------------------------------------------------------


def test_the_journal_skips_records_the_log_disagrees_with(tmp_path: Path) -> None:
    j = ConfigJournal(tmp_path / "members")
    j.bootstrap(b"boot")
    j.add([ConfigRecord(3, 1, b"three"), ConfigRecord(5, 1, b"five")], floor_index=-1)
    terms = {3: 2, 5: 1}  # entry 3 was replaced by another term's
    assert [r.index for r in j.valid(9, 0, terms.__getitem__)] == [-1, 5]
    assert [r.index for r in j.valid(4, 0, terms.__getitem__)] == [-1]  # 5 past the end
    j.add([ConfigRecord(7, 2, b"seven")], floor_index=6)  # 5 is superseded: dropped
    assert [r.index for r in ConfigJournal(tmp_path / "members").records] == [5, 7]
    j.truncated(6)
    assert [r.index for r in ConfigJournal(tmp_path / "members").records] == [5]
    for bad in (b"{", b'{"a":1}', b"[[1,2]]", b'[[5,1,"a"],[3,1,"b"]]'):
        (tmp_path / "members").write_bytes(bad)
        with pytest.raises(MetaFileError):
            ConfigJournal(tmp_path / "members")


def test_a_follower_notes_a_configuration_entry_before_writing_it(tmp_path: Path) -> None:
    leader = MemoryStore()
    body = Configuration.of({"n0": "a:1"}).encode()
    leader.append_as_leader(1, [b"a", b"b"])
    leader.append_as_leader(1, [body], MAGIC_CONFIG)
    leader.append_as_leader(1, [b"c"])
    f = FileStore(tmp_path / "f", dataclasses.replace(TINY))
    f.append_as_follower(leader.read_entries(0, 1 << 20, 10))
    assert [(r.index, r.body) for r in f.config_records()] == [(2, body)]
    assert f.truncate(2) == 1 and f.config_records() == []
    f.close()


def test_pushes_from_a_non_member_are_dropped() -> None:
    c = Cluster(3, seed=10)
    leader = c.wait_leader()
    since = len(c.sent)
    c.inject(
        PushEntryRequest(
            group="g0",
            local_id="n9",
            remote_id=leader,
            term=c.term(leader) + 1,
            req_id=1,
            leader_id="n9",
            type=0,  # type: ignore[arg-type]
            commit_index=-1,
        )
    )
    assert len(c.sent) == since and c.role(leader) is Role.LEADER


# ---- identity: incarnations and the cluster id -------------------------------------------


def _sealed_cluster(seed: int) -> Cluster:
    """Three nodes whose stores each have their own incarnation, sealed by the leader."""
    stores = {f"n{i}": MemoryStore(incarnation=f"inc-{seed}-{i}") for i in range(3)}
    c = Cluster(3, seed=seed, settings=CoreSettings(seal_members=True), stores=stores)
    leader = c.wait_leader()

    def sealed_everywhere() -> bool:
        configs = [c.cores[i].member_state.config for i in c.ids]
        return all(
            cfg.cluster and all(m.incarnation for m in cfg.members.values()) for cfg in configs
        )

    assert c.tick_until(sealed_everywhere, 5000) is not None
    assert c.cores[leader].member_state.config.members["n1"].incarnation == f"inc-{seed}-1"
    return c


def test_a_lost_data_directory_back_under_its_id_is_not_the_member() -> None:
    """Issue 33's reproduction at the core: a follower's store is replaced by an empty
    one (another incarnation) under the same id; with the leader gone, the third node's
    campaign gets the empty node's vote, which does not count: no leader; the empty node,
    on the log, reads that it is not the member and never votes or campaigns."""
    c = _sealed_cluster(21)
    leader = c.wait_leader()
    p = c.propose([b"acknowledged"])
    assert c.tick_until(lambda: c.stores[leader].committed_index >= p.first_index) is not None
    lost, other = (i for i in c.ids if i != leader)
    c.stop(leader)
    c.stop(lost)
    c.stores[lost] = MemoryStore(incarnation="inc-new")  # the disk is gone
    c.restart(lost)
    c.tick(3000)
    assert c.leader() is None, "a leader elected with a lost directory's vote"
    assert c.events_of("stranger_incarnation", other)
    # The old leader comes back and leads; the empty node gets the log and learns.
    c.restart(leader)
    assert c.tick_until(lambda: c.leader() is not None, 10_000) is not None
    assert c.tick_until(lambda: bool(c.events_of("stale_identity", lost)), 10_000) is not None
    core = c.cores[lost]
    assert (
        core.member_state.stale_identity == "inc-21-" + lost[1:] and not core.member_state.is_voter
    )
    new = c.leader()
    assert new is not None and c.stores[new].get(p.first_index).body == b"acknowledged"


def test_frames_of_another_cluster_are_refused() -> None:
    a, b = _sealed_cluster(31), _sealed_cluster(32)
    la, lb = a.wait_leader(), b.wait_leader()
    ours = a.cores[la].member_state.config.cluster
    theirs = b.cores[lb].member_state.config.cluster
    assert ours and theirs and ours != theirs
    f = next(i for i in a.ids if i != la)
    term = a.term(f)
    since = len(a.sent)
    a.inject(
        PushEntryRequest(
            group="g0",
            local_id=la,
            remote_id=f,
            term=term + 5,
            req_id=1,
            leader_id=la,
            type=2,  # type: ignore[arg-type]
            commit_index=-1,
            cluster=theirs,
        )
    )
    assert a.term(f) == term and len(a.sent) == since  # not taken, not answered
    assert a.events_of("foreign_cluster", f)


def test_a_leader_behind_its_own_snapshot_commits_up_to_it() -> None:
    """A leader restarted with a commit index behind its application's snapshot (the
    checkpoint lagged) commits up to it when the snapshot is registered, for entries of
    earlier terms; one of its own term is never committed by such a claim."""
    c = Cluster(3, seed=41)
    leader = c.wait_leader()
    p = c.propose([b"a", b"b", b"c"])
    assert c.tick_until(lambda: c.stores[leader].committed_index >= p.last_index) is not None
    for f in (i for i in c.ids if i != leader):
        c.stop(f)  # nothing commits any more
    own = c.propose([b"of this term"], deliver=False)
    core, store = c.cores[leader], c.stores[leader]
    with pytest.raises(DLedgerError):
        core.set_snapshot(own.last_index, b"a claim")  # this term's: refused
    assert store.committed_index < own.last_index
    # A new leader of a later term, whose commit index is behind entries of term 1
    stores = {}
    for nid in ("n0", "n1", "n2"):
        stores[nid] = MemoryStore()
        stores[nid].append_as_leader(1, [b"x", b"y", b"z"])
        stores[nid].update_committed(0)
        stores[nid].save_term_vote(TermVote(5, None))
    d = Cluster(3, seed=42, stores=stores)
    d.drop(lambda m: isinstance(m, PushEntryResponse))  # it commits nothing by count
    assert d.tick_until(lambda: d.leader() is not None) is not None
    new = d.leader()
    assert new is not None and d.stores[new].committed_index == 0
    assert d.cores[new].set_snapshot(2, b"app state at 2").last_index == 2
    assert d.stores[new].committed_index == 2
