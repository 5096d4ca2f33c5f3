"""Topic administration (Kafka's CreateTopics, DeleteTopics, CreatePartitions and
AlterConfigs): on a broker alone, in its own log manager; in a cluster, through the
controller, which writes the change to ZooKeeper for every broker.

A front asks ``controller()`` first: in a cluster the changes are the controller's, and
a broker that is not the controller hands the request to it (the HTTP front forwards it;
Kafka's answers NOT_CONTROLLER). Every other method runs here, on the controller or on a
broker alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cluster.model import OFFSETS_TOPIC, BrokerInfo
from consumer_groups.coordinator import GroupCoordinator
from ingest_api.broker.metadata import METADATA
from log_tables.cluster_errors import LeaderNotAvailableError
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.config import CONFIG_BY_NAME
from log_tables.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    UnknownConfigError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.registry import (
    INTERNAL_TOPICS,
    SCHEMAS_CONFIGS,
    TXN_STATE_CONFIGS,
    TXN_STATE_TOPIC,
    TopicMetadata,
)

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


@dataclass(frozen=True)
class ReplicaAssignment:
    """The brokers asked to hold one partition's replicas (its leader first)."""

    partition_id: int
    broker_ids: tuple[int, ...]


@dataclass(frozen=True)
class NewTopic:
    """A topic to create. ``configs``: (name, value) pairs, a None value leaving the
    default; ``internal``: a broker's own request for the cluster's coordinator slots
    (``__consumer_offsets``), which no user may create."""

    name: str
    partitions_count: int | None = None
    replication_factor: int | None = None
    replicas_assignments: tuple[ReplicaAssignment, ...] | None = None
    configs: tuple[tuple[str, str | None], ...] = ()
    validate_only: bool = False
    internal: bool = False


@dataclass(frozen=True)
class CreatedTopic:
    """What ``create`` made (or, with ``validate_only``, would make)."""

    topic: TopicMetadata
    replication_factor: int | None
    """The factor asked for, where the placement does not show it yet (a cluster's
    ``validate_only``); None: the placement's."""
    created: bool
    """False under ``validate_only``: nothing was made."""
    coordinator_slots: bool
    """The cluster's own ``__consumer_offsets``, made for a broker."""


class TopicAdmin:
    """Creates, deletes and changes topics, here or through the cluster's controller."""

    def __init__(self, manager: LogManager, tiered: TieredStorage, groups: GroupCoordinator,
                 default_replication_factor: int, link: ClusterLink | None = None, *,
                 broker_defaults: Mapping[str, str] | None = None) -> None:
        self.manager = manager
        self.broker_defaults: Mapping[str, str] = dict(broker_defaults or {})
        """This broker's own defaults of topic configs by Kafka name (Kafka's
        STATIC_BROKER_CONFIG), which a topic's override wins over."""
        self.tiered = tiered
        self.groups = groups
        self.default_replication_factor = default_replication_factor
        self.link = link

    # -- where -----------------------------------------------------------------------
    def controller(self) -> BrokerInfo | None:
        """The broker whose topic changes these are, when that is another broker (the
        cluster's controller); None: this broker makes them."""
        return None if self.link is None else self.link.controller()

    async def read_back(self, name: str) -> None:
        """After the controller's broker answered that it changed topic ``name`` (a change
        sent on to it): read the topic from ZooKeeper now, so that this broker's own next
        answers show the change rather than wait for its watches (read your writes
        through any broker). Unreachable ZooKeeper: the watches bring it later."""
        if self.link is None:
            return
        broker = self.link.broker
        try:
            exists = await asyncio.to_thread(broker.ensure_topic, name)
        except LeaderNotAvailableError:
            return
        if not exists:  # deleted: gone here at once (forgetting an unknown one is a no-op)
            await asyncio.to_thread(broker.forget_topic, name)

    def describe(self, name: str) -> TopicMetadata:
        """The topic; in a cluster, one made through another broker a moment ago is read
        from ZooKeeper before it is called unknown."""
        if self.link is not None and name not in self.manager.registry:
            self.link.ensure_topic(name)
        return self.manager.require_topic(name)

    def topics(self) -> list[TopicMetadata]:
        return self.manager.registry.list()

    # -- create ----------------------------------------------------------------------
    async def create(self, new: NewTopic) -> CreatedTopic:
        """Create a topic (``validate_only``: check all of it, create nothing)."""
        if new.name in INTERNAL_TOPICS and not new.internal:
            raise InvalidTopicError(f"{new.name} is lakelog's own "
                                    f"({INTERNAL_TOPICS[new.name]}); choose another name")
        if self.link is not None:
            return await self._create_in_cluster(new, self.link)
        factor = METADATA.replication_factor(new.name)  # 1: this broker alone
        asked = new.replication_factor
        if asked is not None and asked != factor:
            raise InvalidReplicationFactorError(
                f"replication_factor {asked} is more than the {factor} live broker: this "
                "server runs alone (a cluster keeps up to one copy of a partition per live "
                "broker: `lakelog cluster up`)" if asked > factor else
                f"replication_factor must be 1 or more, got {asked}")
        partitions = _partitions_count(new)
        configs, _ = config_values(new.configs)
        meta = self.manager.create_topic(new.name, partitions, configs,
                                         validate_only=new.validate_only)
        return CreatedTopic(meta, None, not new.validate_only, False)

    async def _create_in_cluster(self, new: NewTopic, link: ClusterLink) -> CreatedTopic:
        internal = new.name == OFFSETS_TOPIC
        if internal and not new.internal:
            raise InvalidTopicError(f"{OFFSETS_TOPIC} is the cluster's own (its partitions are "
                                    f"the consumer group coordinators)")
        if new.replicas_assignments is not None:
            raise InvalidReplicaAssignmentError(
                "replicas_assignments is not supported in a cluster: give partitions_count "
                "and replication_factor, and the controller places the replicas")
        broker = link.broker
        live = len(broker.view.live_brokers())
        factor = new.replication_factor or min(self.default_replication_factor, live)
        if internal:  # the controller grows it as more brokers live
            factor = max(1, min(broker.controller.offsets_topic_replication_factor, live))
        if factor > live:
            raise InvalidReplicationFactorError(
                f"replication_factor {factor} is more than the {live} live broker(s); start "
                f"more brokers or ask for fewer replicas")
        partitions = 1 if new.partitions_count is None else new.partitions_count
        configs, _ = config_values(new.configs)
        if new.name in INTERNAL_TOPICS:  # as Kafka's: 3 copies, 2 in sync, where they live
            factor = max(1, min(3, live))
            configs = {"min.insync.replicas": str(min(2, factor)),
                       **(TXN_STATE_CONFIGS if new.name == TXN_STATE_TOPIC else SCHEMAS_CONFIGS)}
        if internal:
            meta = TopicMetadata(OFFSETS_TOPIC, "", partitions, {}, 0)
        else:
            meta = self.manager.create_topic(new.name, partitions, configs,
                                             validate_only=True)
        if new.validate_only:
            return CreatedTopic(meta, factor, False, internal)
        controller = broker.controller
        await self._controller_step(link, lambda: controller.create_topic(
            meta.name, partitions, factor, dict(meta.overrides), int(time.time() * 1000)),
            meta.name)
        if internal:
            return CreatedTopic(meta, None, True, True)
        return CreatedTopic(self.manager.topic(meta.name), None, True, False)

    # -- partitions, deletion ----------------------------------------------------------
    async def add_partitions(self, name: str, partitions_count: int) -> TopicMetadata:
        """Raise the topic's partition count (it never goes down)."""
        if self.link is None:
            return self.manager.add_partitions(name, partitions_count)
        self.describe(name)
        controller = self.link.broker.controller
        await self._controller_step(self.link, lambda: controller.add_partitions(
            name, partitions_count), name)
        return self.manager.topic(name)

    async def delete(self, name: str) -> None:
        """Delete the topic, its committed offsets and its Delta tier."""
        if name in INTERNAL_TOPICS:
            raise InvalidTopicError(f"{name} is lakelog's own ({INTERNAL_TOPICS[name]}): "
                                    "it cannot be deleted")
        self.describe(name)
        if self.link is not None:
            broker = self.link.broker
            await asyncio.to_thread(broker.controller.delete_topic, name)
            await asyncio.to_thread(broker.forget_topic, name)
        else:
            self.manager.delete_topic(name)
            # Its committed offsets go with it (in a cluster each coordinator hears of the
            # deletion and deletes those of its groups: ``GroupSlots``).
            await self.groups.forget_topic(name)
        await asyncio.to_thread(self.tiered.drop_topic, name)

    # -- configs ---------------------------------------------------------------------
    def config(self, topic: str, name: str) -> TopicMetadata:
        """The topic, once ``name`` is known to be a topic config (404 if not)."""
        meta = self.describe(topic)
        known_config(name)
        return meta

    async def set_config(self, topic: str, name: str, value: str | None) -> None:
        """Set one config; None: back to its default."""
        self.describe(topic)
        to_set, to_default = config_values([(known_config(name), value)])
        await self._change_configs(topic, to_set, to_default, False)

    async def alter_configs(self, topic: str, entries: Sequence[tuple[str, str | None]],
                            validate_only: bool = False) -> None:
        """Set (a None value: reset to the default) several configs atomically."""
        self.describe(topic)
        to_set, to_delete = config_values(entries)
        await self._change_configs(topic, to_set, to_delete, validate_only)

    async def _change_configs(self, topic: str, to_set: dict[str, str], to_delete: list[str],
                              validate_only: bool) -> None:
        """Here, or (in a cluster) through the controller, which writes them to ZooKeeper
        for every broker."""
        if self.link is None or validate_only:
            self.manager.alter_configs(topic, to_set, to_delete, validate_only=validate_only)
            return
        meta = self.manager.alter_configs(topic, to_set, to_delete, validate_only=True)
        controller = self.link.broker.controller
        await self._controller_step(self.link, lambda: controller.set_configs(
            topic, dict(meta.overrides)), topic)

    @staticmethod
    async def _controller_step(link: ClusterLink, step: Callable[[], object],
                               topic: str) -> None:
        """Run a controller step (a ZooKeeper transaction) and read the topic back, so
        that this broker's answer shows the change."""
        await asyncio.to_thread(step)
        await asyncio.to_thread(link.broker.ensure_topic, topic)


def config_values(entries: Iterable[tuple[str, str | None]]
                  ) -> tuple[dict[str, str], list[str]]:
    """Configs to set and (for None values) to leave at or reset to their default; every
    name must be known either way."""
    to_set: dict[str, str] = {}
    to_default: list[str] = []
    for name, value in entries:
        if value is None:
            if name not in CONFIG_BY_NAME:
                raise InvalidConfigError(name, None, f"unknown topic config; known configs: "
                                                     f"{', '.join(CONFIG_BY_NAME)}")
            to_default.append(name)
        else:
            to_set[name] = value
    return to_set, to_default


def known_config(name: str) -> str:
    """``name``, a topic config's; else 404 ``unknown_config``."""
    if name not in CONFIG_BY_NAME:
        raise UnknownConfigError(f"topic config {name!r} does not exist; known configs: "
                                 f"{', '.join(CONFIG_BY_NAME)}")
    return name


def _partitions_count(new: NewTopic) -> int:
    """The partition count, from ``partitions_count`` or ``replicas_assignments``, whose
    replicas must be what this cluster places (one broker: only itself)."""
    if new.replicas_assignments is None:
        return 1 if new.partitions_count is None else new.partitions_count
    ids = sorted(a.partition_id for a in new.replicas_assignments)
    if ids != list(range(len(ids))):
        raise InvalidPartitionsError(f"replicas_assignments must name partitions "
                                     f"0..{len(ids) - 1} once each, got {ids}")
    if new.partitions_count not in (None, len(ids)):
        raise InvalidPartitionsError(f"partitions_count {new.partitions_count} and "
                                     f"{len(ids)} replicas_assignments disagree")
    for a in new.replicas_assignments:
        placed = list(METADATA.placement(new.name, a.partition_id).replicas)
        if list(a.broker_ids) != placed:
            raise InvalidReplicaAssignmentError(
                f"partition {a.partition_id}: replicas {list(a.broker_ids)} cannot be placed: "
                f"lakelog is one broker (id {placed[0]}), so each partition's replicas are "
                f"{placed}")
    return len(ids)
