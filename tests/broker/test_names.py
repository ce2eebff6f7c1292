"""What a client may name (issue 32, ``broker/names.py``): the broker's prefixes and
names that read as percent-encodings are refused, writing nothing; a POP group's dead
letters are still made by the broker; a produce that auto-creates its topic takes the
topic a racing create made with another queue count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker import errors
from broker.broker import NewMessage
from broker.names import check_group_name, check_topic_name
from tests.broker.harness import BrokerCluster

pytestmark = pytest.mark.asyncio

REFUSED = ["%SYS%x", "%DLQ%g", "%RETRY%g", "%2e%2e", "a%2Fb", "%25SYS%25META", "x%41"]
ALLOWED = ["orders", "ns%orders", "a|b", "%", "100%", "a%g0", "%DLQ"]


@pytest.mark.parametrize("name", REFUSED)
async def test_names_the_broker_keeps_are_refused(name: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="invalid topic name"):
        check_topic_name(name)
    with pytest.raises(errors.InvalidArgumentError, match="invalid group name"):
        check_group_name(name)


@pytest.mark.parametrize("name", ALLOWED)
async def test_other_names_pass(name: str) -> None:
    check_topic_name(name)
    check_group_name(name)


async def test_only_the_broker_makes_dead_letter_topics(tmp_path: Path) -> None:
    c = BrokerCluster(tmp_path, n=1)
    await c.start_all()
    try:
        b = await c.master()
        end = b.store.ledger_end_index
        for name in REFUSED:
            with pytest.raises(errors.InvalidArgumentError):
                await b.topics.create(name, 1)
            with pytest.raises(errors.InvalidArgumentError):
                await b.producer.produce(name, [NewMessage(b"x")])
        assert b.store.ledger_end_index == end  # nothing written
        t, created = await b.topics.create("%DLQ%g", 1, dead_letters=True)
        assert created and t.name == "%DLQ%g"
        # a group whose name starts with two hex digits has its dead letters too: the
        # prefix's last '%' and "fa" are no percent-encoding
        t, created = await b.topics.create("%DLQ%failers", 1, dead_letters=True)
        assert created and t.name == "%DLQ%failers"
        with pytest.raises(errors.InvalidArgumentError, match="percent-encoding"):
            await b.topics.create("%DLQ%a%2Fb", 1, dead_letters=True)
        with pytest.raises(errors.InvalidArgumentError, match="%SYS%"):
            await b.topics.create("%SYS%x", 1, dead_letters=True)
    finally:
        await c.close()


async def test_an_auto_create_that_loses_the_race_takes_the_topic_as_made(
    tmp_path: Path,
) -> None:
    """Another client's create with 5 queues commits between the produce's look (no
    topic) and its own create with the default count: the produce writes into the
    5-queue topic instead of answering 409 TOPIC_CONFLICT (44 of 782 in the issue)."""
    c = BrokerCluster(tmp_path, n=1)
    await c.start_all()
    try:
        b = await c.master()
        create = b.topics.create

        async def raced(name: str, queues: int | None = None, **kw: Any) -> Any:
            await create(name, 5)  # the other client's, first
            return await create(name, queues, **kw)

        b.topics.create = raced  # type: ignore[method-assign]
        results = await b.producer.produce("race", [NewMessage(b"x", queue_id=4)])
        assert b.topics.get("race").queues == 5
        assert results[0].queue_id == 4
        with pytest.raises(errors.TopicConflictError):  # an explicit count still conflicts
            await create("race", 2)
    finally:
        await c.close()
