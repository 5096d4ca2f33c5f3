"""How a broker of a cluster reaches the other brokers: a protocol the front implements.

The core decides what to ask another broker (the controller, a partition's leader, a
group's coordinator) and what its answer means; the front carries the question. The
HTTP front (``ingest_api.http.peers``) sends each as a request to the broker's URL.

Errors: an answer that is an error is raised as a ``LakelogError`` (the table's class
where the answer names one the core acts on, else the front's own ``LakelogError``
subclass carrying the answer as it was); a broker that does not answer is
``BrokerNotAvailableError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation

if TYPE_CHECKING:
    import pyarrow as pa

    from cluster.model import BrokerInfo
    from ingest_api.broker.fetch import Format, RemoteFetch
    from ingest_api.settings import ApiSettings

@dataclass(frozen=True, slots=True)
class PeerSetup:
    """What a front needs to reach this broker's peers."""

    broker_id: int
    settings: ApiSettings
    credentials: str | None
    """This broker's own key (``auth = "api-key"``), which it shows the others; None:
    the cluster runs without authentication."""
    on_send: Callable[[int, str], None] | None = None
    """Called with (broker id, kind of request) for each request sent (for /metrics)."""


class PartitionBounds(NamedTuple):
    """One partition as its leader describes it."""

    partition: int
    leader: int
    log_start_offset: int
    high_watermark: int


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as a broker holds it (``ingest_api.broker.cluster_info``): its
    placement, its bounds across the hot log and the Delta tier, and its sizes."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]
    leader_epoch: int
    log_start_offset: int
    """Across both tiers."""
    high_watermark: int
    size_bytes: int
    segments: int
    hot_log_start_offset: int
    tiered_offset: int
    tiered_size_bytes: int


@dataclass(frozen=True)
class GroupSummary:
    """A consumer group as its coordinator lists it (``ingest_api.broker.group_admin``)."""

    group_id: str
    coordinator_id: int
    state: str
    """Kafka's state names (``Empty`` for a group that is only committed offsets)."""
    assignor: str | None
    """None: the group has no members now."""
    group_epoch: int
    members: int


TXN_CALLS = ("marker", "verify", "offsets-check", "offsets-commit", "offsets-release")
"""The broker-to-broker calls of transactions (``Peers.txn``)."""


class Peers(Protocol):
    """The other brokers of this broker's cluster (asynchronous: called on the loop)."""

    async def create_topic(self, broker: BrokerInfo, topic: str, partitions: int) -> None:
        """Ask ``broker`` (the controller) to create ``topic``, as this broker's own request
        (``__consumer_offsets``); ``TopicExistsError`` when it exists."""
        ...

    async def registry_get(self, broker: BrokerInfo, path: str) -> Any:
        """A GET of the schema registry ``broker`` serves (``/schemas/ids/1``), as this
        broker: its JSON answer, or its error raised as the table's."""
        ...

    async def fetch(self, broker: BrokerInfo, topic: str, partition: int, offset: int,
                    max_records: int, max_bytes: int, fmt: Format,
                    isolation: Isolation = READ_UNCOMMITTED) -> RemoteFetch:
        """Records of a partition ``broker`` leads, without waiting. Raises
        ``OffsetOutOfRangeError`` (with the leader's bounds), and ``NotLeaderError``
        when the leader answers that the read belongs elsewhere or later (it moved,
        is busy, or does not know the partition)."""
        ...

    async def fetch_arrow(self, broker: BrokerInfo, topic: str, partition: int,
                          offset: int, max_records: int, max_bytes: int,
                          isolation: Isolation = READ_UNCOMMITTED
                          ) -> tuple[list[pa.RecordBatch], int]:
        """``fetch`` in Arrow (``SPARK_SCHEMA``): the batches and the next offset."""
        ...

    async def offsets(self, broker: BrokerInfo, topic: str, partition: int
                      ) -> tuple[int, int]:
        """(log start, high watermark) of a partition ``broker`` leads."""
        ...

    async def partitions(self, broker: BrokerInfo, topic: str) -> list[PartitionBounds]:
        """``topic``'s partitions as ``broker`` describes them (leader and bounds)."""
        ...

    async def partition(self, broker: BrokerInfo, topic: str, partition: int,
                        principal: str | None) -> PartitionInfo | None:
        """The partition as ``broker`` (its leader) holds it, asked for ``principal``;
        None when ``broker`` does not answer."""
        ...

    async def groups(self, broker: BrokerInfo, principal: str | None) -> list[GroupSummary]:
        """The groups ``broker`` coordinates that ``principal`` may describe."""
        ...

    async def delete_records(self, broker: BrokerInfo, topic: str,
                             offsets: Mapping[int, int], principal: str | None
                             ) -> dict[int, int]:
        """Kafka's DeleteRecords at ``broker`` (the leader of those partitions), for
        ``principal``: each partition's new log start."""
        ...

    async def seal(self, broker: BrokerInfo, topic: str, principal: str | None
                   ) -> list[tuple[int, bool, int]]:
        """``broker`` seals the partitions of ``topic`` it leads, for ``principal``:
        (partition, rolled, end offset) of each."""
        ...

    async def txn(self, broker: BrokerInfo, call: str, body: Mapping[str, object]) -> None:
        """A transaction coordinator's call to another broker (``TXN_CALLS``): a marker
        to a partition it leads, a write checked by the coordinator it is, a group's
        offsets checked (and held), committed or released by that group's coordinator.
        Raises the error
        ``broker`` answered, as this broker would."""
        ...

    def replica_channel(self, max_wait_ms: int) -> ReplicaChannel:
        """A blocking line to leaders for one replica fetcher thread."""
        ...

    async def close(self) -> None: ...


class ReplicaChannel(Protocol):
    """A follower's requests to a leader (``cluster.replica_protocol`` bodies, encoded);
    a failure of any kind raises ``BrokerNotAvailableError``."""

    def epoch_end(self, leader: BrokerInfo, request: bytes) -> bytes: ...

    def fetch(self, leader: BrokerInfo, request: bytes) -> bytes: ...

    def close(self) -> None: ...


Connect = Callable[[PeerSetup], Peers]
"""The front's way to make a broker's ``Peers``."""
