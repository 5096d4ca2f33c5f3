"""What a front hands the produce service: a request's records as columns.

Keys and values are Arrow binary arrays (null for a null), the rest numpy columns with
``-1`` for "not given" (the broker picks the partition, stamps the time, or the record
has no producer fields), or ``None`` when no record of the request gives that field, so
the common request (keys and values only) is looked at in a few vectorized calls. The
columns are lakelog's own: a front decodes its wire format (the HTTP front: Confluent's
JSON envelopes) into them, and nothing here knows it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from log_tables.errors import LakelogError

Headers = list[dict[str, Any]]
"""A record's headers as the log stores them: ``[{"key": str, "value": bytes | None}]``."""


class ProducerColumns(NamedTuple):
    """Per record: producer id, epoch and sequence; ``-1`` where a field is not given."""

    ids: np.ndarray
    epochs: np.ndarray
    sequences: np.ndarray

    @classmethod
    def of(cls, producers: Sequence[tuple[int, int, int] | None]) -> ProducerColumns:
        """From one ``(id, epoch, sequence)`` or None per record."""
        rows = [p if p is not None else (-1, -1, -1) for p in producers]
        table = np.array(rows, np.int64).reshape(len(rows), 3)
        return cls(table[:, 0], table[:, 1], table[:, 2])

    def at(self, i: int) -> tuple[int, int, int] | None:
        """Record ``i``'s ``(id, epoch, sequence)``, or None without producer fields."""
        if self.ids[i] < 0:
            return None
        return int(self.ids[i]), int(self.epochs[i]), int(self.sequences[i])


@dataclass(slots=True)
class ProduceRequest:
    """A produce request's records, one column each field."""

    keys: pa.Array | list[bytes | None]
    """Binary (or, for a few records, a list); null for a record without a key."""
    values: pa.Array | list[bytes | None]
    """Binary (or, for a few records, a list); null for a null value."""
    timestamps: np.ndarray | None = None
    """int64 epoch milliseconds; -1: the broker's time. None: every record's."""
    headers: list[Headers | None] | None = None
    """Per record (None: no headers); None when no record has any."""
    partitions: np.ndarray | None = None
    """int64; -1: the broker picks (by key, or spread). None: for every record."""
    producers: ProducerColumns | None = None
    """None when no record carries a producer field."""
    invalid: dict[int, LakelogError] = field(default_factory=dict)
    """Records the front found invalid while decoding them (a time it cannot read)."""
    transactional_id: str | None = None
    """Set: the records are writes of this transactional id's open transaction (every
    record carries the producer's fields)."""
    verified: set[int] = field(default_factory=set)
    """Partitions whose transactional write the coordinator (on another broker) said
    belongs to the open transaction (``transactions.gate``)."""

    def __len__(self) -> int:
        return len(self.keys)

    def key_array(self) -> pa.Array:
        """The keys as an Arrow binary array (made once from a list)."""
        if isinstance(self.keys, list):
            self.keys = binary_column(self.keys)
        return self.keys

    def value_array(self) -> pa.Array:
        if isinstance(self.values, list):
            self.values = binary_column(self.values)
        return self.values

    def key_list(self) -> list[bytes | None]:
        return self.keys if isinstance(self.keys, list) else self.keys.to_pylist()

    def value_list(self) -> list[bytes | None]:
        return self.values if isinstance(self.values, list) else self.values.to_pylist()

    def key_sizes(self) -> list[int]:
        """Each key's bytes (0 for a null)."""
        if isinstance(self.keys, list):
            return [0 if k is None else len(k) for k in self.keys]
        offsets = np.frombuffer(self.keys.buffers()[1], np.int32, len(self.keys) + 1,
                                self.keys.offset * 4)
        return np.diff(offsets).tolist()  # type: ignore[no-any-return]


def binary_column(items: Sequence[bytes | None]) -> pa.Array:
    """Bytes (or None) as an Arrow binary column."""
    return pa.array(items, pa.binary())


def optional_column(items: Sequence[Any], field: Callable[[Any], int | None]
                    ) -> np.ndarray | None:
    """Each item's ``field`` as an int64 column with -1 for None; None when every one is
    None. Without a None (an idempotent request's producer fields), no list is made."""
    if items and field(items[0]) is not None:
        with contextlib.suppress(TypeError):  # a None further on
            return np.fromiter(map(field, items), np.int64, len(items))
    values = list(map(field, items))
    missing = values.count(None)
    if missing == len(values):
        return None
    if not missing:
        return np.array(values, np.int64)
    return np.array([-1 if i is None else i for i in values], np.int64)
