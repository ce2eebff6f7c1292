"""The systems under test, each with three replicas on 127.0.0.1 (the floor: one process).

Every system says how it starts and stops, which processes are its own (their CPU is
reported), and hands the load generator a spec per scenario (``produce_spec``,
``fill_spec``, ``consume_spec``, ``pop_fill_spec``, ``pop_spec``; None: not measured).
The failover and restart hooks are in ``failover`` and ``recovery``.

- ``LedgerMQ``: ``ledgermq.local_cluster.LocalBrokerCluster`` (three ``python -m ledgermq``), with
  ``--flush sync`` or ``--flush async``; topics ``bench`` (produce), ``catchup`` (the
  consume catch-up), ``pop`` (shared consumption, the POP group ``popbench``) and ``fo``
  (failover), 8 queues each. Clients talk to the master.
- ``Nats``: three ``nats-server`` with JetStream in one cluster (routes on 127.0.0.1),
  file-backed R3 streams ``BENCH`` (``bench.>``), ``CATCHUP``, ``POP`` (its durable pull
  consumer made by the load generator) and ``FO``; nats-py.
- ``Etcd``: three ``etcd`` members; 1 KiB values through the HTTP/JSON gateway
  (``/v3/kv/put``, ``/v3/kv/txn`` for a batch), sent to the leader's gateway.
- ``PySyncObj``: three ``bench/pysyncobj_baseline.py node`` processes (raw Raft appends).
- ``Floor``: ``bench/http_floor.py``, a bare FastAPI endpoint: the HTTP floor.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from http_bench import FLOOR_SCRIPT

from ledgermq.local_cluster import LocalBrokerCluster
from ledgermq.processes import free_ports

from . import procs
from .loadgen import nats_connect

HOST = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent.parent
QUEUES = 8
POP_GROUP = "popbench"
# Each system's durability, as the report states it next to the figures.
DURABILITY = {
    "ledgermq-sync": "fdatasync on every node before it acknowledges (flush=sync)",
    "ledgermq-async": "page cache; a background thread syncs every 10 ms (flush=async)",
    "nats": "JetStream file store, synced asynchronously (NATS 2.9 default)",
    "etcd": "WAL fsync'ed per Raft commit (batched) on every member",
    "pysyncobj": "page cache only (its mmap journal is never fsync'ed)",
    "floor": "none: the endpoint stores nothing",
}
LABELS = {
    "ledgermq-sync": "LedgerMQ sync",
    "ledgermq-async": "LedgerMQ async",
    "nats": "NATS JetStream R3",
    "etcd": "etcd",
    "pysyncobj": "pysyncobj",
    "floor": "HTTP floor",
}


def _get(url: str, timeout_s: float = 1.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return None


def _post(url: str, body: Any, timeout_s: float = 2.0) -> httpx.Response | None:
    try:
        return httpx.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError:
        return None


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (allocated blocks)."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_blocks * 512
        except OSError:
            pass
    return total


class System:
    key = ""
    replicas = 3

    def __init__(self, root: Path, a: Any) -> None:
        self.root = root / self.key
        self.root.mkdir(parents=True, exist_ok=True)
        self.a = a

    @property
    def label(self) -> str:
        return LABELS[self.key]

    @property
    def durability(self) -> str:
        return DURABILITY[self.key]

    def base_spec(self, **kw: Any) -> dict[str, Any]:
        a = self.a
        spec = {
            "host": HOST,
            "body_size": a.body_size,
            "pool": a.pool,
            "queues": QUEUES,
            "seconds": a.seconds,
            "warmup": a.warmup,
            "client": "raw",
            "request_timeout": a.request_timeout,
        }
        spec.update(kw)
        return spec

    def catchup_fill(self, produce: dict[str, Any], n: int, **kw: Any) -> dict[str, Any]:
        """``produce`` (a produce spec at the fill's batch and clients) as the catch-up
        fill: ``n`` messages, no warm-up, bounded by ``fill_timeout``."""
        produce.update(kw, max_messages=n, warmup=0.0, seconds=self.a.fill_timeout)
        return produce

    def catchup_read(self, **kw: Any) -> dict[str, Any]:
        """The catch-up read: ``consume_batch`` per request, a client per queue, no
        warm-up, bounded by ``fill_timeout``."""
        return self.base_spec(
            batch=self.a.consume_batch,
            clients=QUEUES,
            warmup=0.0,
            seconds=self.a.fill_timeout,
            **kw,
        )

    # overridden below
    def start(self) -> None: ...
    def wait_ready(self) -> None: ...
    def stop(self) -> None: ...
    def check_alive(self) -> None: ...
    def pids(self) -> dict[str, int]:
        return {}

    def produce_spec(self, batch: int, clients: int) -> dict[str, Any] | None:
        return None

    def fill_spec(self, n: int) -> dict[str, Any] | None:
        return None

    def consume_spec(self) -> dict[str, Any] | None:
        return None

    def pop_fill_spec(self, n: int) -> dict[str, Any] | None:
        return None

    def pop_spec(self) -> dict[str, Any] | None:
        return None

    def pop_read(self, **kw: Any) -> dict[str, Any]:
        """The POP drain: ``pop_clients`` consumers, ``pop_batch`` per receive, no
        warm-up, bounded by ``fill_timeout``."""
        a = self.a
        return self.base_spec(
            batch=a.pop_batch,
            clients=a.pop_clients,
            invisible_ms=a.pop_invisible_ms,
            wait_ms=a.pop_wait_ms,
            warmup=0.0,
            seconds=a.fill_timeout,
            **kw,
        )

    def data_bytes(self) -> int:
        """Bytes on disk of one replica (the first)."""
        return 0


# ---- LedgerMQ ------------------------------------------------------------------------------


class LedgerMQ(System):
    def __init__(self, root: Path, a: Any, flush: str) -> None:
        self.key = f"ledgermq-{flush}"
        super().__init__(root, a)
        self.flush = flush
        extra = ["--flush", flush, "--data-file-mb", str(a.data_file_mb)]
        self.cluster = LocalBrokerCluster(
            3, self.root / "data", extra_args=extra, log_dir=self.root
        )

    def start(self) -> None:
        self.cluster.start_all()

    def wait_ready(self) -> None:
        master = self.cluster.wait_ready(timeout_s=self.a.timeout)
        for topic in ("bench", "catchup", "pop", "fo"):
            r = httpx.post(
                self.cluster.urls[master] + "/v1/topics",
                json={"name": topic, "queues": QUEUES},
                timeout=self.a.timeout,
            )
            if r.status_code not in (200, 201, 409):
                raise RuntimeError(f"{self.key}: creating {topic}: {r.status_code} {r.text}")

    def stop(self) -> None:
        self.cluster.stop_all()

    def check_alive(self) -> None:
        for n in self.cluster.ids:
            if not self.cluster.alive(n):
                raise RuntimeError(f"{self.key} {n} exited:\n" + self.cluster.log_tail(n, 20))

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.cluster.procs.items() if p.poll() is None}

    def master(self) -> str:
        return self.cluster.master() or self.cluster.wait_ready(timeout_s=self.a.timeout)

    def master_port(self) -> int:
        return self.cluster.http_ports[self.cluster.ids.index(self.master())]

    def produce_spec(
        self, batch: int, clients: int, topic: str = "bench", records: bool = False
    ) -> dict[str, Any]:
        """A produce of JSON bodies, or with ``records`` of the record format (docs/
        http.md), answered in runs as the Python client asks."""
        return self.base_spec(
            kind="http",
            body="ledgermq-records" if records else "ledgermq",
            path=f"/v1/topics/{topic}/messages" + ("?results=runs" if records else ""),
            ports=[self.master_port()],
            batch=batch,
            clients=clients,
        )

    def fill_spec(self, n: int) -> dict[str, Any]:
        return self.catchup_fill(
            self.produce_spec(self.a.fill_batch, self.a.fill_clients, "catchup"), n
        )

    def wait_dispatched(self, node: str) -> None:
        master = self.master()
        target = (self.cluster.cluster_info(master) or {}).get("committed_index", 0)
        procs.wait_until(
            lambda: (self.cluster.cluster_info(node) or {}).get("dispatched_index", -1) >= target,
            self.a.timeout,
            f"{self.key} {node} dispatches up to {target}",
            0.1,
        )

    def consume_spec(self, records: bool = False) -> dict[str, Any]:
        """The catch-up read; ``records``: as record pages (issue 31), not JSON."""
        master = self.master()
        self.wait_dispatched(master)
        return self.catchup_read(
            kind="pull", port=self.master_port(), topic="catchup", records=records
        )

    def pop_fill_spec(self, n: int) -> dict[str, Any]:
        return self.catchup_fill(
            self.produce_spec(self.a.fill_batch, self.a.fill_clients, "pop"), n
        )

    def pop_spec(self) -> dict[str, Any]:
        """The drain of topic ``pop`` by the POP group ``popbench`` (from the earliest
        message); its target: the messages of the topic."""
        master = self.master()
        url = self.cluster.urls[master]
        r = httpx.put(
            url + f"/v1/groups/{POP_GROUP}",
            json={"mode": "pop", "start": "earliest"},
            timeout=self.a.timeout,
        )
        if r.status_code != 200:
            raise RuntimeError(f"{self.key}: POP group: {r.status_code} {r.text}")
        self.wait_dispatched(master)
        r = httpx.get(url + "/v1/topics/pop", timeout=self.a.timeout)
        r.raise_for_status()
        backlog = sum(q["max_offset"] - q["min_offset"] for q in r.json()["queues"])
        return self.pop_read(
            kind="pop",
            port=self.master_port(),
            topic="pop",
            group=POP_GROUP,
            pop_messages=backlog,
            master=master,
        )

    def data_bytes(self) -> int:
        return du(self.root / "data" / "n0")


# ---- the HTTP floor ------------------------------------------------------------------------


class Floor(System):
    key = "floor"
    replicas = 1

    def __init__(self, root: Path, a: Any) -> None:
        super().__init__(root, a)
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, str(FLOOR_SCRIPT), "--port", str(self.port), "--exit-with-parent"]
        self.proc = procs.spawn(cmd, self.root / "floor.log")

    def wait_ready(self) -> None:
        def up() -> bool:
            self.check_alive()
            r = _get(f"http://{HOST}:{self.port}/healthz")
            return r is not None and r.status_code == 200

        procs.wait_until(up, self.a.timeout, "the floor app starts", 0.1)

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the floor app exited (see {self.root / 'floor.log'})")

    def pids(self) -> dict[str, int]:
        return {"floor": self.proc.pid} if self.proc is not None else {}

    def produce_spec(self, batch: int, clients: int) -> dict[str, Any]:
        return self.base_spec(
            kind="http", body="echo", path="/echo", ports=[self.port], batch=batch, clients=clients
        )

    def blob_spec(self, size: int, msgs_per_answer: int) -> dict[str, Any]:
        """``GET /blob`` of a pull answer's size from as many readers; each answer counts
        as the messages a pull answer of that size carried."""
        return self.base_spec(
            kind="blob",
            port=self.port,
            path=f"/blob?size={max(2, size)}",
            batch=msgs_per_answer,
            clients=QUEUES,
            warmup=0.0,
            seconds=min(self.a.seconds, 10.0),
        )


# ---- NATS JetStream ------------------------------------------------------------------------

STREAMS = {"BENCH": "bench", "CATCHUP": "catchup", "POP": "pop", "FO": "fo"}


class Nats(System):
    key = "nats"

    def __init__(self, root: Path, a: Any) -> None:
        super().__init__(root, a)
        ports = free_ports(9)
        self.client_ports, self.http_ports, route_ports = ports[:3], ports[3:6], ports[6:]
        routes = ", ".join(f"nats-route://{HOST}:{p}" for p in route_ports)
        commands = []
        for i in range(3):
            conf = self.root / f"n{i}.conf"
            conf.write_text(
                f"server_name: n{i}\n"
                f"listen: {HOST}:{self.client_ports[i]}\n"
                f"http: {HOST}:{self.http_ports[i]}\n"
                f'jetstream {{ store_dir: "{self.root / f"n{i}"}" }}\n'
                f"cluster {{ name: bench, listen: {HOST}:{route_ports[i]}, routes: [{routes}] }}\n"
            )
            commands.append([shutil.which("nats-server") or "nats-server", "-c", str(conf)])
        self.group = procs.Group("nats", self.root, commands)
        self.servers = [f"nats://{HOST}:{p}" for p in self.client_ports]

    def start(self) -> None:
        self.group.start_all()

    def healthy(self, i: int) -> bool:
        r = _get(f"http://{HOST}:{self.http_ports[i]}/healthz")
        return r is not None and r.status_code == 200

    def wait_ready(self) -> None:
        def up() -> bool:
            self.check_alive()
            return all(self.healthy(i) for i in range(3))

        procs.wait_until(up, self.a.timeout, "nats-server x3 healthy", 0.1)
        asyncio.run(self._add_streams())

    async def _add_streams(self) -> None:
        from nats.js.api import StorageType  # noqa: PLC0415

        nc = await nats_connect(self.servers, connect_timeout=2)
        try:
            js = nc.jetstream(timeout=5)
            deadline = time.monotonic() + self.a.timeout
            for name, subject in STREAMS.items():
                while True:  # the meta leader may not be elected yet
                    try:
                        await js.add_stream(
                            name=name,
                            subjects=[f"{subject}.>"],
                            storage=StorageType.FILE,
                            num_replicas=3,
                        )
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def stop(self) -> None:
        self.group.stop_all()

    def check_alive(self) -> None:
        self.group.check_alive()

    def pids(self) -> dict[str, int]:
        return self.group.pids()

    def produce_spec(self, batch: int, clients: int) -> dict[str, Any]:
        return self.base_spec(
            kind="nats", servers=self.servers, subject="bench", batch=batch, clients=clients
        )

    def fill_spec(self, n: int) -> dict[str, Any]:
        spec = self.produce_spec(self.a.fill_batch, self.a.fill_clients)
        return self.catchup_fill(spec, n, subject="catchup")

    def consume_spec(self) -> dict[str, Any]:
        return self.catchup_read(
            kind="nats_fetch", servers=self.servers, stream="CATCHUP", subject="catchup"
        )

    def pop_fill_spec(self, n: int) -> dict[str, Any]:
        spec = self.produce_spec(self.a.fill_batch, self.a.fill_clients)
        return self.catchup_fill(spec, n, subject="pop")

    def pop_spec(self) -> dict[str, Any]:
        return self.pop_read(
            kind="nats_pop", servers=self.servers, stream="POP", nats_ack=self.a.nats_ack
        )

    def data_bytes(self) -> int:
        return du(self.root / "n0")


# ---- etcd ----------------------------------------------------------------------------------


class Etcd(System):
    key = "etcd"

    def __init__(self, root: Path, a: Any) -> None:
        super().__init__(root, a)
        ports = free_ports(6)
        self.client_ports, peer_ports = ports[:3], ports[3:]
        cluster = ",".join(f"e{i}=http://{HOST}:{p}" for i, p in enumerate(peer_ports))
        commands = []
        for i in range(3):
            client, peer = f"http://{HOST}:{self.client_ports[i]}", f"http://{HOST}:{peer_ports[i]}"
            commands.append(
                [
                    shutil.which("etcd") or "etcd",
                    "--name", f"e{i}",
                    "--data-dir", str(self.root / f"e{i}"),
                    "--listen-client-urls", client,
                    "--advertise-client-urls", client,
                    "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", cluster,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", "bench",
                    "--quota-backend-bytes", str(8 << 30),
                    "--max-txn-ops", "1000",
                    "--logger", "zap",
                    "--log-level", "error",
                ]
            )  # fmt: skip
        self.group = procs.Group("etcd", self.root, commands)
        self.urls = [f"http://{HOST}:{p}" for p in self.client_ports]

    def start(self) -> None:
        self.group.start_all()

    def healthy(self, i: int) -> bool:
        r = _get(self.urls[i] + "/health")
        return r is not None and r.status_code == 200 and r.json().get("health") == "true"

    def wait_ready(self) -> None:
        def up() -> bool:
            self.check_alive()
            return all(self.healthy(i) for i in range(3))

        procs.wait_until(up, self.a.timeout, "etcd x3 healthy", 0.1)

    def status(self, i: int) -> dict[str, Any] | None:
        r = _post(self.urls[i] + "/v3/maintenance/status", {}, 1.0)
        return r.json() if r is not None and r.status_code == 200 else None

    def leader(self) -> int | None:
        """The index of the member every answering member names as leader."""
        ids: dict[str, int] = {}
        leaders = set()
        for i in range(3):
            if not self.group.alive(i):
                continue
            st = self.status(i)
            if st is not None:
                ids[st["header"]["member_id"]] = i
                leaders.add(st.get("leader"))
        if len(leaders) == 1:
            return ids.get(leaders.pop())
        return None

    def stop(self) -> None:
        self.group.stop_all()

    def check_alive(self) -> None:
        self.group.check_alive()

    def pids(self) -> dict[str, int]:
        return self.group.pids()

    def produce_spec(self, batch: int, clients: int) -> dict[str, Any]:
        return self.base_spec(
            kind="http",
            body="etcd",
            path="",
            key_prefix="p/",
            queues=1,
            ports=[self._leader_port()],
            batch=batch,
            clients=clients,
        )

    def _leader_port(self) -> int:
        i = procs.wait_until(self.leader_or_zero, self.a.timeout, "etcd leader")
        assert isinstance(i, int)
        return self.client_ports[i - 1]

    def leader_or_zero(self) -> int:
        """1 + the leader's index, 0 if there is none (for ``wait_until``)."""
        i = self.leader()
        return 0 if i is None else i + 1

    def fill_spec(self, n: int) -> dict[str, Any]:
        spec = self.produce_spec(self.a.fill_batch, self.a.fill_clients)
        return self.catchup_fill(spec, n, key_prefix="c/", queues=QUEUES)

    def consume_spec(self) -> dict[str, Any]:
        return self.catchup_read(kind="etcd_range", ports=[self._leader_port()], key_prefix="c/")

    def data_bytes(self) -> int:
        return du(self.root / "e0")


# ---- pysyncobj -----------------------------------------------------------------------------


class PySyncObj(System):
    key = "pysyncobj"

    def __init__(self, root: Path, a: Any) -> None:
        super().__init__(root, a)
        ports = free_ports(6)
        self.raft = [f"{HOST}:{p}" for p in ports[:3]]
        self.control = ports[3:]
        script = str(BENCH_DIR / "pysyncobj_baseline.py")
        commands = []
        for i in range(3):
            partners = ",".join(r for k, r in enumerate(self.raft) if k != i)
            commands.append(
                [
                    sys.executable, script, "node",
                    "--self", self.raft[i],
                    "--partners", partners,
                    "--control-port", str(self.control[i]),
                    "--journal-dir", str(self.root / f"p{i}"),
                ]
            )  # fmt: skip
        self.group = procs.Group("pso", self.root, commands)

    def start(self) -> None:
        self.group.start_all()

    def statuses(self) -> list[dict[str, Any] | None]:
        import pysyncobj_baseline as psb  # noqa: PLC0415

        async def all_() -> list[dict[str, Any] | None]:
            return list(await asyncio.gather(*(psb.query_status(p) for p in self.control)))

        return asyncio.run(all_())

    def leader(self) -> int | None:
        for i, st in enumerate(self.statuses()):
            if st is not None and st["is_leader"] and st["is_ready"] and self.group.alive(i):
                return i
        return None

    def wait_ready(self) -> None:
        def up() -> bool:
            self.check_alive()
            return self.leader() is not None

        procs.wait_until(up, self.a.timeout, "pysyncobj leader", 0.2)

    def stop(self) -> None:
        self.group.stop_all()

    def check_alive(self) -> None:
        self.group.check_alive()

    def pids(self) -> dict[str, int]:
        return self.group.pids()

    def produce_spec(self, batch: int, clients: int) -> dict[str, Any]:
        return self.base_spec(
            kind="pysyncobj", raft=self.raft, control=self.control, batch=batch, clients=clients
        )

    def data_bytes(self) -> int:
        return du(self.root / "p0")


def make_systems(root: Path, a: Any) -> dict[str, System]:
    """The systems of this run, by key, in the order the runs alternate."""
    out: dict[str, System] = {}
    for flush in a.flush:
        s = LedgerMQ(root, a, flush)
        out[s.key] = s
    makers = {"nats": Nats, "etcd": Etcd, "pysyncobj": PySyncObj, "floor": Floor}
    for p in a.peers:
        out[p] = makers[p](root, a)
    return out
