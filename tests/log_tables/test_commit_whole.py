"""``commit_changes(..., whole=True)``: when another job committed one of the partitions
first, none of the changes is committed (a tiering of transactions planned on an older
table may hold part of one that the other job tiered whole). Without it, the partitions
nobody took are committed, as plain tiering wants. Real Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_tables.cold.commit import PartitionChange, commit_changes
from log_tables.cold.table import create_table, load_table, tier_app_id


def _change(p: int, to: int, planned_on: int) -> PartitionChange:
    return PartitionChange(p, [], [], {tier_app_id(p): to}, {tier_app_id(p): planned_on})


@pytest.mark.parametrize("whole", [False, True])
def test_a_partition_taken_first_loses_the_others_only_when_whole(tmp_path: Path,
                                                                  whole: bool) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, "topic-id")
    other = load_table(uri)  # another job: it tiers partition 0 first
    done, lost = commit_changes(other, [_change(0, 10, 0)], "tier", "other")
    assert [c.partition for c in done] == [0] and not lost
    mine = load_table(uri, 0)  # planned on the table before that commit
    dropped: list[int] = []
    done, lost = commit_changes(mine, [_change(0, 12, 0), _change(1, 7, 0)], "tier", "mine",
                                on_lost=lambda c: dropped.append(c.partition), whole=whole)
    table = load_table(uri)
    if whole:
        assert done == [] and sorted(c.partition for c in lost) == [0, 1]
        assert sorted(dropped) == [0, 1]
        assert table.transaction_version(tier_app_id(1)) is None
    else:
        assert [c.partition for c in done] == [1] and [c.partition for c in lost] == [0]
        assert dropped == [0]
        assert table.transaction_version(tier_app_id(1)) == 7
    assert table.transaction_version(tier_app_id(0)) == 10
