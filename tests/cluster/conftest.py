"""Fixtures of the cluster tests: one real ZooKeeper for the session, a fresh chroot per
test (tests share the server without seeing each other's nodes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from cluster import controller
from cluster.model import BROKERS, TOPICS
from lakelog.zookeeper import ZooKeeperMissing, ZooKeeperServer
from tests.cluster.brokers import fresh_chroot
from tests.cluster.sessions import Sessions


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


@pytest.fixture
def zk(zookeeper: ZooKeeperServer, chroot: str) -> Iterator[KazooClient]:
    """The controller's session (and the test's reads), in the test's chroot."""
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)
    for path in (BROKERS, TOPICS):
        client.ensure_path(path)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def brokers(zookeeper: ZooKeeperServer, chroot: str, zk: KazooClient) -> Iterator[Sessions]:
    """Brokers 1, 2 and 3 registered."""
    sessions = Sessions(zookeeper.connect + chroot, zk)
    sessions.register(1, 2, 3)
    yield sessions
    sessions.close()


@pytest.fixture
def steps() -> Iterator[list[str]]:
    """The controller steps completed, in order."""
    seen: list[str] = []
    controller.step_hook = seen.append
    yield seen
    controller.step_hook = None
