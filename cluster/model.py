"""What lakelog keeps in ZooKeeper, as JSON documents (msgspec), and where.

Layout (under the cluster's chroot), after Kafka's ZooKeeper mode::

    /brokers/ids/<id>                          ephemeral   BrokerInfo
    /controller                                ephemeral   {"broker_id": id}
    /controller_epoch                          persistent  the controller epoch (int)
    /brokers/topics/<topic>                    persistent  TopicAssignment (replicas, configs)
    /brokers/topics/<topic>/partitions/<p>/state           PartitionState
    /latest_producer_id_block                  persistent  the last block of producer ids
    /lakelog/security                          persistent  API keys and ACLs

The topic ``__consumer_offsets`` holds no records: its partitions are the consumer group
coordinator slots, and the broker that leads slot ``hash(group) % partitions`` coordinates
the group (Kafka's coordinator lookup). Its partitions are replicated (Kafka's
``offsets.topic.replication.factor``) so that the coordinator moves with leadership; with
no records, every live replica is in sync (``RECORDLESS_TOPICS``).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

_T = TypeVar("_T")

NO_LEADER = -1
OFFSETS_TOPIC = "__consumer_offsets"
RECORDLESS_TOPICS = frozenset({OFFSETS_TOPIC})
"""Topics whose partitions hold no records (their state is kept elsewhere): elected and
kept in sync by ``cluster.election.after_brokers_changed_recordless``."""

BROKERS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
SECURITY = "/lakelog/security"
PERSISTENT = (BROKERS, TOPICS, "/lakelog")


def broker_path(broker_id: int) -> str:
    return f"{BROKERS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


class BrokerInfo(msgspec.Struct, frozen=True):
    """A live broker: where clients and other brokers reach it."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


class TopicAssignment(msgspec.Struct, frozen=True):
    """A topic: the replicas of each partition (the first is the preferred leader) and its
    configs (the values given at creation and by alters; defaults are not stored)."""

    replicas: list[list[int]]
    configs: dict[str, str] = {}
    topic_id: str = ""
    created_ms: int = 0

    @property
    def partitions(self) -> int:
        return len(self.replicas)

    @property
    def replication_factor(self) -> int:
        return len(self.replicas[0]) if self.replicas else 0


class PartitionState(msgspec.Struct, frozen=True):
    """Kafka's LeaderAndIsr: who leads, since which leader epoch, who is in sync (never
    empty; the leader is a member while there is one), and the controller epoch of the
    controller that last wrote it (a leader's ISR change keeps it)."""

    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int

    @property
    def online(self) -> bool:
        return self.leader != NO_LEADER


class ProducerIdBlock(msgspec.Struct, frozen=True):
    broker_id: int
    first: int
    last: int


_encoder = msgspec.json.Encoder()


def encode(doc: msgspec.Struct) -> bytes:
    return _encoder.encode(doc)


def decode(data: bytes, kind: type[_T]) -> _T:
    return msgspec.json.decode(data, type=kind)
