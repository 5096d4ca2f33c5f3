"""``lakelog cluster up/down``: real ZooKeeper and broker processes, detached from the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from lakelog import local_cluster, zookeeper
from lakelog.local import free_port
from log_tables.errors import LakelogError
from tests.server import process_alive

LAKELOG = Path(sys.executable).parent / "lakelog"
pytestmark = pytest.mark.slow


def _lakelog(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAKELOG_TIER_INTERVAL_MS": "0", "LAKELOG_RETENTION_INTERVAL_MS": "0",
           "LAKELOG_COMPACT_INTERVAL_MS": "0", "LAKELOG_UPKEEP_INTERVAL_MS": "0"}
    return subprocess.run([LAKELOG, *args], capture_output=True, text=True, env=env,
                          timeout=180)


def _pids(state: dict[str, object]) -> list[int]:
    brokers = state["brokers"]
    assert isinstance(brokers, list)
    zk = state["zookeeper_process"]
    assert isinstance(zk, dict)
    return [b["process"]["pid"] for b in brokers] + [zk["pid"]]


def test_up_two_brokers_then_down(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    up = _lakelog("cluster", "up", "--brokers", "2", "--dir", str(directory))
    state_file = directory / "cluster.json"
    up_state = state_file.read_text() if state_file.exists() else "{}"
    state = json.loads(up_state)
    try:
        assert up.returncode == 0, up.stderr
        assert [b["id"] for b in state["brokers"]] == [1, 2]
        for b in state["brokers"]:
            assert httpx.get(b["url"] + "/healthz", timeout=5).status_code == 200
            assert b["url"] in up.stdout and b["log"] in up.stdout
            assert Path(b["log"]).exists()
        # auth api-key by default: one admin key, made by whichever broker started first
        keys = [directory / f"broker-{i}" / "security" / "admin.key" for i in (1, 2)]
        assert [k.exists() for k in keys].count(True) == 1
        key = next(k for k in keys if k.exists())
        assert str(key) in up.stdout
        listed = subprocess.run([str(LAKELOG), "topics", "list", "--url", state["brokers"][1]["url"]],
                                env={**os.environ, "LAKELOG_DATA_DIR": str(key.parents[1])},
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr  # the key works on every broker
        assert state["zookeeper"] in up.stdout and "lakelog cluster down" in up.stdout
        assert f"zookeeper = {state['zookeeper']}" in (directory / "broker-2.log").read_text()
        assert all(process_alive(pid) for pid in _pids(state))

        for b in state["brokers"]:  # each broker's pid and URL on its line
            assert f"broker {b['id']}   pid {b['process']['pid']}  {b['url']}  started" \
                in up.stdout, up.stdout

        again = _lakelog("cluster", "up", "--dir", str(directory))
        assert again.returncode == 0, again.stderr
        assert "every process of the cluster was running: nothing started" in again.stderr
        assert json.loads(state_file.read_text()) == state  # the running cluster untouched
        assert f"pid {state['brokers'][0]['process']['pid']}" in again.stdout

        # One broker dies: 'up' starts it alone, on its port; the other is left running.
        dead = state["brokers"][1]
        os.killpg(dead["process"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while process_alive(dead["process"]["pid"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        back = _lakelog("cluster", "up", "--dir", str(directory))
        assert back.returncode == 0, back.stderr
        state = json.loads(state_file.read_text())
        assert state["brokers"][0]["process"] == json.loads(up_state)["brokers"][0]["process"]
        revived = state["brokers"][1]
        assert revived["url"] == dead["url"] and revived["process"] != dead["process"]
        assert f"broker 2   pid {revived['process']['pid']}  {revived['url']}  started" \
            in back.stdout, back.stdout
        assert "broker 1   pid" in back.stdout and "running" in back.stdout
        assert httpx.get(revived["url"] + "/healthz", timeout=5).status_code == 200
        wrong = _lakelog("cluster", "up", "--brokers", "3", "--dir", str(directory))
        assert wrong.returncode == 1 and "has 2 broker(s), not 3" in wrong.stderr
    finally:
        down = _lakelog("cluster", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert "stopped 2 broker(s) and ZooKeeper" in down.stdout
    assert not any(process_alive(pid) for pid in _pids(state))
    assert not state_file.exists()
    assert (directory / "broker-1").is_dir() and (directory / "zookeeper" / "data").is_dir()

    gone = _lakelog("cluster", "down", "--dir", str(directory))
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1
    assert str(state_file) in gone.stderr


def test_up_with_an_unreachable_zookeeper_names_its_port(tmp_path: Path) -> None:
    port = free_port()
    out = _lakelog("cluster", "up", "--zookeeper", f"127.0.0.1:{port}/lakelog",
                   "--dir", str(tmp_path / "c"))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in out.stderr, out.stderr
    assert not (tmp_path / "c").exists()


def test_up_without_zookeeper_installed_says_how(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zookeeper, "ZK_HOMES", ())
    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    with pytest.raises(LakelogError) as err:
        local_cluster.up(tmp_path / "c", 1)
    assert "apt-get install zookeeper" in err.value.message
    assert "--zookeeper" in err.value.message
    assert "\n" not in err.value.message
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_up_says_which_port_is_taken_and_by_what_and_starts_nothing(tmp_path: Path) -> None:
    """As beside a running ``lakelog serve`` holding the SQL endpoint's port."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        out = _lakelog("cluster", "up", "--brokers", "1", "--dir", str(tmp_path / "c"),
                       "--sql-port", str(port))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1, out.stderr
    assert f"port {port} (broker 1's SQL endpoint) on 127.0.0.1 is taken by pid " \
        f"{os.getpid()} (" in out.stderr, out.stderr
    assert "--sql-port N picks another" in out.stderr and "nothing was started" in out.stderr
    assert not (tmp_path / "c").exists()
