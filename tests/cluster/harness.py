"""A running cluster for the cluster tests: three real brokers on the session's ZooKeeper
(a chroot of their own), a kazoo client to read what the controller wrote, and the few
REST calls the tests make through any broker."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from cluster.model import PartitionState, broker_path, decode, state_path
from log_tables.hot.batch import BatchScanner
from log_tables.hot.hot_reader import list_segments
from log_tables.layout import Layout
from log_tables.partitioner import partition_for_key
from tests.cluster.brokers import Brokers, fresh_chroot, kazoo_client
from tests.server import CLUSTER

_T = TypeVar("_T")

WAIT_S = 30.0
"""Deadline of a wait on the cluster: sessions are 4 s, so anything taking longer is a
fault, not a slow machine."""


def wait_for(condition: Callable[[], _T | None], what: str, timeout_s: float = WAIT_S
             ) -> tuple[_T, float]:
    """Poll ``condition`` until it returns something truthy: (that, seconds it took)."""
    start = time.monotonic()
    deadline = start + timeout_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g}s: {what}")
        time.sleep(0.05)
    return found, time.monotonic() - start


def stored_batches(data_dir: Path, topic: str, partition: int) -> dict[int, bytes]:
    """A replica's stored batches, base offset -> bytes, read from its segment files."""
    directory = Layout.of(data_dir).partition_dir(topic, partition)
    out: dict[int, bytes] = {}
    for seg in list_segments(directory):
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            for b in BatchScanner(fd, str(seg.path), 0, os.fstat(fd).st_size):
                out[b.header.base_offset] = bytes(b.raw)
        finally:
            os.close(fd)
    return out


def string(text: str) -> dict[str, str]:
    return {"type": "STRING", "data": text}


def keys_by_partition(partitions: int, per_partition: int, prefix: str = "k") -> dict[int, list[str]]:
    """``per_partition`` keys that Kafka's partitioner sends to each partition."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(keys) < per_partition for keys in found.values()):
        key = f"{prefix}{i}"
        p = partition_for_key(key.encode(), partitions)
        if len(found[p]) < per_partition:
            found[p].append(key)
        i += 1
    return found


class Cluster:
    """Brokers 1..3 and what the tests ask of them."""

    def __init__(self, brokers: Brokers, zk: KazooClient) -> None:
        self.brokers = brokers
        self.zk = zk
        self.admin: tuple[str, str] | None = None
        """The admin key (id, secret) when authentication is on: the default of requests."""

    def admin_key(self) -> tuple[str, str] | None:
        """The cluster's admin key, from the one broker whose first start made it."""
        for i in self.brokers.ids:
            path = self.brokers.servers[i].data_dir / "security" / "admin.key"
            if path.exists():
                key_id, _, secret = path.read_text().strip().partition(":")
                return key_id, secret
        return None

    def http(self, i: int, timeout_s: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.brokers.url(i) + CLUSTER, timeout=timeout_s,
                            auth=self.admin)

    def get(self, i: int, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("auth", self.admin)
        return httpx.get(self.brokers.url(i) + CLUSTER + path, timeout=30, **kwargs)

    def post(self, i: int, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("auth", self.admin)
        return httpx.post(self.brokers.url(i) + CLUSTER + path, timeout=30, **kwargs)

    # -- what ZooKeeper says ---------------------------------------------------------
    def state(self, topic: str, partition: int) -> PartitionState:
        return decode(self.zk.get(state_path(topic, partition))[0], PartitionState)

    def leaders(self, topic: str, partitions: int) -> dict[int, int]:
        return {p: self.state(topic, p).leader for p in range(partitions)}

    def registered(self) -> list[int]:
        return sorted(int(b) for b in self.zk.get_children("/brokers/ids"))

    def is_registered(self, i: int) -> bool:
        try:
            self.zk.get(broker_path(i))
        except NoNodeError:
            return False
        return True

    def controller(self, via: int) -> int:
        """The controller, as broker ``via`` answers GET /v3/clusters/lakelog."""
        related = self.get(via, "").json()["controller"]["related"]
        return int(related.rsplit("/", 1)[1])

    # -- topics and records ----------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 6, via: int = 1) -> dict[int, int]:
        """Create through ``via``; wait until every live broker knows it; its leaders."""
        r = self.post(via, "/topics", json={"topic_name": name, "partitions_count": partitions})
        assert r.status_code == 201, r.text
        live = [i for i in self.brokers.ids if self.brokers.alive(i)]
        for i in live:
            wait_for(lambda i=i: self.get(i, f"/topics/{name}").status_code == 200,  # type: ignore[misc]
                     f"broker {i} knowing topic {name}")
        return self.leaders(name, partitions)

    def fetch(self, via: int, topic: str, partition: int, offset: int = 0
              ) -> list[dict[str, Any]]:
        """Every record from ``offset`` on, read through broker ``via``."""
        out: list[dict[str, Any]] = []
        while True:
            r = self.get(via, f"/topics/{topic}/partitions/{partition}/records",
                         params={"offset": offset, "format": "STRING"})
            assert r.status_code == 200, r.text
            records = r.json()["records"]
            if not records:
                return out
            out += records
            offset = records[-1]["offset"] + 1

    def wait_serving(self, topic: str, partitions: int, timeout_s: float = WAIT_S) -> float:
        """Wait until every broker is registered, every partition led, and a record
        produced to each partition through each broker acknowledged; seconds taken."""
        start = time.monotonic()
        wait_for(lambda: self.registered() == self.brokers.ids, "all brokers registered",
                 timeout_s)
        wait_for(lambda: all(ld >= 0 for ld in self.leaders(topic, partitions).values()),
                 f"every partition of {topic} led", timeout_s)

        def produced() -> bool:
            for i in self.brokers.ids:
                for p in range(partitions):
                    r = self.post(i, f"/topics/{topic}/records",
                                  json={"partition_id": p, "value": string("probe")})
                    if r.status_code != 200:
                        return False
            return True

        wait_for(produced, f"produce to every partition of {topic} through every broker",
                 timeout_s)
        return time.monotonic() - start

    def pause(self, i: int) -> None:
        """SIGSTOP broker ``i``'s process group (it stops answering, and stops hearing
        ZooKeeper: its session ends once the timeout passes)."""
        proc = self.brokers.servers[i].proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        proc = self.brokers.servers[i].proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def three_brokers(directory: Path, connect: str, env: dict[str, str] | None = None
                  ) -> Iterator[Cluster]:
    """A fresh chroot on ``connect``, three brokers in it, a kazoo client on it."""
    with fresh_chroot(connect) as chroot:
        zk = kazoo_client(connect + chroot, 10)
        zk.start(timeout=30)
        try:
            brokers = Brokers(directory, connect + chroot, 3, env=env)
            with brokers:
                wait_for(lambda: len(zk.get_children("/brokers/ids")) == 3,
                         "three brokers registered")
                cluster = Cluster(brokers, zk)
                if (env or {}).get("LAKELOG_AUTH", "none") != "none":
                    cluster.admin, _ = wait_for(cluster.admin_key, "the admin key made")
                wait_for(lambda: all(cluster.controller(i) > 0 for i in brokers.ids),
                         "every broker knowing the controller")
                try:
                    yield cluster
                finally:  # a test that paused a broker may have failed before resuming it
                    for i in brokers.ids:
                        if brokers.alive(i):
                            with contextlib.suppress(ProcessLookupError):
                                cluster.resume(i)
        finally:
            zk.stop()
            zk.close()
