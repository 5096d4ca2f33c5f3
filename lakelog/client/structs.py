"""The client's value types."""

from __future__ import annotations

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
