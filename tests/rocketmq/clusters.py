"""The 3-process cluster every official-client module runs against: topics made on the
master first (the nodes run without auto-create, as a RocketMQ cluster would), stopped
and removed after the module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS


@contextmanager
def cluster_with_topics(
    data_dir: Path,
    topics: Mapping[str, int],
    *args: str,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    tls: tuple[Path, Path, Path] | None = None,
) -> Iterator[LocalBrokerCluster]:
    """Three nodes with ``args`` (and ``env``), ``topics`` (name → queues) made, the
    HTTP calls with bearer ``token`` when the nodes have tokens; ``tls``: (CA, chain,
    key), the nodes serving HTTPS and gRPC over TLS."""
    c = LocalBrokerCluster(
        3,
        data_dir / "nodes",
        extra_args=(*CLUSTER_ARGS, "--no-auto-create-topics", *args),
        probe_token=token,
        tls=tls,
    )
    c.env.update(env or {})
    c.start_all()
    try:
        master = c.urls[c.wait_ready(timeout_s=90)]
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        for name, queues in topics.items():
            r = httpx.post(
                f"{master}/v1/topics",
                json={"name": name, "queues": queues},
                headers=headers,
                verify=c.verify,
            )
            assert r.status_code == 201, r.text
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)
