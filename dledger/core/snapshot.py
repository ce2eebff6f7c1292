"""``Snapshot``: the application's state up to a log index, as the protocol sees it.

The log is DLedger's; what a snapshot holds is the application's (the broker's metadata
table, a test's counter). The application writes a snapshot durably, then registers it
with :meth:`DLedgerCore.set_snapshot`; the core keeps the newest one and sends it to a
follower whose next needed entry the leader no longer holds (INSTALL_SNAPSHOT,
Raft §7).

Invariants:
- ``last_index`` is committed: a snapshot never covers an entry that could be lost.
- ``last_term`` and ``last_chain`` are the term and chain CRC of entry ``last_index``, so a
  follower restarted after it checks the leader's next entry exactly as if it held it.
- ``next_pos`` is where entry ``last_index`` ends: the follower's log restarts there,
  and places entry ``last_index + 1`` by the leader's rule from there, so every later
  entry has the same pos on every replica (docs/formats.md). Not where the leader's entry
  ``last_index + 1`` starts: that entry may be uncommitted and be replaced by one of
  another size, which a replica holding entry ``last_index`` places differently (after
  padding or not; simulator seed 1057 with a 20 s fault phase). When entry
  ``last_index`` is gone (it is the one before the log head), ``next_pos`` is the log's
  begin position: a reset position, or, after retention, the start of the committed
  entry ``last_index + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..codes import DLedgerCode, DLedgerError
from ..store.entry import ConfigRecord

if TYPE_CHECKING:
    from ..store.base import LogStore


@dataclass(frozen=True, slots=True)
class Snapshot:
    last_index: int
    last_term: int
    last_chain: int
    next_pos: int
    data: bytes
    config: ConfigRecord | None = None  # the configuration in force at ``last_index``

    def __repr__(self) -> str:  # the data may be megabytes: never print it
        return (
            f"Snapshot(last_index={self.last_index}, last_term={self.last_term},"
            f" next_pos={self.next_pos}, {len(self.data)} bytes)"
        )


def snapshot_of(store: LogStore, last_index: int, data: bytes) -> Snapshot:
    """The :class:`Snapshot` of ``data`` covering entries up to ``last_index``, with the
    term, chain and next position read from ``store``.

    Raises ``DLedgerError(UNEXPECTED_ARGUMENT)`` when ``last_index`` is not committed, or
    is below ``ledger_begin_index - 1`` (its term is gone with the entry)."""
    begin = store.ledger_begin_index
    if last_index < 0 or last_index > store.committed_index:
        raise DLedgerError(
            DLedgerCode.UNEXPECTED_ARGUMENT,
            f"a snapshot must cover committed entries only: {last_index} is not in"
            f" [0, {store.committed_index}]",
        )
    if last_index < begin - 1:
        raise DLedgerError(
            DLedgerCode.UNEXPECTED_ARGUMENT,
            f"snapshot at {last_index} is older than the log, which begins at {begin}",
        )
    if last_index == begin - 1:
        term, chain = store.ledger_before_begin_term, store.ledger_before_begin_chain
    else:
        e = store.get(last_index)
        term, chain = e.term, e.chain_crc
    if last_index >= begin:
        m = store.get_meta(last_index)
        next_pos = m.pos + m.size
    else:
        next_pos = store.ledger_begin_pos
    in_force = [r for r in store.config_records() if r.index <= last_index]
    config = in_force[-1] if in_force else None
    return Snapshot(last_index, term, chain, next_pos, bytes(data), config)
