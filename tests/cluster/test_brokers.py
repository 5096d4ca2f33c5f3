"""The Brokers helper: real ``lakelog serve`` processes configured as brokers of one cluster."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import Brokers
from tests.server import process_alive

pytestmark = pytest.mark.slow


def test_brokers_start_with_their_settings_and_restart(
        tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> None:
    connect = zookeeper.connect + chroot
    with Brokers(tmp_path, connect, 2, racks=["a", "b"]) as brokers:
        assert brokers.ids == [1, 2]
        assert brokers.url(1) != brokers.url(2)
        for i in brokers.ids:
            assert httpx.get(brokers.url(i) + "/healthz", timeout=5).status_code == 200
            settings = brokers.servers[i].log()
            assert f"broker_id = {i}" in settings, settings
            assert f"zookeeper = {connect}" in settings, settings
            assert "zookeeper_session_timeout_ms = 4000" in settings, settings
            assert f"broker_rack = {'ab'[i - 1]}" in settings, settings
            assert f"warehouse = {tmp_path / 'warehouse'}" in settings, settings
            assert (tmp_path / f"broker-{i}").is_dir()
        proc = brokers.servers[2].proc
        assert proc is not None
        url = brokers.url(2)
        brokers.kill(2)
        assert not brokers.alive(2) and not process_alive(proc.pid)
        brokers.start(2)
        assert brokers.url(2) == url
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    assert not any(brokers.alive(i) for i in brokers.ids)
