"""INSTALL_SNAPSHOT (Raft §7): a follower
whose next needed entry is below the leader's log head gets the application's snapshot
and restarts its log right after it, at the leader's byte position."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.dispatcher import DispatcherState
from dledger.core.messages import (
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RaftMessage,
    Role,
)
from dledger.core.node import Ready
from dledger.core.settings import CoreSettings
from dledger.core.snapshot import Snapshot, snapshot_of
from dledger.runtime.ready import deliver_ready, persist_ready
from dledger.store import MemoryStore, StoreSettings, TermVote, place_entry

from .harness import GROUP, Cluster, heartbeat, make_store, push

SNAP = b"app-state"


def installs(c: Cluster, to: str, since: int = 0) -> list[InstallSnapshotRequest]:
    return c.sent_of(InstallSnapshotRequest, since=since, remote_id=to)


def install_req(
    frm: str,
    to: str,
    term: int,
    last: int,
    last_term: int,
    *,
    next_pos: int = 0,
    chain: int = 0,
    data: bytes = SNAP,
    req_id: int = 1,
    offset: int = 0,
    total: int | None = None,
) -> InstallSnapshotRequest:
    return InstallSnapshotRequest(
        group=GROUP,
        local_id=frm,
        remote_id=to,
        term=term,
        req_id=req_id,
        leader_id=frm,
        last_included_index=last,
        last_included_term=last_term,
        before_begin_chain=chain,
        next_pos=next_pos,
        commit_index=last,
        offset=offset,
        total=len(data) if total is None else total,
        data=data,
    )


def same_entries(a: MemoryStore, b: MemoryStore, lo: int) -> bool:
    if a.ledger_end_index != b.ledger_end_index:
        return False
    return all(a.get(i) == b.get(i) for i in range(lo, a.ledger_end_index + 1))


def with_follower_behind_head(
    follower_end: int,
    *,
    entries: int = 30,
    head: int = 20,
    snapshot_at: int | None = 19,
    settings: CoreSettings | None = None,
) -> tuple[Cluster, str]:
    """n0 and n1 hold ``entries`` committed entries of term 1 and have deleted those below
    ``head``; n2 holds the first ``follower_end + 1`` of them. A leader is elected while
    n2 is cut off, its application registers a snapshot at ``snapshot_at``, links heal."""
    stores = {n: make_store((1,) * entries, term=1, committed=entries - 1) for n in ("n0", "n1")}
    for s in stores.values():
        s.delete_before(head)
    stores["n2"] = make_store((1,) * (follower_end + 1), term=1, committed=follower_end)
    c = Cluster(3, seed=4, settings=settings, stores=stores)
    c.isolate("n2")
    lead = c.wait_leader()
    if snapshot_at is not None:
        c.cores[lead].set_snapshot(snapshot_at, SNAP)
    c.heal()
    return c, lead


# ---- the leader enters INSTALL_SNAPSHOT exactly when the peer needs a deleted entry ------


@pytest.mark.parametrize(
    ("follower_end", "snapshots"),
    [(5, 1), (17, 1), (18, 1), (19, 0), (22, 0)],
)
def test_rp13_compare_enters_install_snapshot_iff_compare_index_is_below_the_before_begin(
    follower_end: int, snapshots: int
) -> None:
    """``compareIndex < ledgerBeforeBeginIndex`` (19 here) → INSTALL_SNAPSHOT; at 19 the
    leader compares with its before-begin term instead and needs no snapshot."""
    c, lead = with_follower_behind_head(follower_end)
    assert c.tick_until(lambda: same_entries(c.stores[lead], c.stores["n2"], 20), 5000) is not None
    assert len(installs(c, "n2")) == snapshots
    assert len(c.installed["n2"]) == snapshots
    needs = c.events_of("needs_snapshot", lead)
    assert [e["peer"] for e in needs] == ["n2"] * snapshots
    begin = c.stores["n2"].ledger_begin_index
    assert begin == (20 if snapshots else 0)
    for e in needs:
        assert e["state"] == "COMPARE" and e["index"] < e["ledger_begin_index"] - 1


def follower_down_while_head_is_deleted(
    *, snapshot: bool = True, settings: CoreSettings | None = None, stores: dict | None = None
) -> tuple[Cluster, str, str, int]:
    """A settled group; follower f is down while the leader commits 30 entries, its
    application registers a snapshot at the committed index, and the head is deleted up
    to it on both live nodes. Returns (cluster, leader, f, snapshot index)."""
    c = Cluster(3, seed=5, settings=settings, stores=stores)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    c.propose([b"before"])  # f holds this one
    c.stop(f)
    for k in range(30):
        c.propose([f"b{k}".encode() * 10])
    c.tick(100)  # the other follower learns the commit index
    last = c.stores[lead].committed_index
    assert last == c.stores[lead].ledger_end_index
    for n in c.ids:
        if n != f:  # each live node's application snapshots, and its retention runs
            assert c.stores[n].committed_index == last
            if snapshot:
                c.cores[n].set_snapshot(last, SNAP)
            c.stores[n].delete_before(last + 1)
            assert c.stores[n].ledger_begin_index == last + 1
    return c, lead, f, last


def test_rp13_append_enters_install_snapshot_when_write_index_is_at_or_below_before_begin() -> None:
    c, lead, f, last = follower_down_while_head_is_deleted()
    c.restart(f)
    assert c.tick_until(lambda: c.stores[f].ledger_begin_index == last + 1, 5000) is not None
    needs = c.events_of("needs_snapshot", lead)
    assert needs and needs[0]["state"] == "APPEND" and needs[0]["index"] < last
    c.propose([b"after"])
    assert same_entries(c.stores[lead], c.stores[f], last + 1)


class RacyStore(MemoryStore):
    """Retention deletes the head between the dispatcher's check and its read (the file
    store's thread can do that): the first read below ``delete_below`` deletes first."""

    delete_below: int | None = None

    def read_batch(
        self, from_index: int, max_bytes: int, max_entries: int
    ) -> tuple[bytes, int, int]:
        if self.delete_below is not None and from_index < self.delete_below:
            self.delete_before(self.delete_below)
            self.delete_below = None
        return super().read_batch(from_index, max_bytes, max_entries)


def test_rp13_append_enters_install_snapshot_when_the_entry_is_missing_locally() -> None:
    stores = {n: RacyStore() for n in ("n0", "n1", "n2")}
    c = Cluster(3, seed=5, stores=dict(stores))
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    c.isolate(f)
    for k in range(10):
        c.propose([f"b{k}".encode()])
    last = c.stores[lead].committed_index
    c.cores[lead].set_snapshot(last, SNAP)
    stores[lead].delete_below = last + 1
    c.tick(1500)  # the go-back-N resend reads the deleted entries
    needs = c.events_of("needs_snapshot", lead)
    assert needs and needs[0]["state"] == "APPEND"
    assert needs[0]["ledger_begin_index"] == last + 1  # the check passed, the read did not
    assert not c.events_of("dispatcher_error", lead)
    c.heal()
    assert c.tick_until(lambda: c.stores[f].ledger_begin_index == last + 1, 8000) is not None


# ---- the follower ------------------------------------------------------------------------


def test_raft7_follower_restarts_its_log_after_the_snapshot_at_the_leaders_pos() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 2), term=2, committed=1)})
    (resp,) = c.inject(install_req("n1", "n0", 2, 40, 2, next_pos=9000, chain=0xABCD))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert (resp.last_included_index, resp.begin_index, resp.end_index) == (40, 41, 40)
    assert c.installed["n0"] == [Snapshot(40, 2, 0xABCD, 9000, SNAP)]
    s = c.stores["n0"]
    assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index) == (41, 40, 40)
    assert (s.ledger_end_term, s.ledger_end_chain, s.ledger_end_pos) == (2, 0xABCD, 9000)
    assert c.cores["n0"].member_state.leader_id == "n1" and c.role("n0") is Role.FOLLOWER
    assert c.cores["n0"].snapshot == Snapshot(40, 2, 0xABCD, 9000, SNAP)  # can serve it on
    assert c.commits["n0"][-1] == 40
    # the answer left after the application had the data
    (sent_before,) = c.sent_at_install["n0"]
    assert c.sent[sent_before][1] is resp


def test_raft7_the_ready_contract_installs_then_resets_then_sends() -> None:
    """The order production runs (``dledger.runtime.ready``): the application, then the
    log, then the answer."""
    log: list[str] = []

    class Recording(MemoryStore):
        def reset(
            self, begin: int, pos: int, term: int, chain: int = 0, config: Any = None
        ) -> None:  # the log restarts
            log.append(f"reset {begin}@{pos}")
            super().reset(begin, pos, term, chain, config)

    store = Recording()
    store.save_term_vote(TermVote(2, None))
    c = Cluster(3, stores={"n0": store})
    core = c.cores["n0"]
    core.step(install_req("n1", "n0", 2, 7, 2, next_pos=512), c.now_ms)
    ready = core.ready()

    def send(msgs: Iterable[RaftMessage]) -> None:
        log.extend(f"send {type(m).__name__} {getattr(m, 'code', '')!r}" for m in msgs)

    def install(snap: Snapshot) -> None:
        assert store.ledger_begin_index == 0  # the log is replaced only after this
        log.append(f"install {snap.last_index} {snap.data!r}")

    synced = persist_ready(store, ready, sync_log=True, install=install)
    deliver_ready(core, ready, synced, send=send, on_ready=lambda r: None)
    assert log == [
        "install 7 b'app-state'",
        "reset 8@512",
        "send InstallSnapshotResponse <DLedgerCode.SUCCESS: 200>",
    ]
    assert core.installing is None and core.snapshot_stats["installed"] == 1


def test_raft7_follower_that_holds_the_last_included_entry_keeps_its_log() -> None:
    c = Cluster(3, stores={"n0": make_store((1,) * 10, term=1, committed=3)})
    (resp,) = c.inject(install_req("n1", "n0", 1, 5, 1))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert c.installed["n0"] == []
    s = c.stores["n0"]
    assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index) == (0, 9, 5)


def test_raft7_follower_whose_log_begins_after_the_snapshot_changes_nothing() -> None:
    s = MemoryStore()
    s.reset(50, 8192, 3, 7)
    s.save_term_vote(TermVote(3, None))
    c = Cluster(3, stores={"n0": s})
    (resp,) = c.inject(install_req("n1", "n0", 3, 10, 1))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert c.installed["n0"] == [] and s.ledger_begin_index == 50


def test_raft7_a_different_term_at_the_last_included_index_installs() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 1, 1), term=3, committed=1)})
    (resp,) = c.inject(install_req("n1", "n0", 3, 2, 2, next_pos=300))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert [x.last_index for x in c.installed["n0"]] == [2]
    assert (c.stores["n0"].ledger_begin_index, c.stores["n0"].ledger_end_term) == (3, 2)


def test_raft7_install_with_a_stale_term_is_refused_like_an_append() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1), term=5, committed=0)})
    (resp,) = c.inject(install_req("n1", "n0", 4, 30, 4))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.EXPIRED_TERM
    assert resp.term == 5
    assert c.installed["n0"] == [] and c.stores["n0"].ledger_end_index == 1


def test_raft7_install_with_a_higher_term_is_taken_only_once_the_term_is_durable() -> None:
    """Like a push: TERM_NOT_READY, the term is adopted (and persisted) at the next
    tick, the leader's resend is then installed."""
    c = Cluster(3, stores={"n0": make_store((1, 1), term=1, committed=0)})
    (resp,) = c.inject(install_req("n1", "n0", 4, 30, 4))
    assert isinstance(resp, InstallSnapshotResponse)
    assert resp.code is DLedgerCode.TERM_NOT_READY and c.installed["n0"] == []
    c.tick(nodes=["n0"])
    assert c.stores["n0"].load_term_vote().term == 4
    (resp,) = c.inject(install_req("n1", "n0", 4, 30, 4, req_id=2))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert [x.last_index for x in c.installed["n0"]] == [30]


def test_raft7_term_and_vote_are_durable_before_any_install_answer_cv23() -> None:
    """Across a run where the follower comes back into a later term: every
    InstallSnapshotResponse leaves in a Ready whose term is durable by then."""
    c, lead, f, last = follower_down_while_head_is_deleted()
    c.isolate(lead)
    c.tick(2000)  # the other node cannot win alone; the old leader steps down
    c.heal()
    c.restart(f)
    assert c.tick_until(lambda: c.stores[f].ledger_begin_index == last + 1, 10_000) is not None
    durable: dict[str, int] = {}
    answered = 0
    for nid, ready in c.readies:
        if ready.hard_state is not None:
            durable[nid] = ready.hard_state.term
        for m in ready.messages:
            if isinstance(m, InstallSnapshotResponse):
                stored = durable.get(nid, c.stores[nid].load_term_vote().term)
                assert m.term <= stored
                answered += m.code is DLedgerCode.SUCCESS
    assert answered >= 1


def test_raft7_stale_install_after_newer_pushes_changes_nothing() -> None:
    """A delayed duplicate of an install that was already applied (its entry is now the
    before-begin one, same term) is answered SUCCESS without a second install."""
    c = Cluster(3, stores={"n0": make_store(term=2)})
    c.inject(install_req("n1", "n0", 2, 9, 2, next_pos=4096, req_id=5))
    (resp,) = c.inject(install_req("n1", "n0", 2, 9, 2, next_pos=4096, req_id=5))
    assert isinstance(resp, InstallSnapshotResponse) and resp.code is DLedgerCode.SUCCESS
    assert len(c.installed["n0"]) == 1


def test_raft7_a_snapshot_contradicting_a_committed_entry_is_refused() -> None:
    """§5.4: committed entries match on every replica, so a correct leader never sends
    this; the follower refuses rather than drop committed entries."""
    c = Cluster(3, stores={"n0": make_store((1, 1, 1, 1), term=3, committed=3)})
    (resp,) = c.inject(install_req("n1", "n0", 3, 2, 2))
    assert isinstance(resp, InstallSnapshotResponse)
    assert resp.code is DLedgerCode.INCONSISTENT_STATE and c.installed["n0"] == []
    assert c.events_of("install_refused", "n0") == [{"index": 2, "committed": 3}]
    d = c.cores["n0"].divergence
    assert d is not None and d["index"] == 2 and "snapshot" in d["why"]


def test_raft7_garbage_install_arguments_are_refused() -> None:
    c = Cluster(3, stores={"n0": make_store(term=2)})
    (resp,) = c.inject(install_req("n1", "n0", 2, 9, 2, next_pos=-1))
    assert isinstance(resp, InstallSnapshotResponse)
    assert resp.code is DLedgerCode.UNEXPECTED_ARGUMENT and c.installed["n0"] == []


def test_jr21_while_installing_pushes_are_refused_and_no_election_starts() -> None:
    """The runtime persists a Ready in a thread while the loop steps on: between handing
    the snapshot out and ``on_snapshot_installed`` the old log must not be touched."""
    store = make_store((1,), term=2)
    c = Cluster(3, stores={"n0": store})
    core = c.cores["n0"]
    core.step(install_req("n1", "n0", 2, 9, 2, next_pos=4096), 0)
    ready = core.ready()
    assert ready.install_snapshot is not None and core.installing is ready.install_snapshot
    core.step(push("n1", "n0", 2, PushType.COMPARE, req_id=2, pre_log_index=0), 10)
    (refused,) = core.ready().messages
    assert isinstance(refused, PushEntryResponse)
    assert refused.code is DLedgerCode.NEWER_INSTALL_SNAPSHOT_REQUEST_EXIST
    for t in range(20, 3000, 10):  # five election timeouts: no vote request
        core.tick(t)
    assert core.member_state.role is Role.FOLLOWER and not core.ready().messages
    # a resend of the same snapshot meanwhile is answered, not installed twice
    core.step(install_req("n1", "n0", 2, 9, 2, next_pos=4096, req_id=3), 3000)
    r = core.ready()
    assert r.install_snapshot is None
    (ok,) = r.messages
    assert isinstance(ok, InstallSnapshotResponse) and ok.code is DLedgerCode.SUCCESS
    synced = persist_ready(store, ready, sync_log=True)
    deliver_ready(core, ready, synced, send=lambda ms: None, on_ready=lambda r: None)
    assert core.installing is None and store.ledger_begin_index == 10
    core.step(heartbeat("n1", "n0", 2), 3010)
    core.step(
        push("n1", "n0", 2, PushType.COMPARE, req_id=4, pre_log_index=9, pre_log_term=2), 3010
    )
    answers = [m for m in core.ready().messages if isinstance(m, PushEntryResponse)]
    assert answers[-1].code is DLedgerCode.SUCCESS


# ---- the leader: sending, waiting, resending, and the way out ---------------------------


def test_raft7_success_moves_the_match_index_and_resumes_append() -> None:
    c, lead, f, last = follower_down_while_head_is_deleted()
    c.restart(f)
    assert c.tick_until(lambda: bool(c.installed[f]), 5000) is not None
    d = c.cores[lead].dispatchers[f]
    assert (d.state, d.match_index, d.write_index) == (DispatcherState.APPEND, last, last + 1)
    assert c.cores[lead].checker.watermark(f, c.term(lead)) == last
    since = len(c.sent)
    c.propose([b"more"])
    (append,) = c.sent_of(PushEntryRequest, since=since, remote_id=f, type=PushType.APPEND)
    assert (append.first_index, append.count) == (last + 1, 1)
    assert same_entries(c.stores[lead], c.stores[f], last + 1)
    assert d.match_index == last + 1
    st = c.cores[lead].status()
    assert st["snapshots_sent"] == 1 and st["peers"][f]["snapshots_sent"] == 1
    assert st["peers"][f]["state"] == "APPEND"
    assert c.cores[f].status()["snapshots_installed"] == 1


def test_rp42_no_snapshot_means_the_peer_waits_logged_once() -> None:
    c, lead, f, last = follower_down_while_head_is_deleted(snapshot=False)
    c.restart(f)
    c.tick(3000)
    d = c.cores[lead].dispatchers[f]
    assert d.state is DispatcherState.INSTALL_SNAPSHOT
    assert c.cores[lead].status()["peers"][f]["state"] == "INSTALL_SNAPSHOT"
    assert installs(c, f) == []
    (waiting,) = c.events_of("snapshot_unavailable", lead)
    assert waiting["reason"] == "no snapshot registered"
    c.cores[lead].set_snapshot(last, SNAP)
    assert c.tick_until(lambda: c.stores[f].ledger_begin_index == last + 1, 3000) is not None


def test_rp42_a_snapshot_older_than_the_log_head_is_not_sent() -> None:
    c, lead, _, last = follower_down_while_head_is_deleted(snapshot=False)
    with pytest.raises(DLedgerError) as err:
        c.cores[lead].set_snapshot(last - 5, SNAP)  # its entry is gone: term unknown
    assert err.value.code is DLedgerCode.UNEXPECTED_ARGUMENT
    # a snapshot registered before the head moved past it
    c2, lead2, f2, last2 = follower_down_while_head_is_deleted(snapshot=False)
    core = c2.cores[lead2]
    core.snapshot = snapshot_of(make_store((1,) * 5, committed=4), 4, SNAP)
    c2.restart(f2)
    c2.tick(2000)
    (waiting,) = c2.events_of("snapshot_unavailable", lead2)
    assert waiting["reason"] == "snapshot older than the log head"
    assert installs(c2, f2) == []
    core.set_snapshot(last2, SNAP)
    assert c2.tick_until(lambda: c2.stores[f2].ledger_begin_index == last2 + 1, 3000) is not None


def test_rp42_a_snapshot_over_max_snapshot_bytes_is_not_sent() -> None:
    settings = CoreSettings(max_snapshot_bytes=4)
    c, lead, f, _ = follower_down_while_head_is_deleted(settings=settings)
    c.restart(f)
    c.tick(2000)
    (waiting,) = c.events_of("snapshot_unavailable", lead)
    assert waiting["reason"] == "snapshot over max_snapshot_bytes"
    assert waiting["snapshot_bytes"] == len(SNAP) and installs(c, f) == []


def test_rp42_one_install_in_flight_resent_after_the_snapshot_timeout() -> None:
    settings = CoreSettings(snapshot_timeout_ms=500)
    c, _, f, last = follower_down_while_head_is_deleted(settings=settings)
    lost = c.drop(lambda m: isinstance(m, InstallSnapshotRequest))
    c.restart(f)
    c.tick(300)
    since = len(c.sent)
    c.tick(2000)
    sent = [t for t, m in c.sent[since:] if isinstance(m, InstallSnapshotRequest)]
    assert 3 <= len(sent) <= 5
    assert all(b - a > 500 for a, b in itertools.pairwise(sent))
    c.undrop(lost)
    assert c.tick_until(lambda: c.stores[f].ledger_begin_index == last + 1, 3000) is not None
    assert len(c.installed[f]) == 1


# ---- registering snapshots ---------------------------------------------------------------


def test_set_snapshot_takes_term_chain_and_next_pos_from_the_store() -> None:
    s = make_store((1, 1, 2, 2), committed=3)
    c = Cluster(1, stores={"n0": s})
    core = c.cores["n0"]
    snap = core.set_snapshot(1, b"x")
    e1, m1 = s.get(1), s.get_meta(1)
    config = s.config_records()[-1]  # the bootstrap configuration, in force at 1
    assert snap == Snapshot(1, 1, e1.chain_crc, m1.pos + m1.size, b"x", config)  # where 1 ends
    last = core.set_snapshot(3, b"y")  # the newest entry: next_pos is where it ends
    m3 = s.get_meta(3)
    assert (last.last_term, last.next_pos) == (2, m3.pos + m3.size)
    assert core.set_snapshot(2, b"older") is last  # an older one is not kept
    s.delete_before(2)
    assert core.set_snapshot(3, b"z").data == b"z"
    before = snapshot_of(s, 1, b"w")  # exactly the before-begin entry: from the store's fields
    assert (before.last_term, before.last_chain) == (1, e1.chain_crc)
    assert before.next_pos == s.ledger_begin_pos == m1.pos + m1.size


@pytest.mark.parametrize("index", [-1, 4, 9])
def test_set_snapshot_refuses_uncommitted_entries(index: int) -> None:
    c = Cluster(1, stores={"n0": make_store((1,) * 5, committed=3)})
    with pytest.raises(DLedgerError) as err:
        c.cores["n0"].set_snapshot(index, b"x")
    assert err.value.code is DLedgerCode.UNEXPECTED_ARGUMENT


def test_ready_with_an_install_is_truthy() -> None:
    assert Ready(install_snapshot=Snapshot(1, 1, 0, 0, b""))
    assert repr(Snapshot(1, 1, 0, 0, b"x" * 10**6)).endswith("1000000 bytes)")


@pytest.mark.parametrize(
    "name", ["snapshot_timeout_ms", "snapshot_chunk_bytes", "max_snapshot_bytes"]
)
def test_snapshot_settings_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CoreSettings(**{name: 0})
    assert CoreSettings().snapshot_chunk_bytes < 64 << 20  # fits the transport's max frame


# ---- chunks: a snapshot of any size ------------------------------------------------------


def test_a_snapshot_larger_than_a_frame_goes_in_chunks_and_arrives_whole() -> None:
    """The default settings once refused any snapshot over 32 MiB (one frame): the
    follower waited for ever. 40 MiB now goes as ten 4 MiB chunks, one at a time."""
    big = bytes(range(256)) * (40 << 12)  # 40 MiB, every byte's place visible
    c, lead, f, last = follower_down_while_head_is_deleted(snapshot=False)
    c.cores[lead].set_snapshot(last, big)
    c.restart(f)
    assert c.tick_until(lambda: bool(c.installed[f]), 5000) is not None
    (snap,) = c.installed[f]
    assert snap.data == big and snap.last_index == last
    chunks = installs(c, f)
    step = CoreSettings().snapshot_chunk_bytes
    assert [r.offset for r in chunks] == list(range(0, len(big), step))
    assert all(r.total == len(big) and len(r.data) == step for r in chunks)
    assert c.cores[lead].status()["peers"][f]["snapshots_sent"] == 1  # one transfer
    assert c.cores[lead].dispatchers[f].state is DispatcherState.APPEND


def test_a_lost_chunk_is_resent_and_the_transfer_goes_on_where_it_stopped() -> None:
    settings = CoreSettings(snapshot_chunk_bytes=3, snapshot_timeout_ms=500)
    c, _, f, last = follower_down_while_head_is_deleted(settings=settings)
    once = {"lost": False}

    def second_chunk_once(m: RaftMessage) -> bool:
        hit = isinstance(m, InstallSnapshotRequest) and m.offset == 3 and not once["lost"]
        once["lost"] |= hit
        return hit

    c.drop(second_chunk_once)
    c.restart(f)
    assert c.tick_until(lambda: bool(c.installed[f]), 5000) is not None
    assert once["lost"] and c.installed[f][0].data == SNAP  # b"app-state": 3 chunks
    assert [r.offset for r in installs(c, f)] == [0, 3, 3, 6]
    assert c.stores[f].ledger_begin_index == last + 1


def _chunk(offset: int, data: bytes, *, last: int = 40, total: int = 9, req_id: int = 1) -> Any:
    return install_req("n1", "n0", 2, last, 2, data=data, offset=offset, total=total, req_id=req_id)


def _answer(c: Cluster, req: InstallSnapshotRequest) -> InstallSnapshotResponse:
    (resp,) = c.inject(req)
    assert isinstance(resp, InstallSnapshotResponse)
    return resp


def test_the_follower_takes_only_bytes_that_continue_what_it_holds() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 2), term=2, committed=1)})
    a = _answer(c, _chunk(3, b"-st"))  # nothing held: from the start
    assert (a.code, a.received) == (DLedgerCode.SUCCESS, 0)
    assert _answer(c, _chunk(0, b"app")).received == 3
    assert _answer(c, _chunk(0, b"app", req_id=2)).received == 3  # repeated
    assert _answer(c, _chunk(6, b"ate", req_id=3)).received == 3  # ahead of what is held
    assert _answer(c, _chunk(2, b"p-st", req_id=4)).received == 6  # overlaps: its tail
    assert c.installed["n0"] == []
    done = _answer(c, _chunk(6, b"ate", req_id=5))
    assert (done.code, done.received) == (DLedgerCode.SUCCESS, 9)
    (snap,) = c.installed["n0"]
    assert snap.data == SNAP and c.stores["n0"].ledger_begin_index == 41


def test_a_chunk_of_another_snapshot_starts_over_or_is_asked_from_the_start() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 2), term=2, committed=1)})
    assert _answer(c, _chunk(0, b"app")).received == 3
    other = _answer(c, _chunk(3, b"xyz", last=41))  # mid-way into another snapshot
    assert other.received == 0
    assert _answer(c, _chunk(0, b"new", last=41)).received == 3  # that one, from 0
    assert _answer(c, _chunk(3, b"-st")).received == 0  # the first is gone
    assert c.installed["n0"] == []


def test_a_push_from_the_leader_drops_a_half_assembled_snapshot() -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 2), term=2, committed=1)})
    assert _answer(c, _chunk(0, b"app")).received == 3
    c.inject(push("n1", "n0", 2, PushType.COMMIT, commit_index=1, req_id=2))
    assert c.cores["n0"].handler.assembly is None
    assert _answer(c, _chunk(3, b"-st", req_id=3)).received == 0


@pytest.mark.parametrize(
    ("offset", "data", "total"),
    [(-1, b"a", 9), (8, b"ab", 9), (0, b"abc", 2), (0, b"", -1), (0, b"a", (1 << 30) + 1)],
)
def test_a_chunk_that_does_not_fit_its_snapshot_is_refused(
    offset: int, data: bytes, total: int
) -> None:
    c = Cluster(3, stores={"n0": make_store((1, 1, 2), term=2, committed=1)})
    resp = _answer(c, _chunk(offset, data, total=total))
    assert (resp.code, resp.received) == (DLedgerCode.UNEXPECTED_ARGUMENT, 0)
    assert c.installed["n0"] == [] and c.cores["n0"].handler.assembly is None


def test_snapshot_next_pos_is_where_its_entry_ends_not_where_an_uncommitted_next_starts() -> None:
    """Simulator seed 1057 (20 s faults): the leader's entry after the snapshot did not fit
    its segment and opened the next one; it was uncommitted and got replaced by a small
    NOOP, which replicas holding the snapshot's entry placed before the segment end, while
    a node installed from the snapshot had restarted its log at the old entry's start
    (then the snapshot's next_pos): positions diverged for good."""
    s = MemoryStore(StoreSettings(data_file_size=4096))
    s.append_as_leader(1, [b"x" * 3900])  # ends 3948: 148 bytes left in the segment
    s.update_committed(0)
    (big,) = s.append_as_leader(1, [b"y" * 200])  # 248 bytes: opens the next segment
    assert big.pos == 4096
    snap = snapshot_of(s, 0, SNAP)
    assert snap.next_pos == 3948
    noop = 48  # what a new leader writes instead, with the same placement everywhere
    assert place_entry(snap.next_pos, 4096, noop) == 3948 != big.pos
