"""``ledgermq.spark.offsets``: range splitting (the Kafka source's ``KafkaOffsetRangeCalculator``
cases, ported), rate limiting (its ``maxOffsetsPerTrigger`` rule), offset resolution and
the checks of a planned range. Pure functions: no Spark, no broker."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgermq.spark.offsets import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetError,
    OffsetSpec,
    QueueRange,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
    resolve,
    split_ranges,
)

R = QueueRange


# ---- splitting: the Kafka source's cases ------------------------------------------------------


def test_no_min_partitions_one_range_per_queue_and_empty_ones_dropped() -> None:
    assert split_ranges([R(1, 1, 2)], None) == [R(1, 1, 2)]
    assert split_ranges([R(1, 1, 2), R(2, 1, 1)], None) == [R(1, 1, 2)]


def test_as_many_ranges_as_min_partitions_stay_whole() -> None:
    ranges = [R(1, 1, 2), R(2, 1, 2), R(3, 1, 2)]
    assert split_ranges(ranges, 3) == ranges


def test_one_queue_to_n_ranges() -> None:
    assert split_ranges([R(1, 1, 5)], 4) == [R(1, 1, 2), R(1, 2, 3), R(1, 3, 4), R(1, 4, 5)]


def test_skewed_queues_split_in_proportion() -> None:
    assert split_ranges([R(1, 1, 5), R(2, 1, 21)], 4) == [
        R(1, 1, 5),
        R(2, 1, 7),
        R(2, 7, 14),
        R(2, 14, 21),
    ]


def test_empty_ranges_are_ignored_and_the_rest_split() -> None:  # SPARK-30656
    assert split_ranges([R(1, 1, 1), R(2, 1, 21)], 4) == [
        R(2, 1, 6),
        R(2, 6, 11),
        R(2, 11, 16),
        R(2, 16, 21),
    ]
    assert split_ranges([R(1, 1, 5), R(2, 1, 21), R(3, 1, 1)], 4) == [
        R(1, 1, 5),
        R(2, 1, 7),
        R(2, 7, 14),
        R(2, 14, 21),
    ]


def test_very_skewed_queues() -> None:  # SPARK-30656
    assert split_ranges([R(1, 1, 2), R(2, 1, 1001)], 4) == [
        R(1, 1, 2),
        R(2, 1, 334),
        R(2, 334, 667),
        R(2, 667, 1001),
    ]


def test_min_partitions_below_the_queue_count_changes_nothing() -> None:  # SPARK-30656
    assert split_ranges([R(1, 1, 5), R(2, 1, 21)], 1) == [R(1, 1, 5), R(2, 1, 21)]


def test_range_not_a_multiple_of_min_partitions() -> None:
    assert split_ranges([R(1, 1, 11)], 3) == [R(1, 1, 4), R(1, 4, 7), R(1, 7, 11)]


def test_never_drop_offsets() -> None:  # SPARK-28489
    assert split_ranges([R(1, 0, 10), R(2, 0, 10), R(3, 0, 1)], 6) == [
        R(1, 0, 3),
        R(1, 3, 6),
        R(1, 6, 10),
        R(2, 0, 3),
        R(2, 3, 6),
        R(2, 6, 10),
        R(3, 0, 1),
    ]


def test_small_unsplit_ranges_leave_the_proportions_of_the_large() -> None:  # SPARK-36576
    assert split_ranges([R(1, 0, 10000), R(2, 0, 15000), R(3, 0, 20000)], 9) == [
        R(1, 0, 5000),
        R(1, 5000, 10000),
        R(2, 0, 5000),
        R(2, 5000, 10000),
        R(2, 10000, 15000),
        R(3, 0, 5000),
        R(3, 5000, 10000),
        R(3, 10000, 15000),
        R(3, 15000, 20000),
    ]
    assert split_ranges([R(1, 0, 500), R(2, 0, 12000), R(3, 0, 15001)], 6) == [
        R(1, 0, 500),
        R(2, 0, 6000),
        R(2, 6000, 12000),
        R(3, 0, 5000),
        R(3, 5000, 10000),
        R(3, 10000, 15001),
    ]
    assert split_ranges([R(1, 0, 1), R(2, 0, 1), R(3, 0, 10000)], 6) == [
        R(1, 0, 1),
        R(2, 0, 1),
        R(3, 0, 2500),
        R(3, 2500, 5000),
        R(3, 5000, 7500),
        R(3, 7500, 10000),
    ]


def test_rounding_is_half_up_like_scala() -> None:
    """2.5 parts rounds to 3 (Python's round would give 2)."""
    assert split_ranges([R(1, 0, 5), R(2, 0, 5)], 5) == [
        R(1, 0, 1),
        R(1, 1, 3),
        R(1, 3, 5),
        R(2, 0, 1),
        R(2, 1, 3),
        R(2, 3, 5),
    ]


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1, max_size=12),
    st.none() | st.integers(1, 64),
)
def test_splits_cover_every_offset_once_in_order(
    spans: list[tuple[int, int]], min_partitions: int | None
) -> None:
    ranges = [R(q, s, s + n) for q, (s, n) in enumerate(spans)]
    out = split_ranges(ranges, min_partitions)
    for r in ranges:
        mine = [p for p in out if p.queue_id == r.queue_id]
        assert all(p.size > 0 for p in mine)
        if r.size:
            assert mine[0].start == r.start and mine[-1].end == r.end
            assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        else:
            assert mine == []


def test_min_partitions_must_be_positive() -> None:
    with pytest.raises(OffsetError, match="minPartitions"):
        split_ranges([R(1, 0, 5)], 0)


# ---- rate limiting ----------------------------------------------------------------------------


def test_rate_limit_shares_the_limit_in_proportion() -> None:
    assert rate_limit({0: 0, 1: 0}, {0: 100, 1: 300}, 40) == {0: 10, 1: 30}
    assert rate_limit({0: 5, 1: 0}, {0: 5, 1: 300}, 40) == {0: 5, 1: 40}


def test_rate_limit_never_starves_a_small_queue_nor_passes_the_latest() -> None:
    # 1 of 1001 waiting messages: a share of 0.01, rounded up to one offset.
    assert rate_limit({0: 0, 1: 0}, {0: 1, 1: 1000}, 10) == {0: 1, 1: 9}
    assert rate_limit({0: 0}, {0: 3}, 10) == {0: 3}


def test_rate_limit_with_nothing_waiting_is_the_latest() -> None:
    assert rate_limit({0: 4, 1: 9}, {0: 4, 1: 9}, 10) == {0: 4, 1: 9}
    with pytest.raises(OffsetError, match="maxOffsetsPerTrigger"):
        rate_limit({0: 0}, {0: 5}, 0)


@given(
    st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, 10**6), st.integers(0, 10**4))),
    st.integers(1, 10**5),
)
def test_rate_limit_stays_between_start_and_latest(
    queues: dict[int, tuple[int, int]], limit: int
) -> None:
    start = {q: s for q, (s, _) in queues.items()}
    latest = {q: s + n for q, (s, n) in queues.items()}
    end = rate_limit(start, latest, limit)
    assert all(start[q] <= end[q] <= latest[q] for q in queues)
    waiting = sum(1 for q in queues if latest[q] > start[q])
    assert sum(end[q] - start[q] for q in queues) <= limit + waiting


# ---- resolution and checks --------------------------------------------------------------------


BOUNDS = {0: (0, 10), 1: (5, 20), 2: (0, 0)}


def test_resolve_defaults_specific_offsets_and_timestamps() -> None:
    queues = [0, 1, 2]
    assert resolve(OffsetSpec(EARLIEST), queues, BOUNDS, {}) == {0: 0, 1: 5, 2: 0}
    assert resolve(OffsetSpec(LATEST), queues, BOUNDS, {}) == {0: 10, 1: 20, 2: 0}
    spec = OffsetSpec(EARLIEST, offsets={0: 7, 1: LATEST})
    assert resolve(spec, queues, BOUNDS, {}) == {0: 7, 1: 20, 2: 0}
    spec = OffsetSpec(LATEST, timestamps={1: 1234})
    assert spec.timestamps_for(queues) == {1: 1234}
    assert resolve(spec, queues, BOUNDS, {1: 12}) == {0: 10, 1: 12, 2: 0}
    spec = OffsetSpec(EARLIEST, all_timestamp=99)
    assert spec.timestamps_for(queues) == {0: 99, 1: 99, 2: 99}
    assert resolve(spec, queues, BOUNDS, {0: 3, 1: 6, 2: 0}) == {0: 3, 1: 6, 2: 0}


def test_resolve_refuses_queues_that_are_not_read() -> None:
    with pytest.raises(OffsetError, match=r"queues \[7\]"):
        resolve(OffsetSpec(EARLIEST, offsets={7: 1}), [0, 1], BOUNDS, {})


def test_plan_ranges_checks_ends_and_data_loss(caplog: pytest.LogCaptureFixture) -> None:
    assert plan_ranges({0: 2, 1: 5}, {0: 10, 1: 6}, BOUNDS, fail_on_data_loss=True) == [
        R(0, 2, 10),
        R(1, 5, 6),
    ]
    with pytest.raises(OffsetError, match="past its max offset 10"):
        plan_ranges({0: 0}, {0: 11}, BOUNDS, fail_on_data_loss=True)
    with pytest.raises(OffsetError, match="before the starting offset 6"):
        plan_ranges({0: 6}, {0: 5}, BOUNDS, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match=r"queue 1: messages 2\.\.4 were removed"):
        plan_ranges({1: 2}, {1: 20}, BOUNDS, fail_on_data_loss=True)
    with caplog.at_level("WARNING"):
        assert plan_ranges({1: 2}, {1: 20}, BOUNDS, fail_on_data_loss=False) == [R(1, 5, 20)]
        assert plan_ranges({1: 2}, {1: 4}, {1: (5, 20)}, fail_on_data_loss=False) == [R(1, 5, 5)]
    assert "failOnDataLoss is false" in caplog.text


def test_checkpoint_offsets_round_trip_and_are_checked() -> None:
    assert offsets_to_json({3: 7, 0: 1}) == {"0": 1, "3": 7}
    assert offsets_from_json({"0": 1, "3": 7}) == {0: 1, 3: 7}
    for bad in ([1], {"a": 1}, {"0": -1}, {"0": "1"}):
        with pytest.raises(OffsetError):
            offsets_from_json(bad)


def test_the_pure_modules_import_no_spark() -> None:
    code = (
        "import sys, ledgermq.spark, ledgermq.spark.offsets, ledgermq.spark.options, "
        "ledgermq.spark.pages, ledgermq.spark.produce, ledgermq.spark.transfer; "
        "assert not [m for m in sys.modules if m.startswith('pyspark')], 'pyspark imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
