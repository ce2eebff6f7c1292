"""Three real node processes on 127.0.0.1: kill -9 the leader, a new leader commits,
nothing acknowledged is lost, the killed node restarts and catches up, and the data
files end byte-identical."""

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

import pytest

from dledger.store import node_dir
from ledgermq.processes import LocalCluster

pytestmark = pytest.mark.asyncio


def _converged(st: dict[str, dict[str, Any]]) -> bool:
    if len(st) != 3:
        return False
    ends = {s["ledger_end_index"] for s in st.values()}
    return (
        len(ends) == 1
        and all(s["committed_index"] == s["ledger_end_index"] for s in st.values())
        and sum(s["role"] == "LEADER" for s in st.values()) == 1
    )


async def _append_batches(cluster_client: Any, tag: str, n: int, acked: dict[int, bytes]) -> None:
    for k in range(n):
        bodies = [f"{tag}-{k}-{j}".encode() * 8 for j in range(4)]
        resp = await cluster_client.append(bodies, timeout_s=30)
        for j, body in enumerate(bodies):
            acked[resp.first_index + j] = body


async def test_kill_9_leader_then_new_leader_commits_and_old_one_catches_up(
    tmp_path: Path,
) -> None:
    with LocalCluster(3, tmp_path, extra_args=("--data-file-mib", "4")) as cl:
        cl.start_all()
        async with cl.client() as c:
            first = await cl.wait_for_leader(c, timeout_s=30)
            acked: dict[int, bytes] = {}
            await _append_batches(c, "before", 40, acked)

            cl.kill(first)  # SIGKILL: no flush, no goodbye
            await _append_batches(c, "after", 40, acked)
            second = await cl.wait_for_leader(c, timeout_s=30)
            assert second != first

            cl.start(first)
            st = await cl.wait_for(c, _converged, timeout_s=60)
            assert st[first]["role"] == "FOLLOWER"
            end = st[second]["ledger_end_index"]
            assert end >= max(acked)
            for node in cl.ids:
                got: dict[int, bytes] = {}
                index = 0
                while index <= end:
                    entries = await c.get(node, index, max_count=500)
                    got.update((e.index, e.body) for e in entries)
                    index = entries[-1].index + 1
                missing = {i for i, body in acked.items() if got.get(i) != body}
                assert not missing, f"{node} lost acknowledged entries {sorted(missing)[:10]}"
        cl.stop_all()  # graceful: every node syncs and closes its files

    dirs = [node_dir(tmp_path, "g0", n) / "data" for n in cl.ids]
    names = [sorted(p.name for p in d.iterdir()) for d in dirs]
    assert names[0] == names[1] == names[2]
    for name in names[0]:
        for d in dirs[1:]:
            assert filecmp.cmp(dirs[0] / name, d / name, shallow=False), f"{d / name} differs"
