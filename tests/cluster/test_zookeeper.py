"""The ZooKeeper the cluster tests run on: the session fixture, chroots, restart, stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from lakelog.zookeeper import ZooKeeperServer
from tests.server import process_alive

pytestmark = pytest.mark.slow


def _client(connect: str) -> KazooClient:
    zk = KazooClient(hosts=connect, timeout=30)
    zk.start(timeout=30)
    return zk


def test_a_chroot_is_fresh_and_private(zookeeper: ZooKeeperServer, chroot: str) -> None:
    zk = _client(zookeeper.connect + chroot)
    try:
        assert zk.get_children("/") == []
        zk.create("/brokers/ids/1", b"{}", makepath=True, ephemeral=True)
        assert zk.get_children("/brokers/ids") == ["1"]
    finally:
        zk.stop()
        zk.close()
    root = _client(zookeeper.connect)
    try:
        assert root.exists(chroot + "/brokers/ids") is not None
        assert root.exists(chroot + "/brokers/ids/1") is None  # ephemeral: gone with the session
    finally:
        root.stop()
        root.close()


def test_restart_keeps_data_and_stop_leaves_no_process(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk").start()
    try:
        zk = _client(server.connect)
        zk.create("/kept", b"v1")
        zk.stop()
        zk.close()
        port = server.port
        server.restart()
        assert server.port == port
        zk = _client(server.connect)
        assert zk.get("/kept")[0] == b"v1"
        zk.stop()
        zk.close()
    finally:
        assert server.proc is not None
        pid = server.proc.pid
        server.stop()
    assert server.proc is None
    assert not process_alive(pid)
    with pytest.raises(ProcessLookupError):  # nothing left in its process group either
        os.killpg(pid, 0)
    assert not server.ready()
