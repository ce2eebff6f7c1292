"""Where entries and messages lie in the log, looked up in the store's index: what the
recovery and the reads by message address both need (no dispatch state)."""

from __future__ import annotations

from dledger.store import BODY_OFFSET, FileStore


def last_index_within(store: FileStore, commitlog_offset: int, hi: int) -> int:
    """The last entry up to ``hi`` whose message starts at or before
    ``commitlog_offset`` (``begin - 1`` when none): a binary search over the log."""
    lo = store.ledger_begin_index - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if store.get_meta(mid).pos + BODY_OFFSET <= commitlog_offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pos_of(store: FileStore, index: int) -> int:
    """The byte position of entry ``index`` (or of the ledger end past the last)."""
    if index > store.ledger_end_index:
        return store.ledger_end_pos
    if index < store.ledger_begin_index:
        return store.ledger_begin_pos
    return store.get_meta(index).pos
