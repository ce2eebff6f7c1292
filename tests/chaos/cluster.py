"""The chaos cluster: three real ``ledgermq broker`` processes (``python -m ledgermq``),
each in a network namespace of its own (``tests.netns``), each on a small tmpfs of its
own (``tests.smallfs``), so that every fault is a real one: a SIGKILL, a SIGSTOP, a
link down or a cut between two hosts, a full disk.

It is ``LocalBrokerCluster`` (``ledgermq/local_cluster.py``: commands, probes, readiness) with
three changes: a node's command runs inside its namespace (``ip netns exec``), every
node listens on its own address with the same ports (each namespace has its own), and
its data directory is a mount point. The test process reaches every node through the
lab's cable to the root namespace.

Cleanup never leaks (``close``, also on failure): the processes (SIGCONT first, so a
stopped one can die), the mounts, the namespaces. Once closing, no node starts again
(a thread the run left behind may still try: ``start`` refuses). ``kill_all`` is the
quick way out of a run that stopped early: nothing needs to be synced. Root only:
``available()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from ledgermq.local_cluster import LocalBrokerCluster
from tests import netns
from tests.smallfs import Ballast, MiB, can_mount, small_fs

from .tx_workload import NODE_ARGS as TX_ARGS

HTTP_PORT = 8080
RAFT_PORT = 9080
# Per node. A node preallocates ~40 MiB (consume-queue segments, the key index, the
# first commitlog segment of 8 MiB) and keeps RESERVE_MB free: with 96 MiB a 5-minute run
# filled it for real (DISK_FULL to every produce, as it should); 256 MiB holds a 20-minute
# run. tmpfs takes memory only for what is written.
FS_BYTES = 256 * MiB
RESERVE_MB = 24  # writes are refused (507 DISK_FULL) with less free than this
# The transactions' check schedule is short (tests/chaos/tx_workload.py): checks and
# their expiry happen within the run.
ARGS = ("--data-file-mb", "8", "--disk-reserve-mb", str(RESERVE_MB), "--log-level", "INFO",
        *TX_ARGS)  # fmt: skip


def available() -> bool:
    return netns.available() and can_mount()


class ChaosCluster(LocalBrokerCluster):
    """Three nodes n0..n2 in ``lab`` (started here); data under ``root/<node>``, each a
    tmpfs of ``FS_BYTES``; logs in ``log_dir``."""

    def __init__(self, root: Path, log_dir: Path) -> None:
        self.lab = netns.NetLab()
        for i in range(3):
            self.lab.add_host(f"n{i}")
        self._stack = contextlib.ExitStack()
        super().__init__(
            3,
            root,
            http_ports=[HTTP_PORT] * 3,
            raft_ports=[RAFT_PORT] * 3,
            extra_args=ARGS,
            log_dir=log_dir,
        )
        self.paused: set[str] = set()
        self.closing = False

    def open(self) -> None:
        """Namespaces, mounts, then every node; on failure everything is undone."""
        try:
            self._stack.callback(self.lab.close)
            self._not_closing()
            self.lab.start()
            self._address_nodes()
            self._not_closing()
            self.fs = {
                n: self._stack.enter_context(small_fs(self.data_dir / n, FS_BYTES))
                for n in self.ids
            }
            self._stack.callback(self._stop_everything)
            self.start_all()
        except BaseException:
            self.close()
            raise

    def _not_closing(self) -> None:
        """An ``open`` the run stopped waiting for creates nothing more."""
        if self.closing:
            raise RuntimeError("the cluster is closing")

    def _address_nodes(self) -> None:
        """URLs and the peer list on the lab's addresses (known once it started)."""
        addr = self.lab.address
        self.urls = {n: f"http://{addr(n)}:{HTTP_PORT}" for n in self.ids}
        self.peer_spec = ";".join(f"{n}-{addr(n)}:{RAFT_PORT}" for n in self.ids)
        self.peer_urls = ",".join(f"{n}={u}" for n, u in self.urls.items())

    def command(self, node: str) -> list[str]:
        return self.lab.exec_prefix(node) + super().command(node)

    def start(self, node: str) -> None:
        if self.closing:
            raise RuntimeError(f"{node} not started: the cluster is closing")
        super().start(node)

    # ---- faults ---------------------------------------------------------------------------

    def pause(self, node: str) -> None:
        os.kill(self.procs[node].pid, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: str) -> None:
        if self.alive(node):
            os.kill(self.procs[node].pid, signal.SIGCONT)
        self.paused.discard(node)

    def ballast(self, node: str) -> Ballast:
        return Ballast(self.fs[node])

    def heal_network(self) -> None:
        """Every link up, every cut healed (idempotent)."""
        for n in self.ids:
            self.lab.link_up(n)
            for m in self.ids:
                if m > n:
                    self.lab.heal(n, m)

    # ---- cleanup --------------------------------------------------------------------------

    def _stop_everything(self) -> None:
        for n in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                self.resume(n)
        self.stop_all(timeout_s=10)

    def kill_all(self) -> None:
        """SIGKILL to every node (a stopped one dies too), and no node starts again."""
        self.closing = True
        for n in self.ids:
            if self.alive(n):
                with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                    self.kill(n)

    def close(self) -> None:
        """Processes, mounts, namespaces, in that order; idempotent."""
        self.closing = True
        self._stack.close()

    def __enter__(self) -> ChaosCluster:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
