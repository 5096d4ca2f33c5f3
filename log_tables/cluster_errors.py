"""The errors of a cluster and its replicas: all retriable (the request goes to another
broker, or again later). Part of ``log_tables.errors``'s one table, which imports them;
import them from there. (kafka_name, code, status, error_code, retriable) on one line each.
"""

from __future__ import annotations

from log_tables.errors import LakelogError


class NotLeaderError(LakelogError):
    """This broker does not lead the partition (any more): go where the metadata says."""
    kafka_name, code, status, error_code, retriable = (
        "NOT_LEADER_OR_FOLLOWER", "not_leader_or_follower", 421, 42101, True)


class LeaderNotAvailableError(LakelogError):
    """The partition has no leader now (its broker is down, or an election is under way)."""
    kafka_name, code, status, error_code, retriable = (
        "LEADER_NOT_AVAILABLE", "leader_not_available", 503, 50302, True)


class NotControllerError(LakelogError):
    """This broker is not (or no longer) the controller."""
    kafka_name, code, status, error_code, retriable = (
        "NOT_CONTROLLER", "not_controller", 503, 50304, True)


class BrokerNotAvailableError(LakelogError):
    """The broker a request must go to did not answer (or ZooKeeper is out of reach)."""
    kafka_name, code, status, error_code, retriable = (
        "BROKER_NOT_AVAILABLE", "broker_not_available", 503, 50305, True)


class NotCoordinatorError(LakelogError):
    """This broker does not coordinate the group (the coordinator slots moved)."""
    kafka_name, code, status, error_code, retriable = (
        "NOT_COORDINATOR", "not_coordinator", 421, 42102, True)


class CoordinatorNotAvailableError(LakelogError):
    """The group's coordinator broker is down or not yet chosen."""
    kafka_name, code, status, error_code, retriable = (
        "COORDINATOR_NOT_AVAILABLE", "coordinator_not_available", 503, 50306, True)


class CoordinatorLoadInProgressError(LakelogError):
    """The group's coordinator moved here a moment ago and is still reading the group's
    committed offsets."""
    kafka_name, code, status, error_code, retriable = (
        "COORDINATOR_LOAD_IN_PROGRESS", "coordinator_load_in_progress", 503, 50310, True)


class NotEnoughReplicasError(LakelogError):
    """acks=all: the partition has fewer in-sync replicas than ``min.insync.replicas``; the
    records were not appended (send them again later, or with acks=1)."""
    kafka_name, code, status, error_code, retriable = (
        "NOT_ENOUGH_REPLICAS", "not_enough_replicas", 503, 50307, True)


class NotEnoughReplicasAfterAppendError(LakelogError):
    """acks=all: the records were appended, but the in-sync replicas fell below
    ``min.insync.replicas`` before they all had them: not acknowledged (an idempotent
    producer's retry is answered with the offsets they got)."""
    kafka_name, code, status, error_code, retriable = (
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "not_enough_replicas_after_append", 503, 50308, True)


class FencedLeaderEpochError(LakelogError):
    """A replica fetch named an older leader epoch than the leader's: the follower's
    metadata is stale (it looks again)."""
    kafka_name, code, status, error_code, retriable = (
        "FENCED_LEADER_EPOCH", "fenced_leader_epoch", 421, 42103, True)


class UnknownLeaderEpochError(LakelogError):
    """A replica fetch named a newer leader epoch than this broker knows: its metadata is
    behind (the follower tries again)."""
    kafka_name, code, status, error_code, retriable = (
        "UNKNOWN_LEADER_EPOCH", "unknown_leader_epoch", 503, 50309, True)


class RequestTimedOutError(LakelogError):
    """acks=all: the in-sync replicas did not all have the records within the request's
    timeout; they may still be (an idempotent producer's retry is answered once)."""
    kafka_name, code, status, error_code, retriable = (
        "REQUEST_TIMED_OUT", "request_timed_out", 504, 50401, True)
