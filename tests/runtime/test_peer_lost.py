"""Issue 18: the transport reports a member's connection that ends (``on_peer_lost``), in
both directions, and not a connection it closes itself. Two ``Transport``\\ s on
127.0.0.1 exchange heartbeats; then one of them goes away."""

from __future__ import annotations

import pytest

from dledger.core.messages import PEER_MESSAGE_TYPES, HeartBeatRequest
from dledger.runtime.transport import Transport
from dledger.runtime.wire import WireMessage
from ledgermq.processes import free_ports
from tests.waiting import until

pytestmark = pytest.mark.asyncio


def _transport(me: str, peers: dict[str, str], got: list[str], lost: list[str]) -> Transport:
    async def no_client(_m: WireMessage) -> None:
        return None

    return Transport(
        me,
        peers,
        group="g0",
        on_peer_message=lambda m: got.append(m.local_id),
        on_client_request=no_client,
        is_peer_message=lambda m: isinstance(m, PEER_MESSAGE_TYPES),
        on_peer_lost=lost.append,
    )


def _beat(src: str, dst: str) -> HeartBeatRequest:
    return HeartBeatRequest(
        group="g0", local_id=src, remote_id=dst, term=1, req_id=1, leader_id=src
    )


async def test_a_peer_that_goes_away_is_reported_and_our_own_close_is_not() -> None:
    ports = free_ports(2)
    peers = {"a": f"127.0.0.1:{ports[0]}", "b": f"127.0.0.1:{ports[1]}"}
    got_a: list[str] = []
    got_b: list[str] = []
    lost_a: list[str] = []
    lost_b: list[str] = []
    a = _transport("a", peers, got_a, lost_a)
    b = _transport("b", peers, got_b, lost_b)
    await a.start()
    await b.start()
    try:
        # Both directions carry a member's frame: each side knows the other's connection.
        a.send(_beat("a", "b"))
        b.send(_beat("b", "a"))
        await until(lambda: got_a and got_b, what="heartbeats both ways")
        lost_a.clear()  # refused connects while the other was starting
        await b.close()  # b goes away: its sockets close
        # a sees b's connection to it end (EOF) and its own to b end (the watcher)
        await until(lambda: lost_a.count("b") >= 2, what="a reports b twice")
        assert set(lost_a) == {"b"}
    finally:
        lost_before = len(lost_a)
        await a.close()
        await b.close()
    assert len(lost_a) == lost_before  # closing a reported nothing more
