"""The error root of lakelog and the errors of the log layer.

Every error carries a stable ``code`` (used by the HTTP layer for its JSON body)
and a ``retriable`` flag that tells a client whether trying again can succeed.
"""

from __future__ import annotations


class LakelogError(Exception):
    """Root of every error lakelog raises on purpose."""

    code = "lakelog_error"
    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidTopicError(LakelogError):
    code = "invalid_topic"


class TopicExistsError(LakelogError):
    code = "topic_already_exists"


class UnknownTopicError(LakelogError):
    code = "unknown_topic_or_partition"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class UnknownPartitionError(LakelogError):
    code = "unknown_topic_or_partition"

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        super().__init__(
            f"partition {partition} of topic {topic!r} does not exist "
            f"(the topic has partitions 0..{partitions - 1})"
        )
        self.topic = topic
        self.partition = partition


class InvalidPartitionsError(LakelogError):
    code = "invalid_partitions"


class InvalidConfigError(LakelogError):
    code = "invalid_config"

    def __init__(self, name: str, value: object, reason: str) -> None:
        super().__init__(f"invalid value {value!r} for config {name!r}: {reason}")
        self.name = name
        self.value = value


class InvalidOptionError(LakelogError):
    """A read option (Spark source, read_topic) that cannot be used as given."""

    code = "invalid_option"


class InvalidRecordError(LakelogError):
    code = "invalid_record"


class RecordTooLargeError(LakelogError):
    """A record or batch exceeds ``max.message.bytes`` or ``segment.bytes``."""

    code = "record_too_large"


class OffsetOutOfRangeError(LakelogError):
    """A read asked for an offset outside ``[log_start_offset, high_watermark]``."""

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
    an operator restores the file or the readers skip the offsets.
    """

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

    code = "storage_error"
    retriable = True

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


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

    code = "out_of_order_sequence"


class InvalidProducerEpochError(LakelogError):
    """A producer epoch older than the current one: the producer is fenced."""

    code = "invalid_producer_epoch"


class UnknownProducerIdError(LakelogError):
    code = "unknown_producer_id"


class DataDirLockedError(LakelogError):
    code = "data_dir_locked"
