"""The leader's replica state on a real log: the high watermark is the smallest log end
in the ISR, acks=all waits end there, min.insync.replicas refuses before and after an
append, and followers leave and join the ISR by Kafka's caught-up rule."""

from __future__ import annotations

import pytest

from cluster.replicas import LeaderPartition
from log_tables.errors import (
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
)
from log_tables.hot.partition_log import PartitionLog
from tests.conftest import OpenLog
from tests.log_tables.helpers import batch_for


def _leader(plog: PartitionLog, isr: tuple[int, ...] = (1, 2, 3)) -> LeaderPartition:
    plog.start_replication()
    plog.become_leader(0)
    return LeaderPartition(plog, "t", 0, 1, 0, (1, 2, 3), isr, 0)


def _append(plog: PartitionLog, n: int) -> int:
    return plog.append(batch_for(plog.log_end_offset, n)).last_offset + 1


def test_high_watermark_is_the_smallest_log_end_in_the_isr(open_log: OpenLog) -> None:
    plog = open_log()
    lp = _leader(plog)
    end = _append(plog, 10)
    assert not lp.maybe_advance() and plog.high_watermark == 0  # followers not heard yet
    waited = lp.wait(end, 2)
    lp.on_fetch(2, 10)
    assert plog.high_watermark == 0 and not waited.done()  # follower 3 still at -1
    lp.on_fetch(3, 4)
    assert plog.high_watermark == 4 and not waited.done()
    assert lp.on_fetch(3, 10) and plog.high_watermark == 10
    assert waited.result(0) == 10
    assert not lp.on_fetch(3, 99)  # past the leader's end: ignored, not taken as caught up
    assert plog.high_watermark == 10 and lp.lag() == {2: 0, 3: 0}


def test_min_insync_replicas_refuses_before_and_after_the_append(open_log: OpenLog) -> None:
    plog = open_log()
    lp = _leader(plog, isr=(1, 2))
    lp.check_min_isr(2)
    with pytest.raises(NotEnoughReplicasError, match=r"min\.insync\.replicas=3"):
        lp.check_min_isr(3)
    end = _append(plog, 5)
    waited = lp.wait(end, 2)
    lp.set_isr([1], 1)  # follower 2 dropped before it had the records
    with pytest.raises(NotEnoughReplicasAfterAppendError):
        waited.result(0)
    assert lp.version == 1
    lp.set_isr([1, 2], 0)  # an older version changes nothing
    assert lp.isr == {1}
    again = lp.wait(_append(plog, 1), 1)
    lp.maybe_advance()  # the leader alone: its own log end
    assert again.result(0) == 6
    pending = lp.wait(99, 1)
    lp.close(NotLeaderError("moved"))
    with pytest.raises(NotLeaderError):
        pending.result(0)


def test_followers_leave_when_behind_too_long_and_join_when_caught_up(
        open_log: OpenLog) -> None:
    plog = open_log()
    lp = _leader(plog)
    start = lp.followers[2].last_caught_up_ms
    _append(plog, 10)
    lp.on_fetch(2, 10, at_ms=start + 100)  # at the leader's end: caught up now
    lp.on_fetch(3, 3, at_ms=start + 100)  # behind
    assert lp.out_of_sync(1000, at_ms=start + 900) == set()
    assert lp.out_of_sync(1000, at_ms=start + 1050) == {3}
    # Kafka's rule: a fetch that reaches the leader's end as of the previous fetch counts
    # as caught up at that previous fetch's time.
    _append(plog, 5)
    lp.on_fetch(3, 10, at_ms=start + 1100)
    assert lp.followers[3].last_caught_up_ms == start + 100
    lp.on_fetch(3, 15, at_ms=start + 1200)
    assert lp.out_of_sync(1000, at_ms=start + 1300) == {2}  # 2 has not fetched since
    lp.set_isr([1, 2], 1)
    now = start + 1300
    assert lp.caught_up(1000, {1, 2, 3}, at_ms=now) == {3}  # at the high watermark: may join
    assert lp.caught_up(1000, {1, 2}, at_ms=now) == set()  # ... unless its broker is gone
    assert lp.caught_up(1000, {1, 2, 3}, at_ms=now + 1000) == set()  # ... or silent
    lp.expanding({3})
    lp.on_fetch(2, 15)
    _append(plog, 1)
    lp.on_fetch(2, 16)
    assert plog.high_watermark == 15  # 3, joining, is counted from before the write
    lp.on_fetch(3, 16)
    assert plog.high_watermark == 16
