"""lakelog's one error root, every error that goes on the wire, and the table of them.

Each class says, as aiokafka's errors do, what the server sends and the client reads:
``kafka_name`` (Kafka's error name, where Kafka has one), ``code`` (lakelog's name:
the body's ``error``), ``status`` (the HTTP status), ``error_code`` (the body's
``error_code``: Confluent's where Confluent names one, else the status times 100 plus
a detail number) and ``retriable`` (trying again later can succeed). The body carries
all but ``kafka_name``; ``ERRORS`` and ``for_code()`` at the end turn a body back into
its class. The table lives here, on the lowest floor, because both the server
(``ingest_api.http.errors`` renders the bodies) and the client (``lakelog.client.errors``,
which must not import the server) import it; the consumer group errors are here too
(``consumer_groups.errors`` re-exports them) so that the table is one literal list.
"""

from __future__ import annotations

import errno as _errno


class LakelogError(Exception):
    """Root of every error lakelog raises on purpose; subclasses carry data."""

    kafka_name: str | None = None
    code = "lakelog_error"
    status = 400
    error_code = 40000
    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidTopicError(LakelogError):
    kafka_name = "INVALID_TOPIC_EXCEPTION"
    code = "invalid_topic"
    status = 400
    error_code = 40002


class TopicExistsError(LakelogError):
    kafka_name = "TOPIC_ALREADY_EXISTS"
    code = "topic_already_exists"
    status = 400
    error_code = 40002


class UnknownTopicError(LakelogError):
    kafka_name = "UNKNOWN_TOPIC_OR_PARTITION"
    code = "unknown_topic_or_partition"
    status = 404
    error_code = 40403

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class UnknownTopicIdError(LakelogError):
    """A request named a topic by an id it no longer has: the topic was deleted (and
    maybe made again under its name, with a new id)."""

    kafka_name = "UNKNOWN_TOPIC_ID"
    code = "unknown_topic_id"
    status = 404
    error_code = 40403

    def __init__(self, topic: str, topic_id: str) -> None:
        super().__init__(f"topic {topic!r} has no id {topic_id!r}: it was deleted (and made "
                         "again under its name); positions in the old one do not carry over")
        self.topic = topic


class UnknownPartitionError(LakelogError):
    kafka_name = "UNKNOWN_TOPIC_OR_PARTITION"
    code = "unknown_topic_or_partition"
    status = 404
    error_code = 40402

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
    status = 400
    error_code = 40003


class InvalidConfigError(LakelogError):
    kafka_name = "INVALID_CONFIG"
    code = "invalid_config"
    status = 400
    error_code = 40004

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
    status = 422
    error_code = 42201


class RecordTooLargeError(LakelogError):
    """A record or batch exceeds ``max.message.bytes`` or ``segment.bytes``."""

    kafka_name = "MESSAGE_TOO_LARGE"
    code = "record_too_large"
    status = 413
    error_code = 41301


class OffsetOutOfRangeError(LakelogError):
    """A read asked for an offset outside ``[log_start_offset, high_watermark]``."""

    kafka_name = "OFFSET_OUT_OF_RANGE"
    code = "offset_out_of_range"
    status = 416
    error_code = 41601

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
    status = 410
    error_code = 41001

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
    status = 503
    error_code = 50301
    retriable = True


class StorageError(LakelogError):
    """An I/O error or a full disk; the batch was not appended."""

    kafka_name = "KAFKA_STORAGE_ERROR"
    code = "storage_error"
    status = 500
    error_code = 50001
    retriable = True

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        if errno_ in (_errno.ENOSPC, _errno.EDQUOT):  # a full disk: 507 Insufficient Storage
            self.status, self.error_code = 507, 50701


class StaleTableError(StorageError):
    """A Delta table left by an earlier topic of the same name: never trusted."""

    code = "stale_table"
    retriable = False


class QueueFullError(LakelogError):
    """A bounded queue is full; try again later."""

    code = "queue_full"
    status = 429
    error_code = 42901
    retriable = True


class OutOfOrderSequenceError(LakelogError):
    """An idempotent producer's sequence skipped ahead or went back past the dedup window."""

    kafka_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    code = "out_of_order_sequence"
    status = 409
    error_code = 40904


class InvalidProducerEpochError(LakelogError):
    """A producer epoch older than the current one: the producer is fenced."""

    kafka_name = "INVALID_PRODUCER_EPOCH"
    code = "invalid_producer_epoch"
    status = 409
    error_code = 40903


class UnknownProducerIdError(LakelogError):
    kafka_name = "UNKNOWN_PRODUCER_ID"
    code = "unknown_producer_id"
    status = 404
    error_code = 40404


class DataDirLockedError(LakelogError):
    code = "data_dir_locked"


# -- consumer groups (``consumer_groups.errors`` re-exports these) -----------------------


class UnknownGroupError(LakelogError):
    kafka_name = "GROUP_ID_NOT_FOUND"
    code = "group_id_not_found"
    status = 404
    error_code = 40405

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist")


class UnknownMemberError(LakelogError):
    """The member left, timed out or was replaced: rejoin (member epoch 0)."""

    kafka_name = "UNKNOWN_MEMBER_ID"
    code = "unknown_member_id"
    status = 404
    error_code = 40406

    def __init__(self, group: str, member: str | None) -> None:
        super().__init__(f"member {member!r} is not in consumer group {group!r} (it left, "
                         "missed its session timeout or was replaced): join again")


class StaleMemberEpochError(LakelogError):
    """A call with an epoch other than the member's current one: a zombie, fenced."""

    kafka_name = "STALE_MEMBER_EPOCH"
    code = "stale_member_epoch"
    status = 409
    error_code = 40905

    def __init__(self, group: str, member: str, given: int, current: int) -> None:
        super().__init__(f"member {member!r} of consumer group {group!r} sent epoch {given}, "
                         f"its current epoch is {current}: the call is fenced (heartbeat to "
                         "get the current epoch and assignment, or join again)")


class GroupNotEmptyError(LakelogError):
    kafka_name = "NON_EMPTY_GROUP"
    code = "non_empty_group"
    status = 409
    error_code = 40906

    def __init__(self, group: str, members: int, action: str) -> None:
        super().__init__(f"consumer group {group!r} has {members} active member(s): stop them "
                         f"before you {action}")


class InconsistentGroupError(LakelogError):
    """A join that does not fit the group (another assignor, too many members)."""

    kafka_name = "INCONSISTENT_GROUP_PROTOCOL"
    code = "inconsistent_group_protocol"
    status = 400
    error_code = 40005


class NoOffsetError(LakelogError):
    """auto.offset.reset = none and no committed offset (or it is out of range)."""

    code = "no_offset_for_partition"
    status = 416
    error_code = 41602


class InvalidReplicationFactorError(LakelogError):  # ingest_api.broker.topics'
    kafka_name, code, status, error_code = ("INVALID_REPLICATION_FACTOR",
                                             "invalid_replication_factor", 400, 40005)
class UnknownConfigError(LakelogError):  # a topic config named in a request's path
    code, status, error_code = "unknown_config", 404, 40409


# -- a cluster and its replicas: log_tables.cluster_errors (imported here for the table) --
from log_tables import cluster_errors as _cluster  # noqa: E402

BrokerNotAvailableError = _cluster.BrokerNotAvailableError
CoordinatorLoadInProgressError = _cluster.CoordinatorLoadInProgressError
CoordinatorNotAvailableError = _cluster.CoordinatorNotAvailableError
FencedLeaderEpochError = _cluster.FencedLeaderEpochError
LeaderNotAvailableError = _cluster.LeaderNotAvailableError
NotControllerError = _cluster.NotControllerError
NotCoordinatorError = _cluster.NotCoordinatorError
NotEnoughReplicasAfterAppendError = _cluster.NotEnoughReplicasAfterAppendError
NotEnoughReplicasError = _cluster.NotEnoughReplicasError
NotLeaderError = _cluster.NotLeaderError
RequestTimedOutError = _cluster.RequestTimedOutError
UnknownLeaderEpochError = _cluster.UnknownLeaderEpochError


# -- the table ---------------------------------------------------------------------------

ERRORS: tuple[type[LakelogError], ...] = (
    LakelogError, InvalidTopicError, TopicExistsError, UnknownTopicError, UnknownTopicIdError,
    UnknownPartitionError,
    InvalidPartitionsError, InvalidConfigError, InvalidOptionError, InvalidRecordError,
    RecordTooLargeError, OffsetOutOfRangeError, CorruptRecordError, CorruptIndexError,
    IndexOrderError, LogClosedError, StorageError, StaleTableError, QueueFullError,
    OutOfOrderSequenceError, InvalidProducerEpochError, UnknownProducerIdError,
    DataDirLockedError, UnknownGroupError, UnknownMemberError, StaleMemberEpochError,
    GroupNotEmptyError, InconsistentGroupError, NoOffsetError, NotLeaderError,
    LeaderNotAvailableError, NotControllerError, BrokerNotAvailableError,
    CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError,
    NotEnoughReplicasError,
    NotEnoughReplicasAfterAppendError, FencedLeaderEpochError, UnknownLeaderEpochError,
    RequestTimedOutError, InvalidReplicationFactorError, UnknownConfigError,
)
"""Every error class a body can name: the one table of codes, names and flags."""

BY_CODE: dict[int, tuple[type[LakelogError], ...]] = {}
for _cls in ERRORS:
    BY_CODE[_cls.error_code] = (*BY_CODE.get(_cls.error_code, ()), _cls)
BY_NAME: dict[str, type[LakelogError]] = {}
for _cls in ERRORS:
    BY_NAME.setdefault(_cls.code, _cls)  # a name two classes share goes to the first


def for_code(error_code: int, error: str | None = None) -> type[LakelogError]:
    """The class of an error body: by its ``error_code``; by its ``error`` name where
    one code has several classes (Confluent's 40002 is both a taken and an invalid topic
    name) or none; ``LakelogError`` for what the table does not know."""
    found = BY_CODE.get(error_code, ())
    if found and (error is None or (len(found) == 1 and found[0].code == error)):
        return found[0]  # without a name, a shared code's first class
    for cls in found:
        if cls.code == error:
            return cls
    return BY_NAME.get(error or "", LakelogError)
