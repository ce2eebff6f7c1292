"""A replica whose copy of a committed message is damaged (issue 17, "a corrupted byte in a
committed entry on one replica is served to consumers unverified"). Before: the node
served the damaged bytes with 200. Now every read checks the entry's CRC: that node
answers ``503 CORRUPT_ENTRY`` (pull, message id, query by key), counts it in
``ledgermq_corrupt_entry_reads_total``, and the client reads the message from another
replica. Three brokers in this process, each with its app; the damage is a bit flipped
in the data file under the running node, as bit rot would."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from broker.broker import Broker, NewMessage
from broker.message import BODY_POS
from ledgermq.client import AsyncAdmin, AsyncConsumer
from tests.broker.harness import SMALL_STORE, BrokerCluster

pytestmark = pytest.mark.asyncio


class _Route(httpx.AsyncBaseTransport):
    """Each node's advertised URL, served by its app in this process."""

    def __init__(self, apps: dict[str, FastAPI]) -> None:
        self._apps = {
            httpx.URL(url).netloc.decode(): httpx.ASGITransport(app=app)
            for url, app in apps.items()
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._apps[request.url.netloc.decode()].handle_async_request(request)


def _flip_body_byte(broker: Broker, commitlog_offset: int) -> None:
    pos = commitlog_offset + BODY_POS + 2  # a byte of the message body
    seg = pos - pos % SMALL_STORE.data_file_size
    fd = os.open(broker.store.dir / "data" / f"{seg:020d}", os.O_RDWR)
    try:
        (byte,) = os.pread(fd, 1, pos - seg)
        os.pwrite(fd, bytes([byte ^ 0x04]), pos - seg)
    finally:
        os.close(fd)


async def test_a_damaged_copy_is_refused_counted_and_read_from_another_replica(
    tmp_path: Path,
) -> None:
    cluster = BrokerCluster(tmp_path, 3)
    await cluster.start_all()
    try:
        master = await cluster.master()
        sent = [NewMessage(body=f"message {i}".encode(), keys=[f"k{i}"]) for i in range(4)]
        # One request each: one record each (a request's batch record is damaged whole).
        results = [(await master.producer.produce("orders", [m]))[0] for m in sent]
        await cluster.converged()
        victim_id = next(n for n, b in cluster.brokers.items() if b is not master)
        victim = cluster.brokers[victim_id]
        apps = {
            b.settings.peer_urls[n]: create_app(b.settings, b) for n, b in cluster.brokers.items()
        }
        url_of = {n: b.settings.peer_urls[n] for n, b in cluster.brokers.items()}
        hit = results[2]
        _flip_body_byte(victim, hit.commitlog_offset)

        async with httpx.AsyncClient(transport=_Route(apps), base_url=url_of[victim_id]) as http:
            pulled = await http.get(
                f"/v1/topics/orders/queues/{hit.queue_id}/messages",
                params={"offset": hit.queue_offset, "max_messages": 1},
            )
            by_id = await http.get(f"/v1/messages/{hit.msg_id}")
            by_key = await http.get("/v1/topics/orders/messages", params={"key": "k2"})
            arrow = await http.get(  # the Arrow pull checks every record of its page too
                f"/v1/topics/orders/queues/{hit.queue_id}/messages",
                params={"offset": 0, "max_messages": 10},
                headers={"Accept": "application/vnd.apache.arrow.stream"},
            )
            for r in (pulled, by_id, by_key, arrow):
                assert r.status_code == 503, r.text
                err = r.json()["error"]
                assert err["code"] == "CORRUPT_ENTRY" and "another replica" in err["message"]
                assert err["node_id"] == victim_id
            metrics = (await http.get("/metrics")).text
            assert "ledgermq_corrupt_entry_reads_total 4.0" in metrics
            # the others' copies are intact, and so are the victim's other messages
            healthy = next(n for n in url_of if n != victim_id)
            r = await http.get(f"{url_of[healthy]}/v1/messages/{hit.msg_id}")
            assert r.status_code == 200 and r.json()["body"] == "message 2"
            r = await http.get(f"/v1/messages/{results[1].msg_id}")
            assert r.status_code == 200 and r.json()["body"] == "message 1"

        # The client asks the victim first, and reads from the next replica at once.
        brokers = [url_of[victim_id], *(u for n, u in url_of.items() if n != victim_id)]
        async with AsyncAdmin(brokers, transport=_Route(apps)) as admin:
            got = await admin.get_message(hit.msg_id)
            assert got.body == b"message 2"
        async with AsyncConsumer(brokers, None, "orders", transport=_Route(apps)) as consumer:
            pr = await consumer.pull(hit.queue_id, hit.queue_offset, max_messages=1)
            assert [m.body for m in pr.messages] == [b"message 2"]
        assert (
            victim.stats["corrupt_reads"] == 6
        )  # 4 refused above, then the client met the damage once per read
    finally:
        await cluster.close()
