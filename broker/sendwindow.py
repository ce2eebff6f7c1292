"""The send window: recent client message ids → what their send stored (replicated).

RocketMQ 5 clients generate a message id before the first attempt and resend the same
id after a timeout, an unknown outcome, or on another node (docs/rocketmq.md). The
window makes such a resend answer the first send's result instead of storing the
message again, after a failover too.

It is the producer-session mechanism (``broker/sessions.py``, ``broker/produce.py``)
with one session per message id: a send with id ``X`` is a session batch of producer
``%id%X`` (``send_session``) and sequence 0. Its messages carry the session properties
as any session batch does, so what the log holds of it is recorded from the committed
entries, on every node alike, and the master's attempts rule (join a running attempt,
settle an unknown outcome before appending again, complete a batch cut short by a
failover) applies unchanged. Only the table differs: not the producers' LRU table
(``MetadataState.sessions``, which a stream of one-message sessions would wash out),
but this window, bounded by ``max_ids`` and by ``max_age_ms`` of log time: an id is
forgotten once a later send stored more than ``max_age_ms`` after it is applied (with
no sends, nothing ages out; the count still bounds it). Log time is the entries' store
timestamps (the master's clock when it appended them), never the applying node's clock,
so every replica forgets the same ids at the same entry.

``%`` is in no producer id of ours (``PRODUCER_ID``), so the two tables never share a key.

Invariants:
- a pure function of the committed entries in log order (and the snapshot);
- at most ``max_ids`` ids, in the order of their first entry; the oldest goes first;
- applying never raises on what the log holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .jsonint import json_int

SEND_ID_PREFIX = "%id%"
MAX_SEND_ID_CHARS = 128
DEFAULT_MAX_IDS = 100_000
DEFAULT_MAX_AGE_MS = 600_000  # ten minutes: far past any client's retries


def send_session(message_id: str) -> tuple[str, int]:
    """The (producer id, sequence) of the send of ``message_id``."""
    return SEND_ID_PREFIX + message_id, 0


def is_send_id(producer_id: str) -> bool:
    """Is ``producer_id`` a send window's key (``send_session``) with a usable id?"""
    if not producer_id.startswith(SEND_ID_PREFIX):
        return False
    rest = producer_id[len(SEND_ID_PREFIX) :]
    return 0 < len(rest) <= MAX_SEND_ID_CHARS and rest.isprintable() and rest.strip() == rest


@dataclass(slots=True)
class Sent:
    """One id's send: its first entry's log time and what of it is stored."""

    ts: int
    seq: int
    size: int
    results: list[tuple[int, int, int]]

    @property
    def complete(self) -> bool:
        return len(self.results) >= self.size


class SendWindow(Mapping[str, Sent]):
    """The window, read by producer id (``%id%X``) as the session rule reads its table:
    ``seq``, ``results`` and ``complete`` of the batch."""

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS, max_age_ms: int = DEFAULT_MAX_AGE_MS):
        self.max_ids = max_ids
        self.max_age_ms = max_age_ms
        self.sent: OrderedDict[str, Sent] = OrderedDict()  # producer id → its send
        self.evicted = 0  # ids forgotten (by count or age): not replicated, a metric

    def __getitem__(self, key: str) -> Sent:
        return self.sent[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sent)

    def __len__(self) -> int:
        return len(self.sent)

    def record(  # noqa: PLR0917 - one committed message's session fields
        self,
        producer_id: str,
        seq: int,
        batch_index: int,
        batch_size: int,
        ts: int,
        result: tuple[int, int, int],
    ) -> None:
        """One committed message of the send ``producer_id`` (stored at log time ``ts``)."""
        s = self.sent.get(producer_id)
        if s is None or seq > s.seq:
            s = self.sent[producer_id] = Sent(ts, seq, batch_size, [])
            self.sent.move_to_end(producer_id)
        elif seq < s.seq:
            return
        if batch_index == len(s.results):  # a re-sent tail continues where the log stopped
            s.results.append(result)
        self._evict(ts)

    def _evict(self, now: int) -> None:
        sent = self.sent
        while len(sent) > self.max_ids:
            sent.popitem(last=False)
            self.evicted += 1
        horizon = now - self.max_age_ms
        while sent:
            first = next(iter(sent.values()))
            if first.ts >= horizon:
                break
            sent.popitem(last=False)
            self.evicted += 1

    # ---- the snapshot part ---------------------------------------------------------------

    def to_json(self) -> list[Any]:
        return [[p, s.ts, s.seq, s.size, s.results] for p, s in self.sent.items()]

    def adopt_json(self, rows: list[Any]) -> OrderedDict[str, Sent]:
        """The rows of ``to_json`` as a table (``ValueError``/``TypeError`` if malformed)."""
        out: OrderedDict[str, Sent] = OrderedDict()
        for pid, ts, seq, size, results in rows:
            out[str(pid)] = Sent(
                json_int(ts, "ts"),
                json_int(seq, "sequence"),
                json_int(size, "batch size"),
                [
                    (json_int(a, "result"), json_int(b, "result"), json_int(c, "result"))
                    for a, b, c in results
                ],
            )
        return out
