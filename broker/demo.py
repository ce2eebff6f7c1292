"""The failover demonstration (``ledgermq demo`` / ``make demo``).

Three brokers of one DLedger group in this process, on 127.0.0.1 over real TCP, with
real files in a temp directory: produce through the master, consume with a group,
stop the master, watch a new one take over, produce on with a producer session (a
retried batch is answered, not duplicated), bring the old node back, and check that
every queue is contiguous and identical on every node and the group's offsets held.
The multi-process version of this is the docker-compose demo.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from dledger.runtime.local_cluster import free_ports
from dledger.store import StoreSettings

from .broker import Broker, ProduceMessage
from .settings import BrokerSettings

MiB = 1 << 20


def _settings(root: Path, node: str, ports: dict[str, int]) -> BrokerSettings:
    peers = ";".join(f"{n}-127.0.0.1:{p}" for n, p in sorted(ports.items()))
    return BrokerSettings(
        node_id=node,
        peers=peers,
        data_dir=root / node,
        store=StoreSettings(data_file_size=64 * MiB, index_file_size=4 * MiB),
    )


async def _master(brokers: dict[str, Broker], timeout_s: float = 30.0) -> Broker:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        masters = [b for b in brokers.values() if b.is_master]
        if len(masters) == 1:
            return masters[0]
        await asyncio.sleep(0.005)
    raise TimeoutError(f"no master within {timeout_s:.0f} s")


async def _produce(m: Broker, topic: str, n: int, *, batch: int, body: int, label: str) -> None:
    with tqdm(total=n, desc=label, unit="msg", unit_scale=True) as bar:
        for i in range(0, n, batch):
            k = min(batch, n - i)
            msgs = [
                ProduceMessage(b"%08d" % (i + j) + b"x" * (body - 8), keys=[f"k{i + j}"])
                for j in range(k)
            ]
            await m.produce(topic, msgs)
            bar.update(k)


async def _queue_bodies(b: Broker, topic: str, qid: int) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(100_000):  # bounded
        r = await b.pull(topic, qid, len(out), max_messages=1000)
        if r.status != "FOUND":
            break
        out.extend(m.body for m in r.messages)
    return out


async def _demo(root: Path, messages: int, batch: int, body: int) -> dict[str, float]:
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    brokers = {n: Broker(_settings(root, n, ports)) for n in ports}
    figures: dict[str, float] = {}
    try:
        for b in brokers.values():
            await b.start()
        m = await _master(brokers)
        print(f"master: {m.settings.node_id} (term {m.role_term})")
        await m.create_topic("demo", 4)
        t0 = time.monotonic()
        await _produce(m, "demo", messages, batch=batch, body=body, label="produce")
        figures["produce_msgs_per_s"] = messages / (time.monotonic() - t0)
        got = await m.group_pull("readers", "demo", max_messages=1000, auto_commit=True)
        committed = dict(got.next_offsets)
        print(f"group 'readers' consumed {len(got.messages)} and committed {committed}")

        old = m.settings.node_id
        print(f"stopping the master {old} ...")
        t_stop = time.monotonic()
        await brokers.pop(old).stop()
        m = await _master(brokers)
        figures["failover_ms"] = (time.monotonic() - t_stop) * 1000
        print(f"new master: {m.settings.node_id} after {figures['failover_ms']:.0f} ms")
        batch1 = [ProduceMessage(b"session-batch")] * 3
        first = await m.produce("demo", batch1, producer_id="demo-producer", sequence=1)
        retry = await m.produce("demo", batch1, producer_id="demo-producer", sequence=1)
        assert retry == first, "a retried session batch must get the original results"
        print("a retried producer batch was answered with the original results")
        await _produce(m, "demo", messages, batch=batch, body=body, label="produce after failover")
        for q, off in committed.items():
            assert m.meta.committed_offset("readers", "demo", q) == off, "offsets lost"
        print("group offsets survived the failover exactly")

        print(f"restarting {old} ...")
        brokers[old] = Broker(_settings(root, old, ports))
        await brokers[old].start()
        end = m.store.ledger_end_index
        deadline = time.monotonic() + 60
        while any(b.dispatcher.dispatched_index < end for b in brokers.values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{old} did not catch up")
            await asyncio.sleep(0.01)
        total = 0
        for qid in range(4):
            per_node = {n: await _queue_bodies(b, "demo", qid) for n, b in brokers.items()}
            first_node = next(iter(per_node.values()))
            assert all(v == first_node for v in per_node.values()), f"queue {qid} differs"
            total += len(first_node)
        assert total == 2 * messages + 3, f"{total} messages, expected {2 * messages + 3}"
        print(f"all {total} messages in 4 queues are contiguous and identical on 3 nodes")
        figures["messages"] = total
    finally:
        for b in brokers.values():
            await b.stop()
    return figures


def run_demo(
    data_dir: Path | None = None, messages: int = 20_000, batch: int = 100, body: int = 1024
) -> dict[str, float]:
    own = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="ledgermq-demo-")) if data_dir is None else data_dir
    try:
        figures = asyncio.run(_demo(root, messages, batch, body))
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    for k, v in figures.items():
        print(f"{k:>20}: {v:,.0f}")
    return figures


__all__ = ["run_demo"]
