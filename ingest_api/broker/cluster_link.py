"""The broker's side of a cluster: which broker a request belongs to (a partition's
leader, a group's coordinator, the controller), and the coordinator slots made on the
first group request.

Kafka's brokers answer NOT_LEADER; lakelog's forward what belongs to another broker, so
that any broker answers any request, as the issue of the cluster asks. The forwarding is
the front's (``ingest_api.http.forwarding``); it reaches the others through ``peers``
(``ingest_api.broker.peers``). A forwarded request is never forwarded again: if this
broker does not lead the partition either (the metadata moved meanwhile), ``route``
raises NOT_LEADER_OR_FOLLOWER and the first broker's caller tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from cluster.broker import ClusterBroker
from cluster.model import OFFSETS_TOPIC, BrokerInfo
from cluster.replica_manager import ReplicaManager
from consumer_groups.hashing import group_slot
from ingest_api.broker.peers import Peers
from log_tables.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    LeaderNotAvailableError,
    NotControllerError,
    NotLeaderError,
    TopicExistsError,
    UnknownTopicError,
)
from log_tables.registry import SCHEMAS_CONFIGS, SCHEMAS_TOPIC, TXN_STATE_TOPIC

log = logging.getLogger(__name__)

LOAD_WAIT_S = 5.0
"""How long a group request waits for its coordinator (this broker) to load the group."""


class ClusterLink:
    """Routing for one broker of a cluster; ``peers``: the other brokers."""

    def __init__(self, broker: ClusterBroker, peers: Peers, *, offsets_slots: int,
                 txn_slots: int = 16) -> None:
        self.broker = broker
        self.peers = peers
        self.broker_id = broker.broker_id
        self.offsets_slots = offsets_slots
        self.txn_slots = txn_slots
        self.txn_epoch: Callable[[int], int | None] | None = None
        """The epoch at which this broker serves a transaction coordinator slot it leads
        (None: still loading it); set once the slots are followed (``TxnSlots``)."""
        self.replicas: ReplicaManager | None = None
        """Set once replication starts (after the broker joined)."""
        self.coordinator_epoch: Callable[[str], int | None] | None = None
        """The epoch at which this broker coordinates a group it leads the slot of (None:
        still loading it); set once the groups' slots are followed
        (``ingest_api.broker.group_slots``)."""

    async def close(self) -> None:
        await self.peers.close()

    # -- where -----------------------------------------------------------------------
    def ensure_topic(self, topic: str) -> None:
        if not self.broker.ensure_topic(topic):
            raise UnknownTopicError(topic)

    def route(self, topic: str, partition: int, forwarded: bool) -> int | BrokerInfo:
        """The leader epoch when this broker leads the partition; else the leader's
        broker to forward to. A forwarded request is never forwarded again."""
        try:
            return self.broker.check_leader(topic, partition)
        except NotLeaderError:
            if forwarded:
                raise
            leader = self.broker.view.leader(topic, partition)
            info = self.broker.view.broker(leader)
            if info is None:
                raise LeaderNotAvailableError(
                    f"{topic}-{partition}: its leader, broker {leader}, is not registered "
                    f"(down or restarting); try again") from None
            return info

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool:
        """After an append: this broker still leads at the same epoch and its lease holds,
        so the append may be acknowledged."""
        return (self.broker.leads(topic, partition)
                and self.broker.view.leader_epoch(topic, partition) == epoch)

    def coordinator(self, group: str) -> BrokerInfo | None:
        """The group's coordinator: the leader of coordinator slot hash(group) % slots;
        None when that is this broker."""
        slot = group_slot(group, self.offsets_slots)
        if self.broker.view.topic(OFFSETS_TOPIC) is None:
            raise CoordinatorNotAvailableError(
                "the consumer group coordinator slots are being created; try again")
        leader = self.broker.view.leader(OFFSETS_TOPIC, slot)
        if leader == self.broker_id:
            if not self.broker.session.has_lease:
                raise CoordinatorNotAvailableError(
                    f"broker {self.broker_id} has lost touch with ZooKeeper; try again")
            if self.coordinator_epoch is not None and self.coordinator_epoch(group) is None:
                raise CoordinatorLoadInProgressError(
                    f"group {group!r} (slot {slot}) moved to broker {self.broker_id} a moment "
                    f"ago, which is reading its committed offsets; try again")
            return None
        info = self.broker.view.broker(leader)
        if info is None:
            raise CoordinatorNotAvailableError(
                f"the coordinator of group {group!r} (slot {slot}, broker {leader}) is down; "
                f"try again")
        return info

    async def coordinator_of(self, group: str) -> BrokerInfo | None:
        """``coordinator``, making the coordinator slots first when the cluster has none
        yet (Kafka makes ``__consumer_offsets`` on the first group request too, so that
        the slots spread over the brokers running by then). A slot this broker has just
        come to lead is waited for while it loads (up to ``LOAD_WAIT_S``: a read of the
        offsets table), so that a client without retries (curl) is not answered
        ``coordinator_load_in_progress`` by the first request of a new cluster."""
        if self.broker.view.topic(OFFSETS_TOPIC) is None and \
                not await asyncio.to_thread(self.broker.ensure_topic, OFFSETS_TOPIC):
            await self._create_offsets_topic()
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            try:
                return self.coordinator(group)
            except CoordinatorLoadInProgressError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def _create_offsets_topic(self) -> None:
        controller = self.controller()
        if controller is None:
            def create() -> None:
                with contextlib.suppress(TopicExistsError):
                    controller = self.broker.controller
                    factor = min(controller.offsets_topic_replication_factor,
                                 len(self.broker.view.live_brokers()))
                    controller.create_topic(OFFSETS_TOPIC, self.offsets_slots, max(1, factor),
                                            {}, 0)
            await asyncio.to_thread(create)
        else:
            with contextlib.suppress(TopicExistsError):
                await self.peers.create_topic(controller, OFFSETS_TOPIC, self.offsets_slots)
        await asyncio.to_thread(self.broker.ensure_topic, OFFSETS_TOPIC)

    def txn_coordinator(self, tid: str) -> BrokerInfo | None:
        """The transactional id's coordinator: the leader of its ``__transaction_state``
        partition; None when that is this broker (serving it)."""
        slot = group_slot(tid, self.txn_slots)
        if self.broker.view.topic(TXN_STATE_TOPIC) is None:
            raise CoordinatorNotAvailableError(
                "the transaction coordinators' state log is being created; try again")
        leader = self.broker.view.leader(TXN_STATE_TOPIC, slot)
        if leader == self.broker_id:
            if not self.broker.session.has_lease:
                raise CoordinatorNotAvailableError(
                    f"broker {self.broker_id} has lost touch with ZooKeeper; try again")
            if self.txn_epoch is None or self.txn_epoch(slot) is None:
                raise CoordinatorLoadInProgressError(
                    f"transactional id {tid!r} (slot {slot}) moved to broker {self.broker_id} "
                    "a moment ago, which is loading its state; try again")
            return None
        info = self.broker.view.broker(leader) if leader is not None and leader >= 0 else None
        if info is None:
            raise CoordinatorNotAvailableError(
                f"the coordinator of transactional id {tid!r} (slot {slot}) is down; try again")
        return info

    async def txn_coordinator_of(self, tid: str) -> BrokerInfo | None:
        """``txn_coordinator``, making ``__transaction_state`` first when the cluster has
        none (replicated like Kafka's: up to 3 copies, min.insync.replicas up to 2), and
        waiting a moment for a slot this broker has just come to lead to load."""
        if self.broker.view.topic(TXN_STATE_TOPIC) is None and \
                not await asyncio.to_thread(self.broker.ensure_topic, TXN_STATE_TOPIC):
            await self._create_txn_topic()
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            try:
                return self.txn_coordinator(tid)
            except (CoordinatorLoadInProgressError, CoordinatorNotAvailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _create_txn_topic(self) -> None:
        await self._create_internal(TXN_STATE_TOPIC, self.txn_slots, {})

    async def _create_internal(self, topic: str, partitions: int,
                               configs: dict[str, str]) -> None:
        """Make one of lakelog's own topics, replicated like Kafka's: up to 3 copies,
        min.insync.replicas up to 2 (``TopicAdmin`` gives the same when the controller
        is another broker)."""
        controller = self.controller()
        factor = max(1, min(3, len(self.broker.view.live_brokers())))
        configs = {"min.insync.replicas": str(min(2, factor)), **configs}
        if controller is None:
            def create() -> None:
                with contextlib.suppress(TopicExistsError):
                    self.broker.controller.create_topic(topic, partitions, factor, configs, 0)
            await asyncio.to_thread(create)
        else:
            with contextlib.suppress(TopicExistsError):
                await self.peers.create_topic(controller, topic, partitions)
        await asyncio.to_thread(self.broker.ensure_topic, topic)

    async def schemas_leader(self) -> BrokerInfo | None:
        """The broker serving the schema registry (the leader of ``__schemas``-0); None
        when it is this one (come to lead a moment ago: ask the registry again); made
        first when the cluster has none."""
        if self.broker.view.topic(SCHEMAS_TOPIC) is None and \
                not await asyncio.to_thread(self.broker.ensure_topic, SCHEMAS_TOPIC):
            await self._create_internal(SCHEMAS_TOPIC, 1, dict(SCHEMAS_CONFIGS))
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            leader = self.broker.view.leader(SCHEMAS_TOPIC, 0)
            info = self.broker.view.broker(leader) if leader >= 0 else None
            if leader == self.broker_id:
                return None
            if info is not None:
                return info
            if time.monotonic() > deadline:
                raise CoordinatorNotAvailableError(
                    "the schema registry's partition (__schemas-0) has no leader; try again")
            await asyncio.sleep(0.05)

    def controller(self) -> BrokerInfo | None:
        """The controller's broker; None when it is this one."""
        if self.broker.controller.active:
            return None
        cid = self.broker.view.controller_id
        info = self.broker.view.broker(cid) if cid is not None else None
        if info is None:
            raise NotControllerError("no controller is elected right now; try again")
        return info
