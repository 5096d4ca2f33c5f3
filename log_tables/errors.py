"""lakelog's one table of errors: every error it raises on purpose, by what it is.

Each class says, as aiokafka's errors do, ``code`` (lakelog's name: the ``error`` of a
body on the wire), ``retriable`` (trying again later can succeed), ``kafka_name`` and
``kafka_code`` (Kafka's error and its number, where Kafka has one), and, per instance, a
``detail`` where one error has finer causes (``log_tables.error_root`` has the root and
Kafka's codes). How a front answers each (an HTTP status, Confluent's ``error_code``) is
the front's: ``ingest_api.http.errors`` maps every class of ``ERRORS``. The table lives
on the lowest floor because every package raises these and the client
(``lakelog.client.errors``, which must not import the server) reads bodies back into
them by name. The log's, the groups' (``consumer_groups.errors`` re-exports them) and
topic administration's errors are here; a cluster's in ``log_tables.cluster_errors``,
transactions' in ``log_tables.txn_errors``, the schema registry's in
``log_tables.schema_errors``;
a request's form, security and look-ups in ``log_tables.request_errors``.
"""

from __future__ import annotations

import errno as _errno

from log_tables.error_root import KAFKA_CODES as KAFKA_CODES  # the table's, with the root
from log_tables.error_root import LakelogError as LakelogError
from log_tables.moved import moved

DISK_FULL = "disk_full"
"""``StorageError.detail`` of a full disk (ENOSPC, EDQUOT)."""
CONSUMER = "consumer"
"""``UnknownMemberError.detail`` of a group's consumer looked up by id."""


class InvalidTopicError(LakelogError):
    kafka_name = "INVALID_TOPIC_EXCEPTION"
    code = "invalid_topic"


class TopicExistsError(LakelogError):
    kafka_name = "TOPIC_ALREADY_EXISTS"
    code = "topic_already_exists"


class UnknownTopicError(LakelogError):
    kafka_name = "UNKNOWN_TOPIC_OR_PARTITION"
    code = "unknown_topic_or_partition"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class UnknownTopicIdError(LakelogError):
    """A request named a topic by an id it no longer has: the topic was deleted (and
    maybe made again under its name, with a new id)."""

    kafka_name = "UNKNOWN_TOPIC_ID"
    code = "unknown_topic_id"

    def __init__(self, topic: str, topic_id: str) -> None:
        super().__init__(f"topic {topic!r} has no id {topic_id!r}: it was deleted (and made "
                         "again under its name); positions in the old one do not carry over")
        self.topic = topic


class UnknownPartitionError(LakelogError):
    kafka_name = "UNKNOWN_TOPIC_OR_PARTITION"
    code = "unknown_topic_or_partition"

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        super().__init__(
            f"partition {partition} of topic {topic!r} does not exist "
            f"(the topic has partitions 0..{partitions - 1})"
        )
        self.topic = topic
        self.partition = partition


class InvalidPartitionsError(LakelogError):
    kafka_name = "INVALID_PARTITIONS"
    code = "invalid_partitions"


class InvalidConfigError(LakelogError):
    kafka_name = "INVALID_CONFIG"
    code = "invalid_config"

    def __init__(self, name: str, value: object, reason: str) -> None:
        super().__init__(f"invalid value {value!r} for config {name!r}: {reason}")
        self.name = name
        self.value = value


class InvalidOptionError(LakelogError):
    """A read option (Spark source, read_topic) that cannot be used as given."""

    code = "invalid_option"


class InvalidRecordError(LakelogError):
    kafka_name = "INVALID_RECORD"
    code = "invalid_record"


class RecordTooLargeError(LakelogError):
    """A record or batch exceeds ``max.message.bytes`` or ``segment.bytes``."""

    kafka_name = "MESSAGE_TOO_LARGE"
    code = "record_too_large"


class OffsetOutOfRangeError(LakelogError):
    """A read asked for an offset outside ``[log_start_offset, high_watermark]``."""

    kafka_name = "OFFSET_OUT_OF_RANGE"
    code = "offset_out_of_range"

    def __init__(self, where: str, offset: int, log_start_offset: int, high_watermark: int) -> None:
        super().__init__(
            f"offset {offset} is out of range for {where}: "
            f"valid offsets are {log_start_offset}..{high_watermark}"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class CorruptRecordError(LakelogError):
    """Bytes on disk failed a CRC or format check; they are never served as data.

    A read that reaches a damaged batch also says which offsets it hides
    (``first_offset`` .. ``next_offset - 1``) and so where to seek to skip them, and,
    once known, the topic and partition. Not retriable: the bytes stay damaged until
    an operator restores the file or the readers skip the offsets. A 4xx, not a 5xx:
    asking again cannot help (Kafka's CORRUPT_MESSAGE is retriable because there it
    means damage in transit); the reader must seek past them.
    """

    kafka_name = "CORRUPT_MESSAGE"
    code = "corrupt_record"

    def __init__(self, path: str, position: int, reason: str, *,
                 first_offset: int | None = None, next_offset: int | None = None,
                 topic: str | None = None, partition: int | None = None) -> None:
        where = f"topic {topic!r} partition {partition}: " if topic is not None else ""
        if first_offset is not None and next_offset is not None:
            message = (f"{where}offsets {first_offset}..{next_offset - 1} are in a damaged "
                       f"batch in {path} at byte {position} ({reason}) and cannot be read; "
                       f"seek to offset {next_offset} to skip them")
        else:
            message = f"{where}corrupt batch in {path} at byte {position}: {reason}"
        super().__init__(message)
        self.path = path
        self.position = position
        self.reason = reason
        self.first_offset = first_offset
        self.next_offset = next_offset
        self.topic = topic
        self.partition = partition

    def located(self, topic: str, partition: int) -> CorruptRecordError:
        """The same error, naming the topic and partition it was found in."""
        return CorruptRecordError(self.path, self.position, self.reason,
                                  first_offset=self.first_offset, next_offset=self.next_offset,
                                  topic=topic, partition=partition)


class CorruptIndexError(LakelogError):
    code = "corrupt_index"


class IndexOrderError(LakelogError):
    """An index append that is not strictly after the last entry."""

    code = "index_out_of_order"


class LogClosedError(LakelogError):
    code = "log_closed"
    retriable = True


class StorageError(LakelogError):
    """An I/O error or a full disk; the batch was not appended."""

    kafka_name = "KAFKA_STORAGE_ERROR"
    code = "storage_error"
    retriable = True

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        if errno_ in (_errno.ENOSPC, _errno.EDQUOT):  # a front may answer it apart
            self.detail = DISK_FULL


class StaleTableError(StorageError):
    """A Delta table left by an earlier topic of the same name: never trusted."""

    code = "stale_table"
    retriable = False


class QueueFullError(LakelogError):
    """A bounded queue is full; try again later."""

    code = "queue_full"
    retriable = True


class OutOfOrderSequenceError(LakelogError):
    """An idempotent producer's sequence skipped ahead or went back past the dedup window."""

    kafka_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    code = "out_of_order_sequence"


class InvalidProducerEpochError(LakelogError):
    """A producer epoch older than the current one: the producer is fenced."""

    kafka_name = "INVALID_PRODUCER_EPOCH"
    code = "invalid_producer_epoch"


class UnknownProducerIdError(LakelogError):
    kafka_name = "UNKNOWN_PRODUCER_ID"
    code = "unknown_producer_id"


class DataDirLockedError(LakelogError):
    code = "data_dir_locked"


# -- consumer groups (``consumer_groups.errors`` re-exports these) -----------------------


class UnknownGroupError(LakelogError):
    kafka_name = "GROUP_ID_NOT_FOUND"
    code = "group_id_not_found"

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist")


class UnknownMemberError(LakelogError):
    """The member left, timed out or was replaced: rejoin (member epoch 0). ``detail``
    ``CONSUMER``: a look-up of a group's consumer (not a member's own call) found none."""

    kafka_name = "UNKNOWN_MEMBER_ID"
    code = "unknown_member_id"

    def __init__(self, group: str, member: str | None) -> None:
        super().__init__(f"member {member!r} is not in consumer group {group!r} (it left, "
                         "missed its session timeout or was replaced): join again")


class StaleMemberEpochError(LakelogError):
    """A call with an epoch other than the member's current one: a zombie, fenced."""

    kafka_name = "STALE_MEMBER_EPOCH"
    code = "stale_member_epoch"

    def __init__(self, group: str, member: str, given: int, current: int) -> None:
        super().__init__(f"member {member!r} of consumer group {group!r} sent epoch {given}, "
                         f"its current epoch is {current}: the call is fenced (heartbeat to "
                         "get the current epoch and assignment, or join again)")


class GroupNotEmptyError(LakelogError):
    kafka_name = "NON_EMPTY_GROUP"
    code = "non_empty_group"

    def __init__(self, group: str, members: int, action: str) -> None:
        super().__init__(f"consumer group {group!r} has {members} active member(s): stop them "
                         f"before you {action}")


class InconsistentGroupError(LakelogError):
    """A join that does not fit the group (another assignor, too many members)."""

    kafka_name = "INCONSISTENT_GROUP_PROTOCOL"
    code = "inconsistent_group_protocol"


class NoOffsetError(LakelogError):
    """auto.offset.reset = none and no committed offset (or it is out of range)."""

    code = "no_offset_for_partition"


# -- topic administration (``ingest_api.broker.topics``) ----------------------------------


class InvalidReplicationFactorError(LakelogError):
    """A replication factor below 1, or above the brokers that could hold the replicas."""

    kafka_name, code = "INVALID_REPLICATION_FACTOR", "invalid_replication_factor"


class InvalidReplicaAssignmentError(LakelogError):
    """Replicas asked of brokers that do not exist, twice of one broker, or for partitions
    the request does not name."""

    kafka_name, code = "INVALID_REPLICA_ASSIGNMENT", "invalid_replica_assignment"


# -- a cluster's, a request's: their own modules, gathered here --------------------------
from log_tables.cluster_errors import *  # noqa: E402, F403
from log_tables.cluster_errors import CLUSTER_ERRORS  # noqa: E402
from log_tables.request_errors import *  # noqa: E402, F403
from log_tables.request_errors import REQUEST_ERRORS  # noqa: E402
from log_tables.schema_errors import *  # noqa: E402, F403
from log_tables.schema_errors import SCHEMA_ERRORS  # noqa: E402
from log_tables.txn_errors import *  # noqa: E402, F403
from log_tables.txn_errors import TXN_ERRORS  # noqa: E402

# -- the table ---------------------------------------------------------------------------

DOMAIN_ERRORS: tuple[type[LakelogError], ...] = (
    LakelogError, InvalidTopicError, TopicExistsError, UnknownTopicError, UnknownTopicIdError,
    UnknownPartitionError, InvalidPartitionsError, InvalidConfigError, InvalidOptionError,
    InvalidRecordError, RecordTooLargeError, OffsetOutOfRangeError, CorruptRecordError,
    CorruptIndexError, IndexOrderError, LogClosedError, StorageError, StaleTableError,
    QueueFullError, OutOfOrderSequenceError, InvalidProducerEpochError, UnknownProducerIdError,
    DataDirLockedError, UnknownGroupError, UnknownMemberError, StaleMemberEpochError,
    GroupNotEmptyError, InconsistentGroupError, NoOffsetError, InvalidReplicationFactorError,
    InvalidReplicaAssignmentError, *CLUSTER_ERRORS, *TXN_ERRORS, *SCHEMA_ERRORS,
)
"""The errors of the log, the groups, topic administration and a cluster: the client
raises each as its class (``except RecordTooLargeError``)."""

ERRORS: tuple[type[LakelogError], ...] = (*DOMAIN_ERRORS, *REQUEST_ERRORS)
"""Every error class lakelog raises on purpose: the one table. ``REQUEST_ERRORS`` (a
request's form, security, look-ups of admin calls) a client reads by name (``error``)."""

BY_NAME: dict[str, type[LakelogError]] = {}
for _cls in ERRORS:
    BY_NAME.setdefault(_cls.code, _cls)  # a name two classes share goes to the first
SHARED_NAMES = frozenset(c.code for c in ERRORS if BY_NAME[c.code] is not c)
"""Names of more than one class (``unknown_topic_or_partition``: a topic's, a partition's;
a front tells them apart by its own codes)."""


def for_name(error: str | None) -> type[LakelogError]:
    """The first class of the table with this name; ``LakelogError`` for what it does not
    know."""
    return BY_NAME.get(error or "", LakelogError)


# An error body's class by its Confluent code is the HTTP front's now (the codes left this
# floor); bodies are typed by name in lakelog.client.errors.class_of.
__getattr__ = moved(__name__, {"for_code": "ingest_api.http.errors"})
