"""Brokers of a test cluster: real ``lakelog serve`` processes sharing one ZooKeeper chroot
and one warehouse, each with its own data directory."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from tests.server import ServerProcess

SESSION_TIMEOUT_MS = 4000
"""Short ZooKeeper sessions, so a killed broker's ephemeral nodes go within seconds."""


@contextlib.contextmanager
def fresh_chroot(connect: str, timeout_s: float = 30) -> Iterator[str]:
    """A new, empty chroot ``/lakelog-<hex>`` on the ZooKeeper at ``connect`` (created, as
    Kafka creates its chroot; removed with everything under it afterwards). Each step opens
    its own session: one held through the test would not outlive a test that stops
    ZooKeeper for longer than the session."""
    chroot = f"/lakelog-{secrets.token_hex(6)}"
    with _session(connect, timeout_s) as zk:
        zk.create(chroot)
    yield chroot
    with _session(connect, timeout_s) as zk:
        zk.delete(chroot, recursive=True)


def kazoo_client(hosts: str, timeout_s: float) -> KazooClient:
    """A test's kazoo client that reconnects within a second of ZooKeeper coming back.
    kazoo's own default backs off up to an hour between attempts, so a client that saw
    ZooKeeper stopped for a few seconds could sleep past its session (as the broker's own
    client is told not to, in ``cluster/session.py``)."""
    return KazooClient(hosts=hosts, timeout=timeout_s,
                       connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))


@contextlib.contextmanager
def _session(connect: str, timeout_s: float) -> Iterator[KazooClient]:
    zk = kazoo_client(connect, timeout_s)
    zk.start(timeout=timeout_s)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


class Brokers:
    """Brokers 1..``n`` (Kafka numbers from 0; lakelog's cluster of one is broker 1) under
    ``directory``: ``broker-<i>/`` data directories, one ``warehouse/``, registered at
    ``zookeeper`` ("HOST:PORT/chroot"). ``racks`` gives broker i the rack ``racks[i-1]``;
    ``env`` adds ``LAKELOG_*`` settings for every broker."""

    def __init__(self, directory: Path, zookeeper: str, n: int = 3, *,
                 racks: list[str] | None = None,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 env: dict[str, str] | None = None) -> None:
        assert racks is None or len(racks) == n, f"{len(racks or [])} racks for {n} brokers"
        self.directory = directory
        self.zookeeper = zookeeper
        self.warehouse = directory / "warehouse"
        self.servers: dict[int, ServerProcess] = {}
        for i in range(1, n + 1):
            broker_env = {"LAKELOG_BROKER_ID": str(i), "LAKELOG_ZOOKEEPER": zookeeper,
                          "LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS": str(session_timeout_ms),
                          "LAKELOG_WAREHOUSE": str(self.warehouse), **(env or {})}
            if racks is not None:
                broker_env["LAKELOG_BROKER_RACK"] = racks[i - 1]
            self.servers[i] = ServerProcess(directory / f"broker-{i}", broker_env)

    @property
    def ids(self) -> list[int]:
        return list(self.servers)

    def url(self, i: int) -> str:
        return self.servers[i].url

    def alive(self, i: int) -> bool:
        proc = self.servers[i].proc
        return proc is not None and proc.poll() is None

    def start(self, i: int, timeout_s: float = 60) -> ServerProcess:
        """Start (or restart, on the same port and data directory) broker ``i``."""
        return self.servers[i].start(timeout_s)

    def stop(self, i: int) -> None:
        """SIGTERM broker ``i`` and check it shut down cleanly."""
        self.servers[i].stop()

    def kill(self, i: int) -> None:
        """SIGKILL broker ``i`` and every process it started."""
        self.servers[i].kill_all()

    def start_all(self, timeout_s: float = 60) -> Brokers:
        """Start every broker at once (a broker may wait for the others to answer)."""
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda i: self.start(i, timeout_s), self.ids))
        return self

    def stop_all(self) -> None:
        """SIGTERM every running broker at once, each checked as ``stop`` checks it."""
        running = [i for i in self.ids if self.alive(i)]
        if running:
            with ThreadPoolExecutor(len(running)) as pool:
                list(pool.map(self.stop, running))

    def kill_all(self) -> None:
        for i in self.ids:
            if self.alive(i):
                self.kill(i)

    def __enter__(self) -> Brokers:
        try:
            return self.start_all()
        except BaseException:
            self.kill_all()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.stop_all()
        else:  # the test failed: leave nothing behind, say nothing more
            self.kill_all()
