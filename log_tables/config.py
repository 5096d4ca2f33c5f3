"""Topic configs with Kafka's names, defaults and validation.

A topic stores only the configs set for it (its overrides), as Kafka does, so a
changed default applies to every topic that did not set its own value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from log_tables.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError

MAX_PARTITIONS = 10_000
MAX_TOPIC_NAME_CHARS = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
# lakelog's own Spark SQL views (``lakelog.views.register_views``), the one list of their
# names. A topic of one of these names would hide behind the view, since view names
# ignore case: such names are reserved, as Kafka reserves its internal topics' names.
LOG_VIEWS = ("partitions", "job_runs")
"""The log's views, registered by ``lakelog.views``."""
GROUP_VIEWS = ("consumer_offsets", "consumer_lag", "consumer_group_lag")
"""``consumer_groups.views``'s views."""
GROUP_HELPER_VIEWS = ("_consumer_offset_rows", "_consumer_group_subscriptions")
"""The views ``consumer_groups.views`` builds its own on."""
SQL_VIEW_NAMES = LOG_VIEWS + GROUP_VIEWS + GROUP_HELPER_VIEWS
_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1
# A segment's positions are u32 in the offset index and its header is 56 bytes:
# these bound segment.bytes from both sides.
MIN_SEGMENT_BYTES = 128
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
TABLE_MODES = ("raw", "typed", "upsert")
ERRORS_MODES = ("dlq", "suspend", "skip")


def validate_topic_name(name: str) -> None:
    """Kafka's rule: 1-249 chars of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``; and not the
    name of one of lakelog's SQL views."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("topic name must be a non-empty string")
    if len(name) > MAX_TOPIC_NAME_CHARS:
        raise InvalidTopicError(
            f"topic name {name[:40]!r}... is {len(name)} characters long; the maximum is "
            f"{MAX_TOPIC_NAME_CHARS}"
        )
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if name.lower() in SQL_VIEW_NAMES:
        raise InvalidTopicError(
            f"topic name {name!r} is reserved: lakelog's SQL view {name.lower()!r} has that "
            "name (Spark SQL names ignore case); choose another name")
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_' and '-'"
        )


def validate_partitions(count: object) -> int:
    """A partition count is an integer in 1..10,000."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidPartitionsError(f"partitions_count must be an integer, got {count!r}")
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"partitions_count must be between 1 and {MAX_PARTITIONS}, got {count}"
        )
    return count


def _long(low: int, high: int = _LONG_MAX) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise InvalidConfigError(name, raw, "expected an integer") from None
        if not low <= value <= high:
            raise InvalidConfigError(name, raw, f"must be between {low} and {high}")
        return value

    return parse


def _off_or_positive(name: str, raw: str) -> int:
    value = _long(-1)(name, raw)
    if value == 0:
        raise InvalidConfigError(name, raw, "must be -1 (off) or a positive number of "
                                            "milliseconds")
    return value


def _ratio(name: str, raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidConfigError(name, raw, "expected a number between 0 and 1") from None
    if not 0.0 <= value <= 1.0:
        raise InvalidConfigError(name, raw, "must be between 0 and 1")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = ",".join(part.strip() for part in str(raw).split(","))
        if value == "delete,compact":
            value = "compact,delete"
        if value not in options:
            raise InvalidConfigError(name, raw, f"must be one of {', '.join(options)}")
        return value

    return parse


def _boolean(name: str, raw: str) -> bool:
    """Kafka's boolean configs: "true" or "false" (any case), nothing else."""
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidConfigError(name, raw, "must be true or false")
    return value == "true"


SUBJECT_NAME_STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
"""Confluent's subject name strategies (a key's or value's subject: ``<topic>-value``, the
record's full name, or ``<topic>-<record's full name>``)."""


def _strategy(name: str, raw: str) -> str:
    """A strategy by its short name or Confluent's Java class name."""
    value = str(raw).strip().rsplit(".", 1)[-1]
    if value not in SUBJECT_NAME_STRATEGIES:
        raise InvalidConfigError(name, raw, f"must be one of {', '.join(SUBJECT_NAME_STRATEGIES)}"
                                            " (or Confluent's class name of one)")
    return value


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config: its Kafka name, default, parser and a line of doc."""

    name: str
    default: Any
    parse: Callable[[str, str], Any]
    doc: str


CONFIG_DEFS: tuple[ConfigDef, ...] = (
    ConfigDef("cleanup.policy", "delete", _choice(CLEANUP_POLICIES),
              "delete: drop old data by retention; compact: keep the latest value per key."),
    ConfigDef("retention.ms", 7 * 24 * 3600 * 1000, _long(-1),
              "How long a record is kept (by the newest timestamp of its file); -1: forever."),
    ConfigDef("retention.bytes", -1, _long(-1),
              "Maximum bytes kept per partition before whole old files go; -1: no limit."),
    ConfigDef("segment.bytes", 64 * 1024 * 1024, _long(MIN_SEGMENT_BYTES, _INT_MAX),
              "A hot segment is rolled when the next batch would make it larger than this."),
    ConfigDef("segment.ms", 10 * 60 * 1000, _long(1),
              "A non-empty hot segment older than this is rolled (and so becomes tierable)."),
    ConfigDef("index.interval.bytes", 4096, _long(0, _INT_MAX),
              "Bytes of log between two entries of the sparse offset and time indexes."),
    ConfigDef("max.message.bytes", 1024 * 1024, _long(0, _INT_MAX),
              "Largest stored batch; the server cuts records into batches under this and segment.bytes."),
    ConfigDef("message.timestamp.type", "CreateTime", _choice(TIMESTAMP_TYPES),
              "CreateTime keeps the producer's timestamp; LogAppendTime stamps the broker time."),
    ConfigDef("min.compaction.lag.ms", 0, _long(0),
              "Records younger than this are never compacted."),
    ConfigDef("max.compaction.lag.ms", _LONG_MAX, _long(1),
              "A partition with dirty records older than this is compacted regardless of ratio."),
    ConfigDef("delete.retention.ms", 24 * 3600 * 1000, _long(0),
              "How long a tombstone (null value) stays in a compacted topic."),
    ConfigDef("min.cleanable.dirty.ratio", 0.5, _ratio,
              "Compaction starts when dirty bytes / total bytes reaches this."),
    ConfigDef("local.retention.ms", 3600 * 1000, _long(-2),
              "How long the hot tier keeps segments already tiered to Delta; -2: retention.ms."),
    ConfigDef("local.retention.bytes", -2, _long(-2),
              "Hot-tier bytes kept per partition of tiered segments; -2: retention.bytes."),
    ConfigDef("compression.type", "producer", _choice(COMPRESSION_TYPES),
              "Kafka's codec names, accepted and kept for Kafka tools; lakelog stores hot "
              "batches as uncompressed Arrow and Delta files as Snappy Parquet whatever it says."),
    ConfigDef("delta.target.lag.ms", 60_000, _off_or_positive,
              "How soon a produced record should be in the topic's Delta table: the server "
              "rolls a partition's active segment once its first record is half this old "
              "(and the older segments are tiered), and the tiering job runs on each roll; "
              "-1: only segment.ms and segment.bytes roll."),
    ConfigDef("min.insync.replicas", 1, _long(1, _INT_MAX),
              "acks=all is refused (NOT_ENOUGH_REPLICAS) while the ISR has fewer replicas "
              "than this; may exceed the replication factor (then acks=all always fails)."),
    ConfigDef("unclean.leader.election.enable", False, _boolean,
              "With no in-sync replica alive, let an out-of-sync one lead (the partition "
              "comes back, but acknowledged records may be lost)."),
    ConfigDef("confluent.key.schema.validation", False, _boolean,
              "Refuse a record whose key is not in Confluent's wire format with a schema id "
              "registered under the key's subject (a null key passes)."),
    ConfigDef("confluent.value.schema.validation", False, _boolean,
              "The same for values (a null value, a tombstone, passes)."),
    ConfigDef("confluent.key.subject.name.strategy", "TopicNameStrategy", _strategy,
              "The key's subject for validation: TopicNameStrategy (<topic>-key), "
              "RecordNameStrategy (the record's full name), TopicRecordNameStrategy."),
    ConfigDef("confluent.value.subject.name.strategy", "TopicNameStrategy", _strategy,
              "The value's subject for validation, as for keys (<topic>-value)."),
    ConfigDef("delta.table.mode", "raw", _choice(TABLE_MODES),
              "What the topic's tables hold besides its log: raw (the Kafka columns only), "
              "typed (also <warehouse>/typed/<topic>: each value decoded with its schema id "
              "into columns) or upsert (that table holds the latest value per key)."),
    ConfigDef("delta.errors.mode", "dlq", _choice(ERRORS_MODES),
              "A record a typed or upsert table cannot decode: dlq (into "
              "<warehouse>/dlq/<topic> with its error and bytes), suspend (the partition's "
              "typed table stops there until the record is dealt with) or skip (counted and "
              "passed over)."),
)
CONFIG_BY_NAME: dict[str, ConfigDef] = {d.name: d for d in CONFIG_DEFS}


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """The effective configs of a topic (defaults overlaid with its overrides)."""

    cleanup_policy: str = "delete"
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 10 * 60 * 1000
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1024 * 1024
    message_timestamp_type: str = "CreateTime"
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LONG_MAX
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    local_retention_ms: int = 3600 * 1000
    local_retention_bytes: int = -2
    compression_type: str = "producer"
    delta_target_lag_ms: int = 60_000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    confluent_key_schema_validation: bool = False
    confluent_value_schema_validation: bool = False
    confluent_key_subject_name_strategy: str = "TopicNameStrategy"
    confluent_value_subject_name_strategy: str = "TopicNameStrategy"
    delta_table_mode: str = "raw"
    delta_errors_mode: str = "dlq"

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, object],
                       defaults: Mapping[str, object] | None = None) -> TopicConfig:
        """Validate Kafka-named overrides and overlay them on the defaults: ``defaults``
        (the broker's, as Kafka's broker configs such as ``min.insync.replicas``), then
        the built-in ones."""
        values: dict[str, Any] = {}
        for name, raw in {**(defaults or {}), **overrides}.items():
            definition = CONFIG_BY_NAME.get(name)
            if definition is None:
                raise InvalidConfigError(
                    name, raw, f"unknown topic config; known configs: {', '.join(CONFIG_BY_NAME)}"
                )
            if raw is None:
                raise InvalidConfigError(name, raw, "a value is required")
            values[_field(name)] = definition.parse(name, str(raw))
        return cls(**values)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def to_kafka(self) -> dict[str, str]:
        """Every config under its Kafka name, as strings (as Kafka's DescribeConfigs)."""
        out: dict[str, str] = {}
        for definition in CONFIG_DEFS:
            out[definition.name] = _kafka_string(getattr(self, _field(definition.name)))
        return out

    def replace(self, **changes: Any) -> TopicConfig:
        return dataclasses.replace(self, **changes)


def _field(kafka_name: str) -> str:
    return kafka_name.replace(".", "_")


def _kafka_string(value: object) -> str:
    """A config value as Kafka writes it (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_value(name: str, overrides: Mapping[str, object],
                 defaults: Mapping[str, object] | None = None) -> Any:
    """One config's effective value: the topic's override, else the broker's default in
    ``defaults``, else the built-in default (one config, without parsing the others)."""
    definition = CONFIG_BY_NAME[name]
    for source in (overrides, defaults or {}):
        raw = source.get(name)
        if raw is not None:
            return definition.parse(name, str(raw))
    return definition.default


def normalize_overrides(overrides: Mapping[str, object]) -> dict[str, str]:
    """Validate overrides and return them as canonical strings (what the registry stores)."""
    TopicConfig.from_overrides(overrides)
    out: dict[str, str] = {}
    for name, raw in overrides.items():
        value = CONFIG_BY_NAME[name].parse(name, str(raw))
        out[name] = _kafka_string(value)
    return out
