"""The unit selection of a tag-filtered pull: the JSON pull (``Broker.pull``) and the
Arrow pull's pages (``Broker.pull_page``) answer the same messages and next offset for
the same request, and a unit whose tags only share the filter's tags hash (a collision)
is no match: it spends no slot of ``max_messages``."""

from __future__ import annotations

import itertools
import string
from pathlib import Path

import pytest

from broker.broker import Broker, NewMessage
from consumequeue import tags_hash
from tests.broker.harness import BrokerCluster

pytestmark = pytest.mark.asyncio


def colliding_tags() -> tuple[str, str]:
    """Two distinct tags with one tags hash, found with the consume queue's own hash."""
    seen: dict[int, str] = {}
    for a, b in itertools.product(string.ascii_letters, repeat=2):
        tag = a + b
        other = seen.setdefault(tags_hash(tag), tag)
        if other != tag:
            return other, tag
    raise AssertionError("no two short tags share a tags hash")


async def _single(tmp_path: Path) -> tuple[BrokerCluster, Broker]:
    c = BrokerCluster(tmp_path, n=1)
    await c.start_all()
    return c, await c.master()


async def _both(
    b: Broker, offset: int, max_messages: int, tags: str
) -> tuple[tuple[str, list[int], int], tuple[str, list[int], int]]:
    """(status, queue offsets, next offset) of the JSON pull and of the page pull."""
    j = await b.reads.pull(
        b.reads.pulled_message, "t", 0, offset, max_messages=max_messages, tags=tags
    )
    p = await b.reads.pull_page("t", 0, offset, max_messages=max_messages, tags=tags)
    return (
        (j.status, [m.queue_offset for m in j.messages], j.next_offset),
        (p.status, list(p.page.queue_offsets), p.next_offset),
    )


async def test_a_tags_hash_collision_spends_no_slot_in_either_pull(tmp_path: Path) -> None:
    wanted, collider = colliding_tags()
    assert wanted != collider and tags_hash(wanted) == tags_hash(collider)
    other = "Other"
    assert tags_hash(other) != tags_hash(wanted)
    c, b = await _single(tmp_path)
    try:
        await b.topics.create("t", 1)
        singles = [collider, wanted, wanted, collider, collider, wanted, other, wanted, collider]
        batch = [collider, wanted, collider, wanted]  # one batch record: a unit per message
        tail = [collider, collider, wanted]
        for tag in singles:
            await b.producer.produce("t", [NewMessage(tag.encode(), tag, queue_id=0)])
        await b.producer.produce("t", [NewMessage(t.encode(), t, queue_id=0) for t in batch])
        for tag in tail:
            await b.producer.produce("t", [NewMessage(tag.encode(), tag, queue_id=0)])
        sent = singles + batch + tail
        n = len(sent)
        assert b.reads.queue_bounds("t", 0) == (0, n)

        # The case at the heart of it: the collider at 0 is no match, so two slots take
        # the wanted messages at 1 and 2 in both pulls.
        json, page = await _both(b, 0, 2, wanted)
        assert page == ("FOUND", [1, 2], 3)
        assert json == page

        # Every offset and a few sizes, against what a match means: the exact tags.
        for offset, max_messages in itertools.product(range(n + 1), range(1, 6)):
            matches = [o for o in range(offset, n) if sent[o] == wanted][:max_messages]
            if matches:
                expected = ("FOUND", matches, matches[-1] + 1)
            elif offset < n:
                expected = ("NO_MATCHED_MSG", [], n)
            else:
                expected = ("NO_NEW_MSG", [], n)
            json, page = await _both(b, offset, max_messages, wanted)
            assert (json, page) == (expected, expected), (offset, max_messages)
    finally:
        await c.close()
