"""One read bound: every isolation level asks the hot log for its readable end, which
is the high watermark until transactions add the last stable offset; ``PartitionLog``
holds its ``LocalLog`` rather than being one."""

from __future__ import annotations

from pathlib import Path

from log_tables.hot.isolation import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Isolation,
    published_readable_end,
)
from log_tables.hot.local_log import LocalLog
from log_tables.hot.partition_log import PartitionLog
from tests.conftest import OpenLog
from tests.log_tables.helpers import batch_for


def test_both_levels_end_at_the_high_watermark(open_log: OpenLog, tmp_path: Path) -> None:
    plog = open_log(tmp_path / "p")
    plog.append(batch_for(0, 5))
    assert [plog.readable_end(i) for i in Isolation] == [5, 5]  # one replica: the log end
    assert published_readable_end(plog.directory, 5, READ_COMMITTED) == 5  # no mark
    plog.start_replication()
    plog.append(batch_for(5, 5))
    assert plog.advance_high_watermark(7)
    assert plog.readable_end(READ_UNCOMMITTED) == plog.readable_end(READ_COMMITTED) == 7
    for isolation in Isolation:
        result = plog.read(0, isolation=isolation)
        assert result.high_watermark == 7
        assert sum(b.records.num_rows for b in result.batches) == 7
    plog.checkpoint_high_watermark()
    assert published_readable_end(plog.directory, 10, READ_COMMITTED) == 7
    assert published_readable_end(plog.directory, 6, READ_UNCOMMITTED) == 6
    plog.truncate_to(6)
    assert plog.readable_end(READ_COMMITTED) == 6 and plog.log_end_offset == 6


def test_the_partition_log_holds_its_local_log() -> None:
    assert not issubclass(PartitionLog, LocalLog)
