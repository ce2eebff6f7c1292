"""Fixtures of the ``process`` tier: LedgerMQ node processes on 127.0.0.1.

- ``cluster3``: three ``python -m ledgermq`` processes, shared by a module's tests that
  do not kill nodes;
- ``fresh_cluster3``: one per test, for those that do (``start_cluster``: the same with a
  test's own node options).

A single ``ledgermq broker`` process with a test's own options is ``node_process``
(``tests/process/nodeproc.py``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS


def start_cluster(data_dir: Path, extra_args: Sequence[str] = CLUSTER_ARGS) -> LocalBrokerCluster:
    """Three node processes with ``extra_args``, started and waited for (a master)."""
    c = LocalBrokerCluster(3, data_dir, extra_args=extra_args)
    c.start_all()
    try:
        c.wait_ready(c.ids, timeout_s=90)  # every node: one that exited is an error
    except BaseException:
        c.stop_all()
        raise
    return c


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    data_dir = tmp_path_factory.mktemp("cluster3")
    c = start_cluster(data_dir)
    try:
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def fresh_cluster3(tmp_path: Path) -> Iterator[LocalBrokerCluster]:
    c = start_cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop_all()
