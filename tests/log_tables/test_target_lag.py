"""delta.target.lag.ms: the server rolls a partition's active segment once its first
record has waited half the target, leaves the sync to the group commit (the tiering
job only hears of the segment once it is durable), and rolls no more while older
sealed segments wait for tiering."""

from __future__ import annotations

import pytest

from log_tables.clock import ManualClock
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.config import TopicConfig
from log_tables.errors import InvalidConfigError
from log_tables.hot.hot_reader import recovery_point
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.layout import Layout
from tests.conftest import OpenLog
from tests.log_tables.helpers import append_n, mark_tiered


def test_the_target_is_a_topic_config_with_a_default_and_an_off_value() -> None:
    assert TopicConfig().delta_target_lag_ms == 60_000
    assert TopicConfig().to_kafka()["delta.target.lag.ms"] == "60000"
    assert TopicConfig.from_overrides({"delta.target.lag.ms": "-1"}).delta_target_lag_ms == -1
    for bad in ("0", "-2", "soon"):
        with pytest.raises(InvalidConfigError, match=r"delta\.target\.lag\.ms"):
            TopicConfig.from_overrides({"delta.target.lag.ms": bad})


class HeldFlushes:
    """A flush scheduler that only records what it is asked (the test runs the flush)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(self, plog: PartitionLog, offset: int) -> None:
        self.asked.append(offset)


def test_roll_if_older_counts_from_the_first_record_and_leaves_the_sync_to_the_scheduler(
        open_log: OpenLog, clock: ManualClock) -> None:
    plog = open_log()
    held = HeldFlushes()
    plog.flush_scheduler = held
    notified: list[int] = []
    plog.roll_listeners.append(lambda _, seg: notified.append(seg.base_offset))
    clock.advance(50_000)  # an empty segment's age does not count: nothing waits in it
    append_n(plog, 3)
    assert plog.roll_if_older(1_000) is None
    clock.advance(999)
    append_n(plog, 2)
    assert plog.roll_if_older(1_000) is None  # the first record has waited 999 ms
    clock.advance(1)
    sealed = plog.roll_if_older(1_000)
    assert sealed is not None and sealed.next_offset == 5
    # The sync is the group commit's: until it ran, no recovery point and no listener,
    # so the tiering job (woken by the listener, bounded by the checkpoint) waits.
    assert held.asked == [5] and notified == []
    assert recovery_point(plog.directory) == 0
    plog.flush(5)
    assert notified == [0] and recovery_point(plog.directory) == 5
    assert plog.roll_if_older(0) is None  # the new active segment is empty


def test_the_server_rolls_for_the_target_and_not_again_before_tiering(
        manager: LogManager) -> None:
    clock = manager.clock
    assert isinstance(clock, ManualClock)
    meta = manager.create_topic("t", 2, {"delta.target.lag.ms": "2000"})
    manager.create_topic("off", 1, {"delta.target.lag.ms": "-1"})
    layout = Layout.of(manager.data_dir)
    tiered = TieredStorage(manager, layout)
    t0, t1, off = manager.log("t", 0), manager.log("t", 1), manager.log("off", 0)
    for plog in (t0, off):
        append_n(plog, 4)
    clock.advance(999)
    assert tiered.roll_for_target_lag() == 0  # half the target is 1,000 ms
    clock.advance(1)
    assert tiered.roll_for_target_lag() == 1  # t-0; t-1 holds nothing, "off" has no target
    assert [s.base_offset for s in t0.segments] == [0, 4]
    assert len(t1.segments) == 1 and len(off.segments) == 1
    manager.group_commit.request(t0, 4).result(10)  # the background sync, done
    append_n(t0, 3)
    clock.advance(5_000)
    assert tiered.roll_for_target_lag() == 0  # 0..3 is not tiered yet: no second roll
    mark_tiered(layout, "t", meta.topic_id, 0, 4)
    assert tiered.roll_for_target_lag() == 1
    assert [s.base_offset for s in t0.segments] == [0, 4, 7]
