"""Brokers in one test process over real TCP on 127.0.0.1, with small files."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.broker import Broker
from broker.settings import BrokerSettings
from consumequeue import ConsumeQueueSettings, KeyIndexSettings
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until

__all__ = ["SMALL_STORE", "BrokerCluster", "broker_settings", "until"]

SMALL_STORE = StoreSettings(
    data_file_size=1 << 20, index_file_size=32 * 1024, clean_interval_ms=3_600_000
)


def broker_settings(
    data_dir: Path, node_id: str, ports: dict[str, int], **overrides: Any
) -> BrokerSettings:
    peers = ";".join(f"{n}-127.0.0.1:{p}" for n, p in sorted(ports.items()))
    base = BrokerSettings(
        node_id=node_id,
        group="g0",
        peers=peers,
        data_dir=data_dir / node_id,
        store=SMALL_STORE,
        peer_urls={n: f"http://127.0.0.1:{p + 1000}" for n, p in ports.items()},
        dispatch_checkpoint_interval_ms=200,
        consume_queue=ConsumeQueueSettings(segment_units=64),
        key_index=KeyIndexSettings(slots_per_file=64, max_entries_per_file=256),
        seed=hash(node_id) & 0xFFFF,
    )
    return replace(base, **overrides)


class BrokerCluster:
    """N brokers in this process; ``stop``/``start`` one to fail over."""

    def __init__(self, tmp_path: Path, n: int = 3, **overrides: Any) -> None:
        self.tmp_path = tmp_path
        ids = [f"n{i}" for i in range(n)]
        self.ports = dict(zip(ids, free_ports(n), strict=True))
        self.overrides = overrides
        self.brokers: dict[str, Broker] = {}

    def settings(self, node_id: str) -> BrokerSettings:
        return broker_settings(self.tmp_path, node_id, self.ports, **self.overrides)

    async def start(self, node_id: str) -> Broker:
        b = Broker(self.settings(node_id))
        await b.start()
        self.brokers[node_id] = b
        return b

    async def start_all(self) -> None:
        for node_id in self.ports:
            await self.start(node_id)

    async def stop(self, node_id: str) -> None:
        b = self.brokers.pop(node_id)
        await b.stop()

    def wipe_consume_queues(self, node_id: str) -> None:
        shutil.rmtree(self.settings(node_id).data_dir / "consumequeue")

    async def master(self, timeout_s: float = 20.0) -> Broker:
        found: list[Broker] = []

        def one() -> bool:
            masters = [b for b in self.brokers.values() if b.is_master]
            found[:] = masters
            return len(masters) == 1

        await until(one, timeout_s, "one master")
        return found[0]

    async def converged(self, timeout_s: float = 20.0) -> None:
        """Every running broker dispatched the same committed index."""

        def same() -> bool:
            ends = {b.store.ledger_end_index for b in self.brokers.values()}
            done = {b.dispatcher.dispatched_index for b in self.brokers.values()}
            return len(ends) == 1 and done == ends

        await until(same, timeout_s, "convergence")

    async def close(self) -> None:
        for node_id in list(self.brokers):
            await self.stop(node_id)
