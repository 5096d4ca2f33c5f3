"""Which coordinator slot a consumer group belongs to, as Kafka computes it:
``abs(groupId.hashCode()) % offsets.topic.num.partitions`` with Java's String hash."""

from __future__ import annotations


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: 31-based over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def group_slot(group: str, slots: int) -> int:
    """Kafka's ``Utils.abs`` maps MIN_VALUE to 0 rather than overflowing."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % slots
