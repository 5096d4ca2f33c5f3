import pytest

from log_tables.config import (
    TopicConfig,
    normalize_overrides,
    validate_partitions,
    validate_topic_name,
)
from log_tables.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError


def test_defaults_match_kafka_names() -> None:
    kafka = TopicConfig().to_kafka()
    assert kafka["cleanup.policy"] == "delete"
    assert kafka["retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert kafka["retention.bytes"] == "-1"
    assert kafka["segment.bytes"] == str(64 * 1024 * 1024)
    assert kafka["segment.ms"] == str(600_000)
    assert kafka["index.interval.bytes"] == "4096"
    assert kafka["max.message.bytes"] == str(1024 * 1024)
    assert kafka["message.timestamp.type"] == "CreateTime"
    assert kafka["delete.retention.ms"] == str(86_400_000)
    assert kafka["min.cleanable.dirty.ratio"] == "0.5"
    assert {"min.compaction.lag.ms", "local.retention.ms", "local.retention.bytes"} <= set(kafka)


def test_overrides_are_parsed() -> None:
    config = TopicConfig.from_overrides(
        {"cleanup.policy": "delete, compact", "segment.bytes": "1024", "message.timestamp.type": "LogAppendTime"})
    assert config.cleanup_policy == "compact,delete" and config.compact and config.delete
    assert config.segment_bytes == 1024 and config.log_append_time


@pytest.mark.parametrize(("name", "value", "fragment"), [
    ("cleanup.policy", "shred", "cleanup.policy"),
    ("retention.ms", "soon", "retention.ms"),
    ("retention.ms", "-5", "retention.ms"),
    ("segment.bytes", "10", "segment.bytes"),
    ("min.cleanable.dirty.ratio", "1.5", "min.cleanable.dirty.ratio"),
    ("message.timestamp.type", "Now", "message.timestamp.type"),
    ("no.such.config", "1", "no.such.config"),
])
def test_invalid_values_name_the_config(name: str, value: str, fragment: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        normalize_overrides({name: value})
    assert fragment in err.value.message and value in err.value.message


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "ümlaut", "x" * 250, "a/b",
                                  "partitions", "Job_Runs", "consumer_lag"])
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["a", "A.b-c_9", "x" * 249, "..."])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("count", [0, -1, 10_001, "3", True, 2.0])
def test_invalid_partition_counts(count: object) -> None:
    with pytest.raises(InvalidPartitionsError):
        validate_partitions(count)


def test_partition_bounds_accepted() -> None:
    assert validate_partitions(1) == 1 and validate_partitions(10_000) == 10_000
