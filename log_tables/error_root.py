"""The root of every error lakelog raises on purpose, and Kafka's numeric error codes.

An error says what it is, never how a front answers it: ``code`` (lakelog's name of it,
the ``error`` of a body on the wire), ``retriable`` (trying again later can succeed),
``kafka_name`` and ``kafka_code`` (Kafka's error and its number in Kafka's protocol,
where Kafka has one) and, on an instance, ``detail`` (a finer cause a front may answer
apart: a full disk among storage failures). The HTTP status and Confluent code of each
are the HTTP front's (``ingest_api.http.errors``). The classes live in
``log_tables.errors`` and the modules it gathers; this module imports none of them.
"""

from __future__ import annotations

from typing import Any, TypeVar

KAFKA_CODES: dict[str, int] = {
    "UNKNOWN_SERVER_ERROR": -1, "OFFSET_OUT_OF_RANGE": 1, "CORRUPT_MESSAGE": 2, "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "LEADER_NOT_AVAILABLE": 5, "NOT_LEADER_OR_FOLLOWER": 6, "REQUEST_TIMED_OUT": 7,
    "BROKER_NOT_AVAILABLE": 8, "MESSAGE_TOO_LARGE": 10, "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15, "NOT_COORDINATOR": 16, "INVALID_TOPIC_EXCEPTION": 17,
    "NOT_ENOUGH_REPLICAS": 19, "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "INCONSISTENT_GROUP_PROTOCOL": 23, "UNKNOWN_MEMBER_ID": 25,
    "TOPIC_AUTHORIZATION_FAILED": 29, "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31, "TOPIC_ALREADY_EXISTS": 36, "INVALID_PARTITIONS": 37,
    "INVALID_REPLICATION_FACTOR": 38, "INVALID_REPLICA_ASSIGNMENT": 39, "INVALID_CONFIG": 40,
    "NOT_CONTROLLER": 41, "INVALID_REQUEST": 42, "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
    "INVALID_PRODUCER_EPOCH": 47, "SECURITY_DISABLED": 54, "KAFKA_STORAGE_ERROR": 56,
    "SASL_AUTHENTICATION_FAILED": 58, "UNKNOWN_PRODUCER_ID": 59, "NON_EMPTY_GROUP": 68,
    "GROUP_ID_NOT_FOUND": 69, "FENCED_LEADER_EPOCH": 74, "UNKNOWN_LEADER_EPOCH": 75,
    "NO_REASSIGNMENT_IN_PROGRESS": 85, "INVALID_RECORD": 87, "THROTTLING_QUOTA_EXCEEDED": 89,
    "RESOURCE_NOT_FOUND": 91, "INVALID_UPDATE_VERSION": 95, "UNKNOWN_TOPIC_ID": 100,
    "BROKER_ID_NOT_REGISTERED": 102, "INCONSISTENT_CLUSTER_ID": 104,
    "STALE_MEMBER_EPOCH": 113, "INVALID_PRODUCER_ID_MAPPING": 49,
    "INVALID_TRANSACTION_TIMEOUT": 50, "CONCURRENT_TRANSACTIONS": 51, "INVALID_TXN_STATE": 48,
    "UNSTABLE_OFFSET_COMMIT": 88, "PRODUCER_FENCED": 90, "TRANSACTIONAL_ID_NOT_FOUND": 105,
    "TRANSACTION_ABORTABLE": 120,
}
"""Kafka's numbers of the Kafka errors lakelog's errors are (``Errors.java`` of Apache
Kafka's clients, ``org.apache.kafka.common.protocol``)."""

E = TypeVar("E", bound="LakelogError")


class LakelogError(Exception):
    """Root of every error lakelog raises on purpose; subclasses carry data."""

    kafka_name: str | None = None
    kafka_code: int | None = None
    code = "lakelog_error"
    retriable = False
    detail: str | None = None
    """A finer cause of this instance (``StorageError``'s ``disk_full``); None: none."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kafka_code = KAFKA_CODES[cls.kafka_name] if cls.kafka_name else None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def saying(cls: type[E], message: str, **fields: Any) -> E:
        """This error with a message of the caller's own (and the fields it carries),
        not the one its constructor would write."""
        err = cls.__new__(cls)
        LakelogError.__init__(err, message)
        for name, value in fields.items():
            setattr(err, name, value)
        return err
