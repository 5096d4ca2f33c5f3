"""A group member's poll: records from its assigned partitions, from its positions.

A position starts at the group's committed offset, else where the member's
``auto_offset_reset`` says (earliest: the log start; latest: the high watermark;
none: an error). A position that retention or DeleteRecords left below the log
start is reset the same way. Partitions are visited in turn, starting one
further each poll, so that one busy partition cannot starve the others; with
nothing to return the poll waits (up to ``timeout_ms``) for any of them.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator, Member
from consumer_groups.errors import NoOffsetError
from consumer_groups.offsets import OffsetKey
from ingest_api.fetch import FetchService, Format, records_of
from ingest_api.models import FetchedRecord
from log_tables.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from log_tables.hot.log_manager import LogManager

_encoder = msgspec.json.Encoder()


class GroupPoll:
    def __init__(self, coordinator: GroupCoordinator, fetch: FetchService,
                 manager: LogManager) -> None:
        self.coordinator = coordinator
        self.fetch = fetch
        self.manager = manager

    def position(self, group: str, member: Member, tp: TopicPartition) -> int:
        """The member's position in ``tp``, resolved (and remembered) when it has none."""
        pos = member.positions.get(tp)
        if pos is None:
            committed = self.coordinator.store.latest.get(OffsetKey(group, *tp))
            pos = committed.offset if committed is not None else self._reset(member, tp, None)
            member.positions[tp] = pos
        return pos

    def _reset(self, member: Member, tp: TopicPartition, out_of_range: int | None) -> int:
        plog = self.manager.log(tp.topic, tp.partition)
        policy = member.auto_offset_reset
        if policy == "earliest":
            return self.fetch.tiered.log_start_offset(plog, tp.topic, tp.partition)
        if policy == "latest":
            return plog.high_watermark
        if out_of_range is None:
            raise NoOffsetError(f"no committed offset for {tp.topic}/{tp.partition} and "
                                "auto_offset_reset is none: commit or reset one first")
        raise OffsetOutOfRangeError(plog.name, out_of_range,
                                    self.fetch.tiered.log_start_offset(plog, tp.topic,
                                                                       tp.partition),
                                    plog.high_watermark)

    async def poll(self, group: str, member_id: str, max_records: int, max_bytes: int,
                   timeout_ms: int, fmt: Format) -> bytes:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            member = self.coordinator.member(group, member_id)
            records = await self._read(group, member, max_records, max_bytes, fmt)
            remaining = deadline - time.monotonic()
            if records or remaining <= 0:
                return _encoder.encode({"records": records, "member_epoch": member.epoch})
            names = [self.manager.log(tp.topic, tp.partition).name for tp in member.assigned
                     if self.coordinator.partitions_of(tp.topic)]
            await self.fetch.notifier.wait_any(names, min(remaining, 0.5))

    async def _read(self, group: str, member: Member, max_records: int, max_bytes: int,
                    fmt: Format) -> list[Any]:
        assigned = sorted(member.assigned)
        if not assigned:
            return []
        member.poll_turn = (member.poll_turn + 1) % len(assigned)
        order = [tp for tp in assigned[member.poll_turn:] + assigned[:member.poll_turn]
                 if self.coordinator.partitions_of(tp.topic)]  # deleted topics: skipped
        # Every position first: a reset policy of "none" fails the poll before any
        # position moved, so no record read in this poll can be skipped by the error.
        positions = {tp: self.position(group, member, tp) for tp in order}
        out: list[FetchedRecord] = []
        budget_records, budget_bytes = max_records, max_bytes
        for tp in order:
            if budget_records <= 0 or budget_bytes <= 0:
                break
            pos = positions[tp]
            try:
                offset, result = await self.fetch.read(tp.topic, tp.partition, pos,
                                                       budget_records, budget_bytes)
            except (UnknownTopicError, UnknownPartitionError):
                continue  # deleted while reading; the next heartbeat rebalances
            except OffsetOutOfRangeError as exc:
                if pos < exc.log_start_offset or pos > exc.high_watermark:
                    if out and member.auto_offset_reset == "none":
                        break  # answer what was read; the next poll reports this one
                    member.positions[tp] = self._reset(member, tp, pos)
                continue
            except CorruptRecordError:
                if out:
                    break  # as Kafka's consumer: the records first, the error on a later poll
                raise  # the position stays: the member seeks past the damaged batch
            if tp not in member.assigned:
                continue  # revoked while reading
            for batch in result.batches:
                for r in records_of(batch, fmt, tp.topic, tp.partition):
                    if r.offset < offset:
                        continue
                    out.append(r)
                    budget_records -= 1
                budget_bytes -= (batch.records.column(1).nbytes
                                 + batch.records.column(2).nbytes)
            nxt = result.next_offset
            if nxt is not None:
                member.positions[tp] = nxt
            elif offset > pos:  # nothing there between: go on from where the read went
                member.positions[tp] = offset
        return out
