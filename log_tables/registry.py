"""The topic registry: names, partition counts and config overrides, persisted crash-safely.

Everything lives in one JSON file (``<data_dir>/topics.json``) replaced by an
atomic rename, so a crash mid-write leaves the old or the new registry, never a mix.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from log_tables.clock import SYSTEM_CLOCK, Clock
from log_tables.config import (
    CONFIG_BY_NAME,
    TopicConfig,
    normalize_overrides,
    validate_partitions,
    validate_topic_name,
)
from log_tables.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from log_tables.files import atomic_write

REGISTRY_FILE = "topics.json"
TXN_STATE_TOPIC = "__transaction_state"
"""The transaction coordinators' state log (Kafka's name): one partition per slot."""
TXN_STATE_CONFIGS: Mapping[str, str] = {"segment.bytes": str(16 << 20)}
"""Its segments: small enough that those a compaction of its slots leaves below the log
start are deleted (``ingest_api.broker.transactions.cleaner``)."""
SCHEMAS_TOPIC = "__schemas"
"""The schema registry's records (Confluent's ``_schemas``): one partition, compacted."""
SCHEMAS_CONFIGS: Mapping[str, str] = {"cleanup.policy": "compact"}
INTERNAL_TOPICS: Mapping[str, str] = {
    TXN_STATE_TOPIC: "the transaction coordinators' state",
    SCHEMAS_TOPIC: "the schema registry's schemas",
}
"""lakelog's own topics (with what each holds): made by the broker, never by a user, and
in no listing."""
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic as registered."""

    name: str
    topic_id: str
    partitions: int
    overrides: Mapping[str, str] = field(default_factory=dict)
    """Configs set for this topic, by Kafka name (defaults are not stored)."""
    created_ms: int = 0

    @property
    def config(self) -> TopicConfig:
        """The topic's config: made once per distinct set of overrides (every produce
        request reads it; validating the overrides each time cost ~20 us)."""
        try:
            return _config_of(tuple(self.overrides.items()))
        except TypeError:  # an unhashable value: not cached
            return TopicConfig.from_overrides(self.overrides)

    def to_json(self) -> dict[str, object]:
        return {"topic_id": self.topic_id, "partitions": self.partitions,
                "configs": dict(self.overrides), "created_ms": self.created_ms}


@functools.lru_cache(maxsize=1024)
def _config_of(overrides: tuple[tuple[str, str], ...]) -> TopicConfig:
    return TopicConfig.from_overrides(dict(overrides))


class TopicRegistry:
    """Create, list, describe, alter and delete topics."""

    def __init__(self, data_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.data_dir = data_dir
        self.path = data_dir / REGISTRY_FILE
        self.clock = clock
        self._lock = threading.Lock()
        data_dir.mkdir(parents=True, exist_ok=True)
        self._topics = self._load()

    def _load(self) -> dict[str, TopicMetadata]:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise StorageError(f"{self.path} is not valid JSON ({exc}); restore it from a backup") from None
        if raw.get("version") != FORMAT_VERSION:
            raise StorageError(f"{self.path} has unknown format version {raw.get('version')!r}")
        return {
            name: TopicMetadata(name, t["topic_id"], int(t["partitions"]), dict(t["configs"]),
                                int(t.get("created_ms", 0)))
            for name, t in raw["topics"].items()
        }

    def _save(self, topics: dict[str, TopicMetadata]) -> None:
        body = {"version": FORMAT_VERSION,
                "topics": {name: t.to_json() for name, t in sorted(topics.items())}}
        try:
            atomic_write(self.path, json.dumps(body, indent=1).encode())
        except OSError as exc:
            raise StorageError(f"cannot write {self.path}: {exc.strerror}", exc.errno) from None
        self._topics = topics

    # -- queries -------------------------------------------------------------------
    def list(self, *, internal: bool = False) -> list[TopicMetadata]:
        """The users' topics; ``internal``: lakelog's own too (``INTERNAL_TOPICS``: no
        listing, view, job or tiering sees them)."""
        return [self._topics[name] for name in sorted(self._topics)
                if internal or name not in INTERNAL_TOPICS]

    def describe(self, name: str) -> TopicMetadata:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicError(name)
        return topic

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    # -- changes -------------------------------------------------------------------
    def create(self, name: str, partitions: int, configs: Mapping[str, object] | None = None,
               validate_only: bool = False) -> TopicMetadata:
        """Register a new topic; its name, partition count and configs are validated.
        ``validate_only``: only validate, and return the topic that would be made."""
        validate_topic_name(name)
        validate_partitions(partitions)
        overrides = normalize_overrides(configs or {})
        with self._lock:
            if name in self._topics:
                raise TopicExistsError(f"topic {name!r} already exists")
            clash = next((t for t in self._topics if t.lower() == name.lower()), None)
            if clash is not None:
                raise InvalidTopicError(
                    f"topic name {name!r} differs from the existing topic {clash!r} only in "
                    "case; Spark SQL names ignore case, so the two would share one view (and on "
                    "a case-insensitive file system, one directory)")
            topic = TopicMetadata(name, uuid.uuid4().hex, partitions, overrides,
                                  self.clock.now_ms())
            if not validate_only:
                self._save({**self._topics, name: topic})
            return topic

    def delete(self, name: str) -> TopicMetadata:
        with self._lock:
            topic = self.describe(name)
            topics = dict(self._topics)
            del topics[name]
            self._save(topics)
            return topic

    def alter_configs(self, name: str, set_configs: Mapping[str, object] | None = None,
                      delete_configs: Iterable[str] = (), validate_only: bool = False
                      ) -> TopicMetadata:
        """Set and/or remove (back to default) config overrides, atomically.
        ``validate_only``: only validate, and return the topic as it would be."""
        with self._lock:
            topic = self.describe(name)
            overrides = dict(topic.overrides)
            for key in delete_configs:
                if key not in CONFIG_BY_NAME:
                    raise InvalidConfigError(key, None, "unknown topic config")
                overrides.pop(key, None)
            overrides.update(normalize_overrides(set_configs or {}))
            updated = TopicMetadata(name, topic.topic_id, topic.partitions, overrides,
                                    topic.created_ms)
            if not validate_only:
                self._save({**self._topics, name: updated})
            return updated

    def mirror(self, topic: TopicMetadata) -> TopicMetadata | None:
        """Make the registered topic exactly ``topic`` (a cluster's broker mirrors what
        ZooKeeper holds); returns the topic it replaces, if any. A topic of the same name
        with another id is replaced whole (the caller drops its logs first)."""
        with self._lock:
            before = self._topics.get(topic.name)
            if before != topic:
                self._save({**self._topics, topic.name: topic})
            return before

    def add_partitions(self, name: str, partitions: int) -> TopicMetadata:
        """Raise a topic's partition count (never lower it, as in Kafka)."""
        validate_partitions(partitions)
        with self._lock:
            topic = self.describe(name)
            if partitions < topic.partitions:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {topic.partitions} partitions; the count can only grow")
            if partitions == topic.partitions:
                return topic
            updated = TopicMetadata(name, topic.topic_id, partitions, topic.overrides,
                                    topic.created_ms)
            self._save({**self._topics, name: updated})
            return updated
