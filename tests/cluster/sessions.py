"""Brokers as bare ZooKeeper sessions and a controller in this process, driven a turn at
a time: what the controller tests (``test_isr.py``, ``test_coordinator_slots.py``) build
on. The fixtures ``zk``, ``brokers`` and ``steps`` are in ``conftest.py``."""

from __future__ import annotations

from kazoo.client import KazooClient

from cluster.controller import Controller
from cluster.model import (
    BROKERS,
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    broker_path,
    decode,
    encode,
    state_path,
    topic_path,
)
from tests.cluster.test_controller_steps import wait_for

CONTROLLER_ID = 100
"""The controller's broker id: not one of the registered brokers, so it never leads."""


class Sessions:
    """Brokers as bare ZooKeeper sessions: each holds its ephemeral registration."""

    def __init__(self, connect: str, zk: KazooClient) -> None:
        self.connect = connect
        self.zk = zk
        self.clients: dict[int, KazooClient] = {}

    def register(self, *ids: int) -> None:
        for i in ids:
            client = KazooClient(hosts=self.connect, timeout=10)
            client.start(timeout=30)
            client.create(broker_path(i), encode(BrokerInfo(i, "127.0.0.1", 9000 + i)),
                          ephemeral=True)
            self.clients[i] = client

    def end(self, *ids: int) -> None:
        """Close these sessions: ZooKeeper removes their registrations at once."""
        for i in ids:
            client = self.clients.pop(i)
            client.stop()
            client.close()
        wait_for(f"brokers {ids} gone", lambda: not set(ids) & self.live())

    def bounce(self, i: int) -> None:
        """Broker ``i`` restarted: a new session and registration (a new czxid)."""
        self.end(i)
        self.register(i)

    def live(self) -> set[int]:
        return {int(c) for c in self.zk.get_children(BROKERS)}

    def close(self) -> None:
        for i in list(self.clients):
            self.end(i)


def elected(zk: KazooClient, **options: object) -> Controller:
    ctl = Controller(zk, CONTROLLER_ID, **options)  # type: ignore[arg-type]
    ctl.run_once()
    assert ctl.active
    return ctl


def state(zk: KazooClient, topic: str, p: int = 0) -> PartitionState:
    return decode(zk.get(state_path(topic, p))[0], PartitionState)


def replicas(zk: KazooClient, topic: str, p: int = 0) -> list[int]:
    return decode(zk.get(topic_path(topic))[0], TopicAssignment).replicas[p]


def create(ctl: Controller, topic: str, partitions: int = 1, factor: int = 3,
           configs: dict[str, str] | None = None) -> list[list[int]]:
    return ctl.create_topic(topic, partitions, factor, configs or {}, 0).replicas
