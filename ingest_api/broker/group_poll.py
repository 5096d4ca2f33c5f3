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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa

from cluster.model import BrokerInfo
from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator, Member
from consumer_groups.errors import NoOffsetError
from ingest_api.broker.arrow_answer import (
    POSITIONS,
    ArrowAnswer,
    Paging,
    data_bytes,
    kafka_rows,
    stream,
)
from ingest_api.broker.fetch import FetchedRecord, FetchService, Format, records_of
from log_tables.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
    UnstableOffsetCommitError,
)
from log_tables.hot.isolation import READ_UNCOMMITTED
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink
    from ingest_api.broker.peers import Peers

_encoder = msgspec.json.Encoder()


class GroupPoll:
    """``cluster``: in a cluster, the partitions led by other brokers are read from their
    leaders (through its ``peers``), as a Kafka consumer fetches from each leader."""

    def __init__(self, coordinator: GroupCoordinator, fetch: FetchService,
                 manager: LogManager, cluster: ClusterLink | None = None) -> None:
        self.coordinator = coordinator
        self.fetch = fetch
        self.manager = manager
        self.cluster = cluster

    def _leader(self, tp: TopicPartition) -> BrokerInfo | None:
        """The leader's broker when another broker leads ``tp``; None when this one does
        (or this is the cluster of one)."""
        if self.cluster is None:
            return None
        where = self.cluster.route(tp.topic, tp.partition, forwarded=False)
        return None if isinstance(where, int) else where

    def _peers(self) -> Peers:
        assert self.cluster is not None
        return self.cluster.peers

    async def _remote_offsets(self, broker: BrokerInfo, tp: TopicPartition) -> tuple[int, int]:
        """(log start, high watermark) of a partition another broker leads."""
        return await self._peers().offsets(broker, tp.topic, tp.partition)

    async def _position_anywhere(self, group: str, member: Member, tp: TopicPartition,
                                 leader: BrokerInfo | None) -> int:
        if leader is None:
            return self.position(group, member, tp)
        pos = member.positions.get(tp)
        if pos is None:
            self.coordinator.require_stable(group, tp)
            committed = self.coordinator.committed_offset(group, tp)
            pos = committed.offset if committed is not None else \
                await self._remote_reset(member, tp, leader, None)
            member.positions[tp] = pos
        return pos

    async def _remote_reset(self, member: Member, tp: TopicPartition, leader: BrokerInfo,
                            out_of_range: int | None) -> int:
        start, end = await self._remote_offsets(leader, tp)
        if member.auto_offset_reset == "earliest":
            return start
        if member.auto_offset_reset == "latest":
            return end
        if out_of_range is None:
            raise NoOffsetError(f"no committed offset for {tp.topic}/{tp.partition} and "
                                "auto_offset_reset is none: commit or reset one first")
        raise OffsetOutOfRangeError(f"{tp.topic}-{tp.partition}", out_of_range, start, end)

    def position(self, group: str, member: Member, tp: TopicPartition) -> int:
        """The member's position in ``tp``, resolved (and remembered) when it has none."""
        pos = member.positions.get(tp)
        if pos is None:
            self.coordinator.require_stable(group, tp)  # KIP-447: not from a pending one
            committed = self.coordinator.committed_offset(group, tp)
            pos = committed.offset if committed is not None else self._reset(member, tp, None)
            member.positions[tp] = pos
        return pos

    def _reset(self, member: Member, tp: TopicPartition, out_of_range: int | None) -> int:
        plog = self.manager.log(tp.topic, tp.partition)
        policy = member.auto_offset_reset
        if policy == "earliest":
            return self.fetch.tiered.log_start_offset(plog, tp.topic, tp.partition)
        if policy == "latest":
            return plog.readable_end(member.isolation)
        if out_of_range is None:
            raise NoOffsetError(f"no committed offset for {tp.topic}/{tp.partition} and "
                                "auto_offset_reset is none: commit or reset one first")
        raise OffsetOutOfRangeError(plog.name, out_of_range,
                                    self.fetch.tiered.log_start_offset(plog, tp.topic,
                                                                       tp.partition),
                                    plog.readable_end(READ_UNCOMMITTED))

    async def poll(self, group: str, member_id: str, max_records: int, max_bytes: int,
                   timeout_ms: int, fmt: Format, max_partition_bytes: int | None = None
                   ) -> bytes:
        """The JSON answer of a member's poll."""
        member, records = await self._poll(group, member_id, max_records, max_bytes,
                                           timeout_ms, fmt, False, max_partition_bytes)
        return _encoder.encode({"records": records, "member_epoch": member.epoch,
                                "positions": [{"topic_name": t, "partition_id": p, "offset": o,
                                               "topic_id": i}
                                              for t, p, o, i in _positions(
                                                  member, self.coordinator.topic_id_of)]})

    async def poll_arrow(self, group: str, member_id: str, max_records: int, max_bytes: int,
                         timeout_ms: int, max_partition_bytes: int | None = None
                         ) -> ArrowAnswer:
        """``poll`` as an Arrow stream (SPARK_SCHEMA); the member epoch in its paging."""
        member, batches = await self._poll(group, member_id, max_records, max_bytes,
                                           timeout_ms, "BINARY", True, max_partition_bytes)
        count = sum(b.num_rows for b in batches)
        positions = {POSITIONS: _encoder.encode(_positions(member, self.coordinator.topic_id_of))}
        return ArrowAnswer(stream(batches, positions),
                           Paging(count, member_epoch=member.epoch))

    async def _poll(self, group: str, member_id: str, max_records: int, max_bytes: int,
                    timeout_ms: int, fmt: Format, arrow: bool, max_partition_bytes: int | None
                    ) -> tuple[Member, list[Any]]:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            member = self.coordinator.member(group, member_id)
            records = await self._read(group, member, max_records, max_bytes, fmt, arrow,
                                       max_partition_bytes)
            remaining = deadline - time.monotonic()
            if records or remaining <= 0:
                return member, records
            names = [self.manager.log(tp.topic, tp.partition).name for tp in member.assigned
                     if self.coordinator.partitions_of(tp.topic)]
            await self.fetch.notifier.wait_any(names, min(remaining, 0.5))

    async def _read(self, group: str, member: Member, max_records: int, max_bytes: int,
                    fmt: Format, arrow: bool, max_partition_bytes: int | None = None
                    ) -> list[Any]:
        """FetchedRecords read from the member's partitions; with ``arrow``, RecordBatches
        in SPARK_SCHEMA instead (the same records). ``max_partition_bytes`` (Kafka's
        ``max.partition.fetch.bytes``) bounds each partition's share of ``max_bytes``, as
        softly as ``max_bytes`` itself: a partition's first record comes even when larger."""
        assigned = sorted(member.assigned)
        if not assigned:
            return []
        member.poll_turn = (member.poll_turn + 1) % len(assigned)
        order = [tp for tp in assigned[member.poll_turn:] + assigned[:member.poll_turn]
                 if self.coordinator.partitions_of(tp.topic)]  # deleted topics: skipped
        leaders = {tp: self._leader(tp) for tp in order}
        # Every position first: a reset policy of "none" fails the poll before any
        # position moved, so no record read in this poll can be skipped by the error.
        positions = {}
        for tp in order:
            try:
                positions[tp] = await self._position_anywhere(group, member, tp, leaders[tp])
            except UnstableOffsetCommitError:
                continue  # its offset is in an open transaction: read once it ends
        order = [tp for tp in order if tp in positions]
        out: list[Any] = []
        budget_records, budget_bytes = max_records, max_bytes
        for tp in order:
            if budget_records <= 0 or budget_bytes <= 0:
                break
            pos = positions[tp]
            share = budget_bytes if max_partition_bytes is None else \
                min(budget_bytes, max_partition_bytes)
            if (leader := leaders[tp]) is not None:
                read_remote = self._read_remote_arrow if arrow else self._read_remote
                left_records, left_bytes = await read_remote(
                    member, tp, leader, pos, budget_records, share, fmt, out)
                budget_records, budget_bytes = left_records, budget_bytes - (share - left_bytes)
                continue
            try:
                offset, result = await self.fetch.read(tp.topic, tp.partition, pos,
                                                       budget_records, share, member.isolation)
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
                skip = max(0, offset - batch.base_offset)  # records before ``offset``
                if skip < batch.records.num_rows:
                    if arrow:
                        out.append(kafka_rows(batch, tp.topic, tp.partition, offset))
                    else:
                        out.extend(records_of(batch, fmt, tp.topic, tp.partition)[skip:])
                    budget_records -= batch.records.num_rows - skip
                budget_bytes -= (batch.records.column(1).nbytes
                                 + batch.records.column(2).nbytes)
            nxt = result.next_offset
            if nxt is not None:
                member.positions[tp] = nxt
            elif offset > pos:  # nothing there between: go on from where the read went
                member.positions[tp] = offset
        return out

    async def _read_remote(self, member: Member, tp: TopicPartition, leader: BrokerInfo,
                           pos: int, budget_records: int, budget_bytes: int, fmt: Format,
                           out: list[FetchedRecord]) -> tuple[int, int]:
        """Read ``tp`` from its leader into ``out``; the budgets left."""
        try:
            answer = await self._peers().fetch(leader, tp.topic, tp.partition, pos,
                                               budget_records, budget_bytes, fmt,
                                               member.isolation)
        except OffsetOutOfRangeError as exc:
            if pos < exc.log_start_offset or pos > exc.high_watermark:
                member.positions[tp] = await self._remote_reset(member, tp, leader, pos)
            return budget_records, budget_bytes
        except (LeaderNotAvailableError, NotLeaderError, BrokerNotAvailableError,
                UnknownTopicError, UnknownPartitionError):
            return budget_records, budget_bytes  # moved or down: the next poll looks again
        if tp not in member.assigned:
            return budget_records, budget_bytes
        for r in answer.records:
            if r.offset < pos:
                continue
            r.topic_name, r.partition_id = tp.topic, tp.partition
            out.append(r)
            budget_records -= 1
            budget_bytes -= _size(r)
        if answer.next_offset > pos:
            member.positions[tp] = answer.next_offset
        return budget_records, budget_bytes


    async def _read_remote_arrow(self, member: Member, tp: TopicPartition,
                                 leader: BrokerInfo, pos: int, budget_records: int,
                                 budget_bytes: int, fmt: Format, out: list[pa.RecordBatch]
                                 ) -> tuple[int, int]:
        """``_read_remote`` asking the leader for Arrow: its batches go into ``out``."""
        try:
            batches, next_offset = await self._peers().fetch_arrow(
                leader, tp.topic, tp.partition, pos, budget_records, budget_bytes,
                member.isolation)
        except OffsetOutOfRangeError as exc:
            if pos < exc.log_start_offset or pos > exc.high_watermark:
                member.positions[tp] = await self._remote_reset(member, tp, leader, pos)
            return budget_records, budget_bytes
        except (LeaderNotAvailableError, NotLeaderError, BrokerNotAvailableError,
                UnknownTopicError, UnknownPartitionError):
            return budget_records, budget_bytes
        if tp not in member.assigned:
            return budget_records, budget_bytes
        for b in batches:
            offsets = b.column(4).to_numpy()
            skip = int(np.searchsorted(offsets, pos))  # offsets ascend; those before ``pos``
            if skip < b.num_rows:
                b = b.slice(skip)
                out.append(b)
                budget_records -= b.num_rows
                budget_bytes -= data_bytes(b)
        if next_offset > pos:
            member.positions[tp] = next_offset
        return budget_records, budget_bytes


def _positions(member: Member, topic_id_of: Callable[[str], str | None]
               ) -> list[tuple[str, int, int, str | None]]:
    """The member's position in each assigned partition that has one, with the topic's
    id: the client commits them all, a partition that returned nothing too (as Kafka's
    consumer does), and learns from a new id that a topic was made again."""
    return [(tp.topic, tp.partition, pos, topic_id_of(tp.topic))
            for tp in sorted(member.assigned) if (pos := member.positions.get(tp)) is not None]


def _size(r: FetchedRecord) -> int:
    return (len(r.key.data) if r.key is not None and isinstance(r.key.data, str) else 0) + \
        (len(r.value.data) if r.value is not None and isinstance(r.value.data, str) else 0)
