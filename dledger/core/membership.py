"""Cluster membership: who votes, who only receives the log, and how that changes.

A :class:`Configuration` names every member with its Raft address and whether it votes.
Voters elect leaders and count for commit; learners (etcd's and SOFAJRaft's word) receive
the log and snapshots but neither vote nor count, so adding one changes no majority.

Changes go through the log, one member at a time (Raft thesis §4.1, single-server
changes; :func:`check_change`): a configuration entry (``MAGIC_CONFIG``) holds the whole
new configuration, and every node uses the newest configuration entry its log holds, as
soon as it is appended, committed or not; a truncated entry takes its configuration away
with it. Any majority of the old voters and any majority of the new ones then overlap,
so no two leaders can be elected in one term across a change. Why single-server rather
than joint consensus: every change an operator needs (grow, shrink, replace a node) is a
sequence of single-server changes, which need no second phase and no joint majorities
in the commit and vote rules; the thesis recommends them for that reason.

Invariants:
- two consecutive configurations differ by at most one voter (learners are free);
- a leader appends a configuration entry only when the previous one is committed and an
  entry of its own term is committed (the correction to the thesis' algorithm from
  Ongaro's 2015 note: without it a new leader can commit a change that overlaps a change
  of the old leader's it does not know about);
- the leader never removes itself: it hands leadership over first, and the new leader
  removes it;
- there is always at least one voter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..codes import DLedgerCode, DLedgerError

CONFIG_VERSION = 1
MAX_MEMBERS = 64
"""A configuration's size limit: every member gets a dispatcher and a connection."""


@dataclass(frozen=True, slots=True)
class Member:
    addr: str  # Raft host:port
    voter: bool = True
    url: str = ""  # the application's own address for it (the broker's HTTP URL), or ""
    # Its data directory's incarnation (``LogStore.incarnation``), once the leader has
    # heard it: an answer from another incarnation of this id (the directory was lost or
    # replaced) is not this member's and counts for nothing. "": not known yet.
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class Configuration:
    """Every member by id, sorted (so encoding and iteration are deterministic), and the
    cluster's id: made by the first leader that seals the configuration (``sealed``),
    sent in every leader's and candidate's frames; a node that knows it refuses frames
    of another cluster (a node of another group of the same name, a stale address)."""

    members: Mapping[str, Member]
    cluster: str = ""

    @staticmethod
    def of(voters: Mapping[str, str], learners: Mapping[str, str] | None = None) -> Configuration:
        members = {i: Member(a, True) for i, a in voters.items()}
        for i, a in (learners or {}).items():
            members[i] = Member(a, False)
        return Configuration.checked(members)

    @staticmethod
    def checked(members: Mapping[str, Member], cluster: str = "") -> Configuration:
        if not any(m.voter for m in members.values()):
            raise DLedgerError(DLedgerCode.UNEXPECTED_ARGUMENT, "a configuration needs a voter")
        if len(members) > MAX_MEMBERS:
            raise DLedgerError(DLedgerCode.UNEXPECTED_ARGUMENT, f"more than {MAX_MEMBERS} members")
        for node_id, m in members.items():
            if not node_id or not isinstance(node_id, str) or not m.addr:
                raise DLedgerError(
                    DLedgerCode.UNEXPECTED_ARGUMENT, f"member {node_id!r}: an id and an address"
                )
        return Configuration(dict(sorted(members.items())), cluster)

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(i for i, m in self.members.items() if m.voter)

    @property
    def learners(self) -> tuple[str, ...]:
        return tuple(i for i, m in self.members.items() if not m.voter)

    @property
    def addresses(self) -> dict[str, str]:
        return {i: m.addr for i, m in self.members.items()}

    def is_voter(self, node_id: str) -> bool:
        m = self.members.get(node_id)
        return m is not None and m.voter

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "version": CONFIG_VERSION,
            "members": {
                i: {"addr": m.addr, "voter": m.voter}
                | ({"url": m.url} if m.url else {})
                | ({"incarnation": m.incarnation} if m.incarnation else {})
                for i, m in self.members.items()
            },
        }
        if self.cluster:
            doc["cluster"] = self.cluster
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def decode(raw: bytes | bytearray | memoryview) -> Configuration:
        """The configuration an entry's body holds; ``ValueError`` when it holds none."""
        try:
            doc = json.loads(bytes(raw))
            if doc["version"] != CONFIG_VERSION:
                raise ValueError(f"configuration version {doc['version']!r}")
            members = {
                str(i): Member(
                    str(m["addr"]),
                    bool(m["voter"]),
                    str(m.get("url", "")),
                    str(m.get("incarnation", "")),
                )
                for i, m in doc["members"].items()
            }
            return Configuration.checked(members, str(doc.get("cluster", "")))
        except (KeyError, TypeError, AttributeError, ValueError, DLedgerError) as e:
            raise ValueError(f"not a configuration: {e}") from None

    def describe(self) -> dict[str, object]:
        return {"voters": list(self.voters), "learners": list(self.learners)}


@dataclass(frozen=True, slots=True)
class AddLearner:
    node_id: str
    addr: str
    url: str = ""


@dataclass(frozen=True, slots=True)
class Promote:
    node_id: str


@dataclass(frozen=True, slots=True)
class Remove:
    node_id: str


MembershipChange = AddLearner | Promote | Remove


def check_change(config: Configuration, change: MembershipChange, leader_id: str) -> Configuration:
    """The configuration ``change`` makes of ``config``, or ``DLedgerError`` saying why
    it is refused. At most one voter differs between the two (the single-server rule)."""
    members = dict(config.members)
    node_id = change.node_id
    m = members.get(node_id)
    if isinstance(change, AddLearner):
        if m is not None:
            raise DLedgerError(
                DLedgerCode.UNEXPECTED_ARGUMENT,
                f"{node_id!r} is already a {'voter' if m.voter else 'learner'}",
            )
        if change.addr in config.addresses.values():
            raise DLedgerError(
                DLedgerCode.UNEXPECTED_ARGUMENT, f"{change.addr} is another member's address"
            )
        members[node_id] = Member(change.addr, voter=False, url=change.url)
    elif isinstance(change, Promote):
        if m is None:
            raise DLedgerError(DLedgerCode.UNKNOWN_MEMBER, f"{node_id!r} is not a member")
        if m.voter:
            raise DLedgerError(DLedgerCode.UNEXPECTED_ARGUMENT, f"{node_id!r} already votes")
        members[node_id] = Member(m.addr, voter=True, url=m.url, incarnation=m.incarnation)
    else:
        if m is None:
            raise DLedgerError(DLedgerCode.UNKNOWN_MEMBER, f"{node_id!r} is not a member")
        if node_id == leader_id:
            raise DLedgerError(
                DLedgerCode.UNEXPECTED_ARGUMENT,
                f"{node_id!r} leads: hand leadership to another voter first",
            )
        del members[node_id]
    new = Configuration.checked(members, config.cluster)
    assert changed_voters(config, new) <= 1
    return new


def sealed(config: Configuration, heard: dict[str, str], new_cluster: str) -> Configuration:
    """``config`` with the incarnations ``heard`` filled in for voters that have none
    yet, and ``new_cluster`` as its cluster id if it has none (no voter moves: a change
    any time the rule allows one)."""
    members = {
        i: replace(m, incarnation=heard[i]) if m.voter and not m.incarnation and heard.get(i) else m
        for i, m in config.members.items()
    }
    return Configuration.checked(members, config.cluster or new_cluster)


def same_member(config: Configuration, node_id: str, incarnation: str) -> bool:
    """Is an answer from ``node_id``'s ``incarnation`` one of the member's? Unknown on
    either side ("") counts as the same (a member not sealed yet, an older node)."""
    m = config.members.get(node_id)
    if m is None:
        return False
    return not m.incarnation or not incarnation or m.incarnation == incarnation


def changed_voters(old: Configuration, new: Configuration) -> int:
    """How many voters one of the two has and the other has not."""
    return len(set(old.voters) ^ set(new.voters))
