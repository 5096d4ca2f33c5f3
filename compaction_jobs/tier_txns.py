"""A committed transaction's records of one topic reach its Delta table in one commit,
never in part (what Kafka cannot give a reader of its segments): each partition's
tiering end is lowered, segment boundary by segment boundary, until every committed
transaction with records below some partition's end has all of them below every end.

Transactions are told apart by producer id and the epoch of their records (each ends
with a new epoch). Only the partitions this job tiers are seen: in a cluster, a
transaction over partitions led by two brokers is tiered by each in its own commit.
"""

from __future__ import annotations

from collections.abc import Mapping

from log_tables.hot.txn_index import TxnId

OPEN_END = 2**63 - 1
"""The last offset of a transaction without a marker yet in a partition."""


def whole_transactions(ends: Mapping[int, int], boundaries: Mapping[int, list[int]],
                       spans: Mapping[int, Mapping[TxnId, tuple[int, int]]]
                       ) -> dict[int, int]:
    """Each partition's end (from ``ends``; ``boundaries``: the ends it may take, its
    floor first, ascending), lowered so that no transaction of ``spans`` (per partition,
    each committed transaction's first and last offset there) is tiered in part."""
    out = dict(ends)
    txns = {t for per in spans.values() for t in per}
    cut = True
    while cut:
        cut = False
        for t in txns:
            where = {p: per[t] for p, per in spans.items() if t in per and p in out}
            below = [p for p, (first, _) in where.items() if first < out[p]]
            if not below or all(last < out[p] for p, (_, last) in where.items()):
                continue
            for p in below:
                first = where[p][0]
                out[p] = max((b for b in boundaries[p] if b <= first), default=boundaries[p][0])
                cut = True
    return out
