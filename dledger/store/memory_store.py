"""``MemoryStore``: the in-memory twin of :class:`~dledger.store.file_store.FileStore`.

Same interface and the same placement rule (entries get the positions the file store
would give them, blank padding included), so simulations see identical ``pos`` values and
the broker's commitlog offsets mean the same thing on either store. Nothing is durable
except what the caller keeps: the term/vote lives in this object.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence

from ..codes import DLedgerCode
from .base import (
    AppendHook,
    CorruptEntryError,
    StoreError,
    StoreSettings,
    check_leader_bodies,
    place_entry,
)
from .configs import ConfigJournal, config_records
from .entry import (
    BODY_CRC_OFFSET,
    BODY_OFFSET,
    CHAIN_CRC_OFFSET,
    HEADER,
    MAGIC_CONFIG,
    MAGIC_NORMAL,
    CodecError,
    ConfigRecord,
    Entry,
    EntryMeta,
    EntryRejectedError,
    chain_crc,
    check_next_entry,
    decode_entry,
    decode_header,
    first_index_of_term,
)
from .meta import TermVote


class MemoryStore:
    """Entries as encoded ``bytes`` in a list; ``_pos[i]`` is entry ``begin + i``'s pos."""

    def __init__(self, settings: StoreSettings | None = None, incarnation: str = "mem") -> None:
        self.settings = settings or StoreSettings()
        self.incarnation = incarnation  # a test that wipes a store gives each its own
        self._hooks: list[AppendHook] = []
        self._entries: list[bytes] = []
        self._pos: list[int] = []
        self._terms: list[int] = []
        self._begin_index = 0
        self._begin_pos = 0
        self._before_begin_term = -1
        self._before_begin_chain = 0
        self._chains: list[int] = []
        self._end_pos = 0
        self._committed_index = -1
        self._committed_pos = 0
        self._term_vote = TermVote()
        self._configs = ConfigJournal(None)

    @property
    def ledger_begin_index(self) -> int:
        return self._begin_index

    @property
    def ledger_before_begin_term(self) -> int:
        return self._before_begin_term

    @property
    def ledger_end_index(self) -> int:
        return self._begin_index + len(self._entries) - 1

    @property
    def ledger_end_term(self) -> int:
        return self._terms[-1] if self._terms else self._before_begin_term

    @property
    def ledger_before_begin_chain(self) -> int:
        return self._before_begin_chain

    @property
    def ledger_end_chain(self) -> int:
        return self._chains[-1] if self._chains else self._before_begin_chain

    @property
    def ledger_begin_pos(self) -> int:
        return self._begin_pos

    @property
    def ledger_end_pos(self) -> int:
        return self._end_pos

    @property
    def committed_index(self) -> int:
        return self._committed_index

    @property
    def committed_pos(self) -> int:
        return self._committed_pos

    def add_append_hook(self, hook: AppendHook) -> None:
        self._hooks.append(hook)

    def _push(self, raw: bytes, pos: int, term: int, chain: int) -> None:
        self._entries.append(raw)
        self._pos.append(pos)
        self._terms.append(term)
        self._chains.append(chain)
        self._end_pos = pos + len(raw)

    def append_as_leader(
        self,
        term: int,
        bodies: Sequence[bytes | bytearray | memoryview],
        magic: int = MAGIC_NORMAL,
    ) -> Sequence[EntryMeta]:
        check_leader_bodies(bodies, magic, self.settings)
        if term < self.ledger_end_term:
            raise StoreError(DLedgerCode.INCONSISTENT_TERM, f"leader term {term} went back")
        seg = self.settings.data_file_size
        encoded: list[tuple[bytes, int, EntryMeta]] = []
        end_pos, index, chain = self._end_pos, self.ledger_end_index + 1, self.ledger_end_chain
        for body in bodies:
            size = BODY_OFFSET + len(body)
            pos = place_entry(end_pos, seg, size)
            buf = bytearray(size)
            HEADER.pack_into(buf, 0, magic, size, index, term, pos, 0, 0, 0, len(body))
            buf[BODY_OFFSET:] = body
            meta = EntryMeta(index, term, pos, size, magic)
            with memoryview(buf) as view:
                for hook in self._hooks:
                    hook(meta, view, BODY_OFFSET)
            crc = zlib.crc32(memoryview(buf)[BODY_OFFSET:])
            buf[BODY_CRC_OFFSET : BODY_CRC_OFFSET + 4] = crc.to_bytes(4, "big")
            chain = chain_crc(buf, chain)
            buf[CHAIN_CRC_OFFSET : CHAIN_CRC_OFFSET + 4] = chain.to_bytes(4, "big")
            encoded.append((bytes(buf), pos, meta))
            end_pos, index = pos + size, index + 1
        if magic == MAGIC_CONFIG:
            self._configs.add(
                [
                    ConfigRecord(m.index, m.term, bytes(b))
                    for (_, _, m), b in zip(encoded, bodies, strict=True)
                ],
                self._committed_index,
            )
        for raw, pos, meta in encoded:
            self._push(raw, pos, meta.term, int.from_bytes(raw[CHAIN_CRC_OFFSET:BODY_CRC_OFFSET]))
        return [m for _, _, m in encoded]

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> list[EntryMeta]:
        view = memoryview(data)
        seg = self.settings.data_file_size
        end_pos, index, term = self._end_pos, self.ledger_end_index + 1, self.ledger_end_term
        chain = self.ledger_end_chain
        staged: list[tuple[bytes, EntryMeta]] = []
        off = 0
        while off < len(view):
            try:
                h = check_next_entry(
                    view,
                    off,
                    min(len(view) - off, self.settings.max_entry_bytes),
                    end_pos=end_pos,
                    segment_size=seg,
                    index=index,
                    term=term,
                    chain=chain,
                )
            except EntryRejectedError as err:
                raise StoreError(err.code, str(err), damaged=err.damaged) from err
            meta = EntryMeta(h.index, h.term, h.pos, h.size, h.magic)
            staged.append((bytes(view[off : off + h.size]), meta))
            end_pos, index, term, chain = h.pos + h.size, index + 1, h.term, h.chain_crc
            off += h.size
        self._configs.add(config_records(view, [m for _, m in staged]), self._committed_index)
        for raw, meta in staged:
            self._push(
                raw, meta.pos, meta.term, int.from_bytes(raw[CHAIN_CRC_OFFSET:BODY_CRC_OFFSET])
            )
        return [m for _, m in staged]

    def _slot(self, index: int) -> int:
        if not self._begin_index <= index <= self.ledger_end_index:
            raise StoreError(
                DLedgerCode.INDEX_OUT_OF_RANGE,
                f"index {index} outside [{self._begin_index}, {self.ledger_end_index}]",
            )
        return index - self._begin_index

    def get(self, index: int) -> Entry:
        k = self._slot(index)
        try:
            return decode_entry(self._entries[k])
        except CodecError as e:  # as the file store: a damaged copy is refused, typed
            raise CorruptEntryError(index, self._pos[k], f"entry {index}: {e}") from e

    def get_meta(self, index: int) -> EntryMeta:
        k = self._slot(index)
        h = decode_header(self._entries[k])
        return EntryMeta(h.index, h.term, h.pos, h.size, h.magic)

    def term_at(self, index: int) -> int:
        if index == self._begin_index - 1:
            return self._before_begin_term
        return self._terms[self._slot(index)]

    def read(self, pos: int, size: int) -> bytes:
        k = bisect.bisect_right(self._pos, pos) - 1
        if k < 0 or size < 0 or pos + size > self._pos[k] + len(self._entries[k]):
            raise StoreError(DLedgerCode.INDEX_OUT_OF_RANGE, f"read [{pos}, {pos + size})")
        rel = pos - self._pos[k]
        return self._entries[k][rel : rel + size]

    def read_entries(self, from_index: int, max_bytes: int, max_entries: int) -> bytes:
        return self.read_batch(from_index, max_bytes, max_entries)[0]

    def read_batch(
        self, from_index: int, max_bytes: int, max_entries: int
    ) -> tuple[bytes, int, int]:
        k = self._slot(from_index)
        seg = self.settings.data_file_size
        seg_limit = self._pos[k] - self._pos[k] % seg + seg
        out = [self._entries[k]]
        total, end = len(out[0]), self._pos[k] + len(out[0])
        for j in range(k + 1, min(len(self._entries), k + max(1, max_entries))):
            raw = self._entries[j]
            if self._pos[j] != end or end + len(raw) > seg_limit or total + len(raw) > max_bytes:
                break
            out.append(raw)
            total += len(raw)
            end += len(raw)
        return b"".join(out), len(out), self._terms[k + len(out) - 1]

    def first_index_of_term(self, term: int, end_index: int) -> int:
        hi = min(end_index, self.ledger_end_index)
        begin = self._begin_index
        return first_index_of_term(lambda i: self._terms[i - begin], begin, hi, term)

    def truncate(self, from_index: int) -> int:
        if from_index > self.ledger_end_index:
            return self.ledger_end_index
        if from_index <= self._committed_index:
            raise StoreError(DLedgerCode.UNEXPECTED_ARGUMENT, "truncate would drop committed data")
        k = self._slot(from_index)
        self._end_pos = self._pos[k - 1] + len(self._entries[k - 1]) if k else self._begin_pos
        del self._entries[k:], self._pos[k:], self._terms[k:], self._chains[k:]
        self._configs.truncated(from_index)
        return self.ledger_end_index

    def reset(
        self,
        begin_index: int,
        begin_pos: int,
        before_begin_term: int,
        before_begin_chain: int = 0,
        config: ConfigRecord | None = None,
    ) -> None:
        if config is not None:
            self._configs.reset(config)
        self._entries, self._pos, self._terms, self._chains = [], [], [], []
        self._before_begin_chain = before_begin_chain
        self._begin_index, self._begin_pos = begin_index, begin_pos
        self._before_begin_term = before_begin_term
        self._end_pos = begin_pos
        self._committed_index, self._committed_pos = begin_index - 1, begin_pos

    def delete_before(self, index: int) -> None:
        """Retention for the memory store: drop entries below ``index`` (committed only)."""
        index = min(index, self._committed_index + 1)
        n = index - self._begin_index
        if n <= 0:
            return
        self._before_begin_term = self._terms[n - 1]
        self._before_begin_chain = self._chains[n - 1]
        # where the last deleted entry ended: the log continues from there (the next
        # entry's pos follows by the placement rule, whatever its size)
        self._begin_pos = self._pos[n - 1] + len(self._entries[n - 1])
        del self._entries[:n], self._pos[:n], self._terms[:n], self._chains[:n]
        self._begin_index = index

    def update_committed(self, index: int) -> None:
        if index <= self._committed_index:
            return
        k = self._slot(index)
        self._committed_index = index
        self._committed_pos = self._pos[k] + len(self._entries[k])

    def load_term_vote(self) -> TermVote:
        return self._term_vote

    def save_term_vote(self, tv: TermVote) -> None:
        self._term_vote = tv

    @property
    def config_version(self) -> int:
        return self._configs.version

    def config_records(self) -> list[ConfigRecord]:
        return self._configs.valid(self.ledger_end_index, self._begin_index, self.term_at)

    def bootstrap_config(self, body: bytes) -> None:
        self._configs.bootstrap(body)

    @property
    def durable_index(self) -> int:
        return self.ledger_end_index  # memory is as durable as it gets

    def sync(self) -> None:
        pass

    def flush(self) -> None:
        """Nothing to sync."""

    def close(self) -> None:
        """Nothing to release."""
