import pytest

from log_tables.config import (
    TopicConfig,
    config_value,
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
    ("min.insync.replicas", "0", "min.insync.replicas"),
    ("min.insync.replicas", "two", "min.insync.replicas"),
    ("min.insync.replicas", str(2**31), "min.insync.replicas"),
    ("unclean.leader.election.enable", "yes", "unclean.leader.election.enable"),
    ("unclean.leader.election.enable", "1", "unclean.leader.election.enable"),
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


def test_replication_configs_have_kafkas_names_defaults_and_values() -> None:
    default = TopicConfig()
    assert (default.min_insync_replicas, default.unclean_leader_election_enable) == (1, False)
    kafka = default.to_kafka()
    assert kafka["min.insync.replicas"] == "1"
    assert kafka["unclean.leader.election.enable"] == "false"  # Kafka writes booleans so
    config = TopicConfig.from_overrides({"min.insync.replicas": " 2 ",
                                         "unclean.leader.election.enable": "TRUE"})
    assert (config.min_insync_replicas, config.unclean_leader_election_enable) == (2, True)
    assert normalize_overrides({"unclean.leader.election.enable": "True",
                                "min.insync.replicas": "5"}) == {
        "unclean.leader.election.enable": "true", "min.insync.replicas": "5"}
    # Above any replication factor is allowed (as Kafka allows it: acks=all then fails).
    assert TopicConfig.from_overrides({"min.insync.replicas": "32768"}).min_insync_replicas \
        == 32768


def test_broker_defaults_apply_where_a_topic_sets_nothing() -> None:
    broker = {"min.insync.replicas": "2", "unclean.leader.election.enable": "true"}
    config = TopicConfig.from_overrides({}, broker)
    assert (config.min_insync_replicas, config.unclean_leader_election_enable) == (2, True)
    own = TopicConfig.from_overrides({"min.insync.replicas": "3"}, broker)
    assert (own.min_insync_replicas, own.unclean_leader_election_enable) == (3, True)
    assert config_value("min.insync.replicas", {}, broker) == 2
    assert config_value("min.insync.replicas", {"min.insync.replicas": "1"}, broker) == 1
    assert config_value("unclean.leader.election.enable", {}, None) is False
    with pytest.raises(InvalidConfigError, match=r"min\.insync\.replicas"):
        TopicConfig.from_overrides({}, {"min.insync.replicas": "0"})
