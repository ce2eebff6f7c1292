"""``ledgermq_disk_full`` (issue 32, the LedgerMQDiskFull alert): 1 while a node refuses to
write for lack of disk, in any role. A slave answers no write, so it never counts a 507
DISK_FULL; its log refusing the master's pushes is what the gauge shows. The disks here
are the machine's own: a ``disk_full_ratio`` under its real usage, or a reserve larger
than its free space, is a disk too full for the node, as it would be at 90%."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from api.metrics import NodeMetrics
from broker import errors
from broker.broker import Broker, NewMessage
from dledger.store.retention import disk_usage_ratio
from tests.broker.harness import BrokerCluster
from tests.waiting import until

from .conftest import node_settings, running_node

pytestmark = pytest.mark.asyncio


async def disk_full_gauge(broker: Broker) -> float:
    text = (await NodeMetrics(broker, cache_s=0).render()).decode()
    found = re.findall(r"^ledgermq_disk_full (\S+)$", text, re.MULTILINE)
    assert len(found) == 1, text
    return float(found[0])


async def test_a_node_with_room_says_0_and_one_under_its_reserve_says_1(tmp_path: Path) -> None:
    async with running_node(node_settings(tmp_path / "roomy")) as node:
        assert await disk_full_gauge(node.broker) == 0.0
    free = shutil.disk_usage(tmp_path).free
    async with running_node(node_settings(tmp_path / "n0", disk_reserve_bytes=2 * free)) as node:
        with pytest.raises(errors.DiskFullError, match="reserve"):
            await node.broker.producer.produce("t", [NewMessage(b"x")])
        assert await disk_full_gauge(node.broker) == 1.0


async def test_a_slave_whose_log_refuses_the_masters_pushes_says_1(tmp_path: Path) -> None:
    usage = disk_usage_ratio(tmp_path)
    assert usage > 0.002, f"the test needs a disk in use, this one is {usage:.2%} used"
    cluster = BrokerCluster(tmp_path)
    try:
        await cluster.start_all()
        master = await cluster.master()
        await master.topics.create("t", 1)
        slave_id = next(n for n, b in cluster.brokers.items() if b is not master)
        await cluster.stop(slave_id)
        # Restarted with a full-disk line under what the disk holds now: its log refuses
        # every append (the store's check, as DLedger's isDiskFull).
        settings = cluster.settings(slave_id)
        full = replace(settings.store, disk_full_ratio=usage / 2, disk_clean_ratio=usage / 2)
        slave = Broker(replace(settings, store=full))
        await slave.start()
        cluster.brokers[slave_id] = slave
        other = next(b for b in cluster.brokers.values() if b not in (master, slave))
        await master.producer.produce("t", [NewMessage(b"m%d" % i) for i in range(5)])
        end = master.store.ledger_end_index
        await until(lambda: other.store.ledger_end_index >= end, what="the other slave has all")
        assert slave.store.ledger_end_index < end  # it refused the master's pushes
        assert slave.store.disk_full() and not slave.is_master
        assert await disk_full_gauge(slave) == 1.0
        assert await disk_full_gauge(master) == 0.0
    finally:
        await cluster.close()
