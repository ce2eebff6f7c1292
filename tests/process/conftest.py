"""Fixtures of the ``process`` tier: LedgerMQ node processes on 127.0.0.1.

- ``cluster3``: three ``python -m ledgermq`` processes, shared by a module's tests that
  do not kill nodes;
- ``fresh_cluster3``: one per test, for those that do.

A single ``ledgermq broker`` process with a test's own options is ``node_process``
(``tests/process/nodeproc.py``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS


def _start_cluster(data_dir: Path) -> LocalBrokerCluster:
    c = LocalBrokerCluster(3, data_dir, extra_args=CLUSTER_ARGS)
    c.start_all()
    try:
        c.wait_ready(timeout_s=90)
    except BaseException:
        c.stop_all()
        raise
    return c


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    data_dir = tmp_path_factory.mktemp("cluster3")
    c = _start_cluster(data_dir)
    try:
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def fresh_cluster3(tmp_path: Path) -> Iterator[LocalBrokerCluster]:
    c = _start_cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop_all()
