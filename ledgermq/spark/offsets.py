"""Offsets of the ledgermq data source: specs, resolution, range splitting, rate limits.

Pure functions, no Spark and no network: the driver fetches each queue's bounds and the
offsets for any timestamps, these functions decide everything else. Spark's Kafka
source is the model wherever the meaning is the same (a queue is its partition):

- an offset spec names per queue an offset, ``-2`` (earliest) or ``-1`` (latest), or a
  store time resolved through the offset-by-time endpoint; queues it does not name take
  the spec's default (earliest for a start, latest for an end);
- ``split_ranges`` is the Kafka source's ``minPartitions`` rule: with fewer non-empty
  ranges than ``min_partitions``, large ranges are cut into parts in proportion to their
  share (rounding half up), small ones stay whole, and no offset is dropped;
- ``rate_limit`` is its ``maxOffsetsPerTrigger`` rule: the limit is shared among queues
  in proportion to what each has waiting, a queue with data gets at least one offset
  (so the sum may pass the limit by up to one per queue), none passes its latest.

Offsets are queue offsets (message numbers in a queue); a range ``[start, end)`` holds
``end - start`` messages when nothing was removed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1


class OffsetError(ValueError):
    """An offset spec or a planned range that cannot be honoured (bad input)."""


class DataLossError(OffsetError):
    """Messages a read was to include are gone (retention), and ``failOnDataLoss`` is on."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where reading starts (or ends) in every queue."""

    default: int = EARLIEST
    """EARLIEST or LATEST: queues named nowhere else."""
    offsets: Mapping[int, int] = field(default_factory=dict)
    """queue → queue offset, EARLIEST or LATEST."""
    timestamps: Mapping[int, int] = field(default_factory=dict)
    """queue → store time (ms): the first offset stored at or after it."""
    all_timestamp: int | None = None
    """every queue from this store time (ms); wins over the rest."""

    def timestamps_for(self, queues: Iterable[int]) -> dict[int, int]:
        """The store times to resolve (through the broker) for these queues."""
        if self.all_timestamp is not None:
            return {q: self.all_timestamp for q in queues}
        return {q: self.timestamps[q] for q in queues if q in self.timestamps}


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Messages ``[start, end)`` of one queue: one Spark partition's work."""

    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


# ---- resolution -------------------------------------------------------------------------------


def resolve(
    spec: OffsetSpec,
    queues: Sequence[int],
    bounds: Mapping[int, tuple[int, int]],
    by_time: Mapping[int, int],
) -> dict[int, int]:
    """Concrete offsets for ``queues``: ``bounds`` is queue → (min offset, max offset),
    ``by_time`` the broker's answers for ``spec.timestamps_for(queues)`` (and nothing
    else: a queue in it takes that offset)."""
    unknown = sorted((set(spec.offsets) | set(spec.timestamps)) - set(queues))
    if unknown:
        raise OffsetError(f"offsets name queues {unknown} that are not read (queues {queues})")
    out = {}
    for q in queues:
        lo, hi = bounds[q]
        if q in by_time:
            out[q] = by_time[q]
            continue
        wanted = spec.offsets.get(q, spec.default)
        out[q] = lo if wanted == EARLIEST else hi if wanted == LATEST else wanted
    return out


def plan_ranges(
    start: Mapping[int, int],
    end: Mapping[int, int],
    bounds: Mapping[int, tuple[int, int]],
    *,
    fail_on_data_loss: bool,
) -> list[QueueRange]:
    """The ranges to read, checked against what the queues hold: an end past a queue's
    max offset or before its start is an error; a start before its min offset (removed
    by retention) is ``DataLossError``, or with ``fail_on_data_loss`` off, moved up to
    the min offset with a warning."""
    ranges = []
    for q in sorted(start):
        lo, hi = bounds[q]
        s, e = start[q], end[q]
        if e > hi:
            raise OffsetError(f"queue {q}: the ending offset {e} is past its max offset {hi}")
        if e < s:
            raise OffsetError(f"queue {q}: the ending offset {e} is before the starting offset {s}")
        if s < lo:
            s = data_lost(q, s, lo, fail_on_data_loss=fail_on_data_loss)
        ranges.append(QueueRange(q, s, max(s, e)))
    return ranges


def data_lost(queue_id: int, wanted: int, first_held: int, *, fail_on_data_loss: bool) -> int:
    """Offsets ``[wanted, first_held)`` are gone: raise, or say so and go on from
    ``first_held``."""
    what = (
        f"queue {queue_id}: messages {wanted}..{first_held - 1} were removed (retention) "
        f"before they were read; the queue now starts at {first_held}"
    )
    if fail_on_data_loss:
        raise DataLossError(
            f"{what}. Read from a later offset, or set failOnDataLoss to false to skip them."
        )
    log.warning("%s: skipped (failOnDataLoss is false)", what)
    return first_held


# ---- splitting --------------------------------------------------------------------------------


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def _parts(size: int, total: int, min_partitions: int) -> int:
    return max(_round_half_up(size / total * min_partitions), 1)


def split_ranges(ranges: Sequence[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Empty ranges dropped; then, if ``min_partitions`` asks for more partitions than
    there are ranges, large ranges cut into near-equal parts (module docstring)."""
    if min_partitions is not None and min_partitions < 1:
        raise OffsetError(f"minPartitions must be >= 1, not {min_partitions}")
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    # Ranges too small to split are left out of the proportions of the others.
    whole = {id(r) for r in ranges if _parts(r.size, total, min_partitions) == 1}
    split_total = total - sum(r.size for r in ranges if id(r) in whole)
    split_min = max(min_partitions - len(whole), 1)
    out = []
    for r in ranges:
        parts = 1 if id(r) in whole else _parts(r.size, split_total, split_min)
        remaining, start = r.size, r.start
        for part in range(parts):
            this = remaining // (parts - part)  # the last part takes the remainder
            remaining -= this
            end = min(start + this, r.end)
            out.append(QueueRange(r.queue_id, start, end))
            start = end
    return [r for r in out if r.size > 0]


# ---- streaming --------------------------------------------------------------------------------


def rate_limit(start: Mapping[int, int], latest: Mapping[int, int], limit: int) -> dict[int, int]:
    """The end offsets of a micro-batch of at most about ``limit`` messages from
    ``start`` towards ``latest`` (module docstring)."""
    if limit < 1:
        raise OffsetError(f"maxOffsetsPerTrigger must be >= 1, not {limit}")
    sizes = {q: latest[q] - start[q] for q in latest if q in start and latest[q] > start[q]}
    total = sum(sizes.values())
    if total == 0:
        return dict(latest)
    out = {}
    for q, end in latest.items():
        if q not in sizes:
            out[q] = end
            continue
        share = limit * sizes[q] / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[q] = min(end, start[q] + take)
    return out


def offsets_to_json(offsets: Mapping[int, int]) -> dict[str, int]:
    """The checkpoint's form: ``{"<queue_id>": next_offset}``, queues in order."""
    return {str(q): int(offsets[q]) for q in sorted(offsets)}


def offsets_from_json(doc: object) -> dict[int, int]:
    """The inverse of ``offsets_to_json``, checked (a checkpoint may be old or edited)."""
    if not isinstance(doc, Mapping):
        raise OffsetError(f"an offset is an object of queue id → offset, not {doc!r}")
    out = {}
    for k, v in doc.items():
        if not isinstance(k, str) or not k.isdigit() or not isinstance(v, int) or v < 0:
            raise OffsetError(f"offset entry {k!r}: {v!r} is not queue id → offset >= 0")
        out[int(k)] = v
    return out
