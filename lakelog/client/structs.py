"""The client's value types."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was stored."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime


class Record(NamedTuple):
    """A record as ``Consumer.poll`` returns it (key and value decoded per ``format``)."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """Kafka's fetch settings of a ``Consumer``, with Kafka's meanings (sizes count the
    bytes of keys and values, as the server's ``max_bytes`` does)."""

    fetch_min_bytes: int = 1
    """Wait (up to ``fetch_max_wait_ms``) for this much data before answering. The server
    answers as soon as it has any record, so the client asks again for the rest."""
    fetch_max_bytes: int = 52_428_800
    """At most this much data in one answer (soft: a first record larger still comes)."""
    max_partition_fetch_bytes: int = 1_048_576
    """At most this much of one partition in one answer (soft, as ``fetch_max_bytes``)."""
    fetch_max_wait_ms: int = 500
    """How long one request waits on the server for ``fetch_min_bytes``."""
    max_poll_records: int = 500
    """At most this many records in one ``poll`` (and in one request)."""

    def __post_init__(self) -> None:
        if self.fetch_min_bytes < 0 or self.fetch_max_wait_ms < 0:
            raise ValueError("fetch_min_bytes and fetch_max_wait_ms must be 0 or more")
        if min(self.fetch_max_bytes, self.max_partition_fetch_bytes, self.max_poll_records) < 1:
            raise ValueError("fetch_max_bytes, max_partition_fetch_bytes and "
                             "max_poll_records must be 1 or more")
