"""Fixtures of the cluster tests: one real ZooKeeper for the session, a fresh chroot per
test (tests share the server without seeing each other's nodes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lakelog.zookeeper import ZooKeeperMissing, ZooKeeperServer
from tests.cluster.brokers import fresh_chroot


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the run; a missing install fails (CI installs it)."""
    try:
        zk = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    except ZooKeeperMissing as exc:
        pytest.fail(f"{exc} (.ci/run installs it)", pytrace=False)
    yield zk
    zk.stop()


@pytest.fixture
def chroot(zookeeper: ZooKeeperServer) -> Iterator[str]:
    """A fresh chroot ``/lakelog-<hex>`` for this test: brokers use
    ``zookeeper.connect + chroot``."""
    with fresh_chroot(zookeeper.connect) as path:
        yield path
