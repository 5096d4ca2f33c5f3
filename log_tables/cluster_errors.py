"""The errors of a cluster and its replicas: all but the ISR's retriable (the request goes
to another broker, or again later). Part of ``log_tables.errors``'s one table, which
gathers them; import them from there. (kafka_name, code, retriable) on one line each.
"""

from __future__ import annotations

from log_tables.error_root import LakelogError


class NotLeaderError(LakelogError):
    """This broker does not lead the partition (any more): go where the metadata says."""
    kafka_name, code, retriable = "NOT_LEADER_OR_FOLLOWER", "not_leader_or_follower", True


class LeaderNotAvailableError(LakelogError):
    """The partition has no leader now (its broker is down, or an election is under way)."""
    kafka_name, code, retriable = "LEADER_NOT_AVAILABLE", "leader_not_available", True


class NotControllerError(LakelogError):
    """This broker is not (or no longer) the controller."""
    kafka_name, code, retriable = "NOT_CONTROLLER", "not_controller", True


class BrokerNotAvailableError(LakelogError):
    """The broker a request must go to did not answer (or ZooKeeper is out of reach)."""
    kafka_name, code, retriable = "BROKER_NOT_AVAILABLE", "broker_not_available", True


class NotCoordinatorError(LakelogError):
    """This broker does not coordinate the group (the coordinator slots moved)."""
    kafka_name, code, retriable = "NOT_COORDINATOR", "not_coordinator", True


class CoordinatorNotAvailableError(LakelogError):
    """The group's coordinator broker is down or not yet chosen."""
    kafka_name, code, retriable = "COORDINATOR_NOT_AVAILABLE", "coordinator_not_available", True


class CoordinatorLoadInProgressError(LakelogError):
    """The group's coordinator moved here a moment ago and is still reading the group's
    committed offsets."""
    kafka_name, code, retriable = (
        "COORDINATOR_LOAD_IN_PROGRESS", "coordinator_load_in_progress", True)


class NotEnoughReplicasError(LakelogError):
    """acks=all: the partition has fewer in-sync replicas than ``min.insync.replicas``; the
    records were not appended (send them again later, or with acks=1)."""
    kafka_name, code, retriable = "NOT_ENOUGH_REPLICAS", "not_enough_replicas", True


class NotEnoughReplicasAfterAppendError(LakelogError):
    """acks=all: the records were appended, but the in-sync replicas fell below
    ``min.insync.replicas`` before they all had them: not acknowledged (an idempotent
    producer's retry is answered with the offsets they got)."""
    kafka_name, code, retriable = (
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "not_enough_replicas_after_append", True)


class FencedLeaderEpochError(LakelogError):
    """A replica fetch named an older leader epoch than the leader's: the follower's
    metadata is stale (it looks again)."""
    kafka_name, code, retriable = "FENCED_LEADER_EPOCH", "fenced_leader_epoch", True


class UnknownLeaderEpochError(LakelogError):
    """A replica fetch named a newer leader epoch than this broker knows: its metadata is
    behind (the follower tries again)."""
    kafka_name, code, retriable = "UNKNOWN_LEADER_EPOCH", "unknown_leader_epoch", True


class RequestTimedOutError(LakelogError):
    """acks=all: the in-sync replicas did not all have the records within the request's
    timeout; they may still be (an idempotent producer's retry is answered once)."""
    kafka_name, code, retriable = "REQUEST_TIMED_OUT", "request_timed_out", True


class IsrConflictError(LakelogError):
    """The partition state changed since the caller read it (its znode version moved):
    read it again and decide anew (Kafka's INVALID_UPDATE_VERSION)."""

    kafka_name, code, retriable = "INVALID_UPDATE_VERSION", "isr_conflict", True

    def __init__(self, message: str, topic: str, partition: int,
                 current: object | None = None, version: int = -1) -> None:
        super().__init__(message)
        self.topic, self.partition = topic, partition
        self.current, self.version = current, version
        """What ZooKeeper held when the write was refused (a ``cluster.model.PartitionState``;
        None: not read)."""


class IsrFencedError(IsrConflictError):
    """The caller no longer leads the partition at its leader epoch: it must stop acting as
    its leader, not retry (Kafka's FENCED_LEADER_EPOCH)."""

    kafka_name, code, retriable = "FENCED_LEADER_EPOCH", "fenced_leader_epoch", False


class InvalidIsrError(LakelogError):
    """A new ISR that cannot be: empty, without the leader, with a duplicate or a broker
    that is not a replica of the partition (Kafka's INVALID_REQUEST)."""

    kafka_name, code = "INVALID_REQUEST", "invalid_isr"


CLUSTER_ERRORS: tuple[type[LakelogError], ...] = (
    NotLeaderError, LeaderNotAvailableError, NotControllerError, BrokerNotAvailableError,
    CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError,
    NotEnoughReplicasError, NotEnoughReplicasAfterAppendError, FencedLeaderEpochError,
    UnknownLeaderEpochError, RequestTimedOutError, IsrConflictError, IsrFencedError,
    InvalidIsrError,
)

__all__ = [
    "CLUSTER_ERRORS",
    "BrokerNotAvailableError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "FencedLeaderEpochError",
    "InvalidIsrError",
    "IsrConflictError",
    "IsrFencedError",
    "LeaderNotAvailableError",
    "NotControllerError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "RequestTimedOutError",
    "UnknownLeaderEpochError",
]
