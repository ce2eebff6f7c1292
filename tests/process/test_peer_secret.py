"""``--peer-secret`` on a local cluster of ``python -m dledger`` processes
(docs/operations.md): the group commits with the secret, which the nodes get from their
environment and not from their command lines (``ps`` does not show it), and a client
without it is refused. The handshake and in-process groups are
``tests/runtime/test_peer_secret.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.codes import DLedgerCode
from dledger.runtime.client import DLedgerClient
from dledger.runtime.peer_auth import PeerAuthError
from ledgermq.processes import LocalCluster

SECRET = b"correct horse battery staple"


@pytest.mark.asyncio
async def test_a_local_cluster_of_processes_gets_the_secret_out_of_ps(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path, peer_secret=SECRET) as cl:
        cl.start_all()
        async with cl.client() as client:
            await cl.wait_for_leader(client, 30)
            r = await client.append([b"over the wire"], timeout_s=20)
            assert r.code is DLedgerCode.SUCCESS
            st = await cl.wait_for(
                client,
                lambda st: (
                    len(st) == 3 and all(s["committed_index"] >= r.first_index for s in st.values())
                ),
                20,
            )
            assert all(s["refused"]["auth_failures"] == 0 for s in st.values())
            # All three up and serving (so /proc is complete): the command lines do not show the
            # secret, the environments hold it.
            for node in cl.ids:
                proc = Path(f"/proc/{cl.procs[node].pid}")
                assert b"--data-dir" in (proc / "cmdline").read_bytes()
                assert SECRET not in (proc / "cmdline").read_bytes()
                assert b"LEDGERMQ_PEER_SECRET=" + SECRET in (proc / "environ").read_bytes()
        async with DLedgerClient(cl.peers, cl.group) as outsider:
            with pytest.raises(PeerAuthError):
                await outsider.status("n0")
