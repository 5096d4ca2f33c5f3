"""Where a topic's typed table stands, per partition: the offset it covers up to and the
records its dead-letter table holds (from the tables' logs alone: no data is read)."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import pyarrow as pa

from log_tables.cold.table import open_table
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata
from log_tables.typed.columns import typed_app_id


class TypedPartition(NamedTuple):
    partition: int
    typed_offset: int
    dead_letters: int


def typed_status(layout: Layout, meta: TopicMetadata) -> list[TypedPartition]:
    """Per partition of a typed or upsert topic (none for a raw one)."""
    if meta.config.delta_table_mode == "raw":
        return []
    typed = open_table(layout.typed_uri(meta.name))
    dlq = open_table(layout.dlq_uri(meta.name))
    dead: Counter[int] = Counter()
    if dlq is not None:
        actions = pa.table(dlq.get_add_actions(flatten=True))
        if actions.num_rows:
            for p, n in zip(actions.column("partition.partition").to_pylist(),
                            actions.column("num_records").to_pylist(), strict=True):
                dead[int(p)] += int(n or 0)
    return [TypedPartition(p, (typed.transaction_version(typed_app_id(p)) or 0)
                           if typed is not None else 0, dead[p])
            for p in range(meta.partitions)]
