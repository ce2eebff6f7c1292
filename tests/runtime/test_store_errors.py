"""A node's store failing under a real group (issue 17). A follower whose disk fails
("a store OSError during a follower append is swallowed without a log line") refuses the
push with DISK_ERROR and says so at WARNING, the leader backs off and says so too, the
other two commit without it, and once the disk works the follower catches up by itself.
A node that fails answers whoever waits for a commit; a node that lost its ``currterm``
does not start. In-process ``DLedgerServer`` groups on 127.0.0.1, bounded waits."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from dledger.runtime import server as server_module
from dledger.runtime.server import AppendOutcomeUnknownError, DLedgerServer
from dledger.store import StoreCorruptionError

from .test_peer_secret import _group, _until, _wait_leader


@pytest.mark.asyncio
async def test_a_follower_append_that_fails_on_disk_is_refused_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dledger.runtime.server")
    async with _group(tmp_path, [None, None, None]) as servers:
        lead = await _wait_leader(servers)
        sick: DLedgerServer = next(s for s in servers.values() if s is not lead)
        assert sick.store is not None
        data = sick.store._data
        failures = [0]

        def failing_write(chunk: bytes | bytearray | memoryview) -> None:
            failures[0] += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(data, "write_at_end", failing_write)
        [(index, _pos)] = await asyncio.wait_for(lead.append([b"committed without it"]), 20)
        await _until(lambda: failures[0] > 0, what="the sick follower tried to write")
        assert sick.committed_index < index
        assert all(s.failed is None for s in servers.values())
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        sick_id = sick.config.self_id
        assert any("append_storage_error" in m and "DISK_ERROR" in m for m in lines), lines
        assert any("peer_storage_refused" in m and sick_id in m for m in lines), lines
        monkeypatch.undo()  # the disk works again: the follower catches up by itself
        await _until(lambda: sick.committed_index >= index, 30, "the follower caught up")
        assert sick.store.get(index).body == b"committed without it"


@pytest.mark.asyncio
async def test_a_proposal_waiting_when_the_node_fails_is_answered_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, "every wait is bounded": the ready task dies with a proposal waiting.
    Before: no Ready was ever handled again, and the append waited forever (a produce
    request hung until the process exited, or for good in-process)."""
    async with _group(tmp_path, [None]) as servers:
        node = await _wait_leader(servers)

        def broken(*args: object, **kw: object) -> None:
            raise RuntimeError("a bug in the persist step")

        monkeypatch.setattr(server_module, "persist_ready", broken)
        fut = node.append_nowait([b"never committed here"])
        with pytest.raises(AppendOutcomeUnknownError, match="node failed"):
            async with asyncio.timeout(20):
                await fut
        assert isinstance(node.failed, RuntimeError)


@pytest.mark.asyncio
async def test_a_node_whose_currterm_is_lost_does_not_start(tmp_path: Path) -> None:
    """Before: it started at term 0 with no vote (free to vote twice in a term)."""
    async with _group(tmp_path, [None]) as servers:
        node = await _wait_leader(servers)
        await asyncio.wait_for(node.append([b"x"]), 20)
        config = node.config
    (config.store_dir / "currterm").unlink()
    again = DLedgerServer(config)
    with pytest.raises(StoreCorruptionError, match="currterm is missing"):
        await again.start()
    await again.stop()
