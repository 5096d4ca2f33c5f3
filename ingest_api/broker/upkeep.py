"""The broker's background tasks: the upkeep of segments, and the expiry of consumer
group members (with the groups' subscriptions written for the SQL views)."""

from __future__ import annotations

import asyncio
import logging

from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.subscriptions import SubscriptionWriter
from ingest_api.settings import ApiSettings
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.hot.log_manager import LogManager

log = logging.getLogger(__name__)
SESSION_CHECK_S = 0.1


async def upkeep(manager: LogManager, tiered: TieredStorage, settings: ApiSettings) -> None:
    """Roll segments older than segment.ms even when nothing is produced (they become
    tierable) and those whose records wait for Delta longer than half their topic's
    delta.target.lag.ms, and drop hot segments that are tiered and past local retention."""
    while True:
        await asyncio.sleep(settings.roll_check_interval_ms / 1000)
        try:
            await asyncio.to_thread(manager.roll_due_segments)
        except Exception:
            log.exception("rolling quiet segments failed")
        try:
            await asyncio.to_thread(tiered.roll_for_target_lag)
        except Exception:
            log.exception("rolling segments for delta.target.lag.ms failed")
        try:
            await asyncio.to_thread(tiered.retire, manager.clock.now_ms())
        except Exception:
            log.exception("removing tiered hot segments failed")


def write_subscriptions(writer: SubscriptionWriter, groups: dict[str, list[str]]) -> bool:
    try:
        writer.write(groups)
    except OSError:
        log.exception("writing the consumer groups' subscriptions to %s failed", writer.data_dir)
        return False
    return True


async def expire_sessions(groups: GroupCoordinator, subscriptions: SubscriptionWriter) -> None:
    """Remove group members whose session timed out (their partitions move), and write
    the groups' subscriptions for the SQL views when membership changed."""
    written = groups.membership_version
    while True:
        await asyncio.sleep(SESSION_CHECK_S)
        for group, member in groups.expire_sessions():
            log.info("consumer group %s: member %s missed its session timeout and was removed",
                     group, member)
        if groups.membership_version != written:
            version = groups.membership_version
            if await asyncio.to_thread(write_subscriptions, subscriptions,
                                       groups.subscriptions()):
                written = version  # else: tried again at the next check
