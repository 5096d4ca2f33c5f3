"""Step 3 of the controller: topic changes. Create (assign replicas over the live
brokers, rack-aware: ``cluster.assign``; write the topic and its partition states in one
transaction), add partitions, alter configs, delete: one transaction each, fenced by the
controller epoch (``cluster.controller_epoch``), or nothing.

Any broker takes these requests and forwards them to the controller
(``ingest_api/http/routers/topics.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping

from kazoo.exceptions import NodeExistsError, NoNodeError

from cluster.assign import assign_replicas
from cluster.controller_epoch import ControllerEpoch, Ops
from cluster.model import (
    TOPICS,
    PartitionState,
    TopicAssignment,
    decode,
    encode,
    partitions_path,
    state_path,
    topic_path,
)
from log_tables.errors import InvalidPartitionsError, TopicExistsError, UnknownTopicError

log = logging.getLogger("cluster.controller")  # the controller's one log, as before the split


class TopicChanges(ControllerEpoch):
    """The topics as ZooKeeper holds them, and the controller's changes to them."""

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     configs: Mapping[str, str], created_ms: int) -> TopicAssignment:
        with self._lock, self._reachable():
            self._require_active()
            live = self.live_brokers()
            brokers = [(b, info.rack) for b, (info, _) in live.items()]
            replicas = assign_replicas(name, brokers, partitions, replication_factor)
            assignment = TopicAssignment(replicas, dict(configs), uuid.uuid4().hex, created_ms)
            ops: Ops = [("create", (topic_path(name), encode(assignment)), {}),
                        ("create", (partitions_path(name), b""), {}),
                        *self._new_partitions(name, 0, replicas)]
            try:
                self._commit(ops)
            except NodeExistsError:
                raise TopicExistsError(f"topic {name!r} already exists") from None
            self._step("topic-written")
            log.info("created topic %s: replicas %s", name, replicas)
            return assignment

    def _topic(self, name: str) -> tuple[TopicAssignment, int]:
        """A topic's assignment and its znode's version (for a conditional write)."""
        try:
            data, stat = self.client.get(topic_path(name))
        except NoNodeError:
            raise UnknownTopicError(name) from None
        return decode(data, TopicAssignment), stat.version

    def _assignments(self, only: str | None = None) -> Iterator[tuple[str, TopicAssignment]]:
        """Every topic (or ``only``) with its assignment, as ZooKeeper holds it now."""
        for topic in [only] if only is not None else self.client.get_children(TOPICS):
            try:
                yield topic, decode(self.client.get(topic_path(topic))[0], TopicAssignment)
            except NoNodeError:
                if only is not None:
                    raise UnknownTopicError(only) from None

    def _new_partitions(self, name: str, first: int, replicas: list[list[int]]) -> Ops:
        """Creating partitions ``first..`` with their first state: the first replica
        leads at leader epoch 0, every replica in the ISR (Kafka: every live one; they
        were assigned over the live brokers, and an empty log is in sync)."""
        ops: Ops = []
        for p, rs in enumerate(replicas, start=first):
            ops.append(("create", (f"{partitions_path(name)}/{p}", b""), {}))
            ops.append(("create", (state_path(name, p), encode(
                PartitionState(rs[0], 0, list(rs), self.epoch))), {}))
        return ops

    def add_partitions(self, name: str, partitions: int) -> TopicAssignment:
        with self._lock, self._reachable():
            self._require_active()
            current, version = self._topic(name)
            if partitions < current.partitions:
                raise InvalidPartitionsError(f"topic {name!r} has {current.partitions} "
                                             f"partitions; the count can only grow")
            if partitions == current.partitions:
                return current
            live = self.live_brokers()
            brokers = [(b, info.rack) for b, (info, _) in live.items()]
            added = assign_replicas(name, brokers, partitions - current.partitions,
                                    current.replication_factor, current.partitions)
            updated = TopicAssignment(current.replicas + added, current.configs,
                                      current.topic_id, current.created_ms)
            self._commit([("set_data", (topic_path(name), encode(updated)),
                           {"version": version}),
                          *self._new_partitions(name, current.partitions, added)])
            return updated

    def set_configs(self, name: str, configs: Mapping[str, str]) -> TopicAssignment:
        with self._lock, self._reachable():
            self._require_active()
            current, version = self._topic(name)
            updated = TopicAssignment(current.replicas, dict(configs), current.topic_id,
                                      current.created_ms)
            self._commit([("set_data", (topic_path(name), encode(updated)),
                           {"version": version})])
            return updated

    def delete_topic(self, name: str) -> TopicAssignment:
        with self._lock, self._reachable():
            self._require_active()
            current, _ = self._topic(name)
            ops: Ops = []
            for p in range(current.partitions):
                ops.append(("delete", (state_path(name, p),), {}))
                ops.append(("delete", (f"{partitions_path(name)}/{p}",), {}))
            ops.append(("delete", (partitions_path(name),), {}))
            ops.append(("delete", (topic_path(name),), {}))
            self._commit(ops)
            return current
