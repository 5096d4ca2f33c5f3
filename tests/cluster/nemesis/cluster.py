"""The cluster the nemesis works on: a ZooKeeper of its own and brokers 1..n, each in a
network namespace of its own (``network.Network``), and every fault the nemesis deals.

ZooKeeper listens on the bridge's address; the clients run in the test's namespace and
reach each broker at its own address, as clients on other machines would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from cluster.model import PartitionState, decode, state_path
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import kazoo_client
from tests.cluster.nemesis.network import Network
from tests.server import CLUSTER, LAKELOG, ServerProcess

CHROOT = "/lakelog"


class NemesisCluster:
    def __init__(self, directory: Path, net: Network, brokers: int = 3, *,
                 env: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.net = net
        self.zookeeper = ZooKeeperServer(directory / "zookeeper", host=net.gateway)
        self.servers: dict[int, ServerProcess] = {}
        for i in range(1, brokers + 1):
            server = ServerProcess(directory / f"broker-{i}", {
                "LAKELOG_BROKER_ID": str(i),
                "LAKELOG_ZOOKEEPER": self.zookeeper.connect + CHROOT,
                "LAKELOG_WAREHOUSE": str(directory / "warehouse"),
                "LAKELOG_ALLOW_INSECURE_NON_LOOPBACK": "true",
                **(env or {})}, host=net.address(i))
            server.command = [*net.command(i), str(LAKELOG)]
            self.servers[i] = server
        self.paused: set[int] = set()
        self._zk: KazooClient | None = None

    @property
    def ids(self) -> list[int]:
        return list(self.servers)

    def url(self, i: int) -> str:
        return self.servers[i].url

    def start(self, timeout_s: float = 90) -> NemesisCluster:
        self.zookeeper.start()
        self._zk = kazoo_client(self.zookeeper.connect + CHROOT, 4)
        root = kazoo_client(self.zookeeper.connect, 10)
        root.start(timeout=30)
        try:
            root.ensure_path(CHROOT)
        finally:
            root.stop()
            root.close()
        self._zk.start(timeout=30)
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda i: self.servers[i].start(timeout_s), self.ids))
        return self

    def close(self) -> None:
        """Every broker SIGKILLed (a paused one too), ZooKeeper stopped."""
        for i in self.ids:
            if self.alive(i):
                with contextlib.suppress(Exception):
                    self.servers[i].kill_all()
        if self._zk is not None:
            with contextlib.suppress(Exception):
                self._zk.stop()
                self._zk.close()
        self.zookeeper.kill()

    def stop_all(self) -> None:
        """SIGTERM every broker at once; each must shut down cleanly."""
        running = [i for i in self.ids if self.alive(i)]
        with ThreadPoolExecutor(max(1, len(running))) as pool:
            list(pool.map(lambda i: self.servers[i].stop(60), running))

    # -- what ZooKeeper says (None when it cannot be asked) -------------------------------
    def state(self, topic: str, partition: int) -> PartitionState | None:
        assert self._zk is not None
        try:
            return decode(self._zk.get(state_path(topic, partition))[0], PartitionState)
        except (KazooException, KazooTimeoutError):
            return None

    def controller(self) -> int | None:
        assert self._zk is not None
        try:
            return int(decode(self._zk.get("/controller")[0], dict)["broker_id"])
        except (KazooException, KazooTimeoutError, KeyError, ValueError):
            return None

    # -- faults ---------------------------------------------------------------------------
    def alive(self, i: int) -> bool:
        proc = self.servers[i].proc
        return proc is not None and proc.poll() is None

    def kill(self, i: int) -> None:
        """SIGKILL broker ``i`` (paused or not) and everything it started."""
        self.servers[i].kill_all()
        self.paused.discard(i)

    def restart(self, i: int, timeout_s: float = 120) -> None:
        """Start broker ``i`` again on its data directory; tried again while it cannot
        start (ZooKeeper down, its old registration not yet expired)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.servers[i].start(min(60.0, max(5.0, deadline - time.monotonic())))
                return
            except RuntimeError:
                if self.alive(i):
                    self.servers[i].kill_all()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def pause(self, i: int) -> None:
        proc = self.servers[i].proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.servers[i].proc
        if proc is not None and i in self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
        self.paused.discard(i)

    def cut_from_zookeeper(self, i: int) -> None:
        self.net.cut(i, self.zookeeper.host, self.zookeeper.port)

    def cut_from_brokers(self, i: int) -> None:
        for j in self.ids:
            if j != i:
                self.net.cut(i, self.net.address(j))

    def heal(self, i: int) -> None:
        self.net.heal(i)

    def stop_zookeeper(self) -> None:
        self.zookeeper.stop()

    def start_zookeeper(self) -> None:
        if self.zookeeper.proc is None:
            self.zookeeper.start()

    # -- the REST API ---------------------------------------------------------------------
    def any_get(self, path: str, **params: object) -> httpx.Response | None:
        """GET ``path`` of the first broker that answers 200."""
        for i in self.ids:
            if not self.alive(i) or i in self.paused:
                continue
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(self.url(i) + CLUSTER + path, params=params, timeout=5)  # type: ignore[arg-type]
                if r.status_code == 200:
                    return r
        return None


@contextlib.contextmanager
def nemesis_cluster(directory: Path, net: Network, brokers: int = 3, *,
                    env: Mapping[str, str] | None = None) -> Iterator[NemesisCluster]:
    cluster = NemesisCluster(directory, net, brokers, env=env)
    try:
        yield cluster.start()
    finally:
        cluster.close()
