"""The APIs the Kafka listener answers, each over the broker core's services: the
message in (a kio request) and the values of the answer out (``messages.build``).

Versions: what ``SUPPORTED`` lists is advertised in ApiVersions; each is at least what
librdkafka, kafka-python, aiokafka and the Java clients of Kafka 3.x negotiate down to.
Fetch stops at v12 (v13 names topics by id) and Produce at v9.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow.compute as pc

from ingest_api.broker.core import Broker
from ingest_api.broker.produce.service import Acks
from ingest_api.kafka import batches, group_offsets
from log_tables.errors import InvalidRecordError, LakelogError, UnknownPartitionError
from log_tables.hot.isolation import READ_COMMITTED, READ_UNCOMMITTED, Isolation
from log_tables.registry import INTERNAL_TOPICS

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 22
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9), FETCH: (4, 12), LIST_OFFSETS: (1, 6), METADATA: (0, 12),
    API_VERSIONS: (0, 3), INIT_PRODUCER_ID: (0, 4), **group_offsets.SUPPORTED}
"""API key → (lowest, highest) version served."""
UNKNOWN_SERVER_ERROR, UNKNOWN_TOPIC, REQUEST_TIMED_OUT, UNSUPPORTED_VERSION = -1, 3, 7, 35
INVALID_REQUIRED_ACKS, TRANSACTIONAL_ID_NOT_FOUND = 21, 105
MAX_FETCH_RECORDS = 10_000
"""Records read per partition per fetch (``max_bytes`` bounds it too)."""
CLUSTER_ID = "lakelog"
ACKS: dict[int, Acks] = {0: "0", 1: "1", -1: "all"}

Handler = Callable[[Any, int], Awaitable[dict[str, Any] | None]]


class CloseConnection(Exception):
    """The answer is to close the connection (an acks=0 produce that failed: the client
    has no other way to learn it, as with Kafka's brokers)."""


def code_of(exc: BaseException) -> int:
    """Kafka's error code for an error of the broker core: its own where Kafka has one,
    REQUEST_TIMED_OUT for the others that are retriable (a full queue: clients retry
    it), UNKNOWN_SERVER_ERROR for the rest."""
    if isinstance(exc, LakelogError):
        if exc.kafka_code is not None:
            return exc.kafka_code
        if exc.retriable:
            return REQUEST_TIMED_OUT
    return UNKNOWN_SERVER_ERROR


def api_versions_answer(error: int = 0) -> dict[str, Any]:
    return {"error_code": error, "api_keys": [
        {"api_key": k, "min_version": lo, "max_version": hi}
        for k, (lo, hi) in sorted(SUPPORTED.items())]}


class Handlers:
    """Per API key the coroutine answering it; ``node`` is this broker's (id, host, port)
    as Metadata advertises it."""

    def __init__(self, broker: Broker, node: tuple[int, str, int]) -> None:
        self.broker = broker
        self.node = node
        self.by_key: dict[int, Handler] = {
            API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce,
            FETCH: self.fetch, LIST_OFFSETS: self.list_offsets,
            INIT_PRODUCER_ID: self.init_producer_id}
        offsets = group_offsets.GroupOffsets(broker, node, code_of)
        self.by_key.update({group_offsets.FIND_COORDINATOR: offsets.find_coordinator,
                            group_offsets.OFFSET_COMMIT: offsets.offset_commit,
                            group_offsets.OFFSET_FETCH: offsets.offset_fetch})

    async def api_versions(self, request: Any, version: int) -> dict[str, Any]:
        return api_versions_answer()

    async def init_producer_id(self, request: Any, version: int) -> dict[str, Any]:
        """An idempotent producer's id and epoch (the id given again, v3+: its epoch
        bumped, KIP-360); transactional ids are not served here yet."""
        if request.transactional_id is not None:
            return {"error_code": UNSUPPORTED_VERSION, "producer_id": -1, "producer_epoch": -1}
        given = getattr(request, "producer_id", -1)
        try:
            pid, epoch = await asyncio.to_thread(
                self.broker.manager.producer_ids.init_producer, given if given >= 0 else None)
        except LakelogError as exc:
            return {"error_code": code_of(exc), "producer_id": -1, "producer_epoch": -1}
        return {"producer_id": pid, "producer_epoch": epoch}

    async def metadata(self, request: Any, version: int) -> dict[str, Any]:
        node_id, host, port = self.node
        registry = self.broker.manager.registry
        if request.topics is None or (version == 0 and not request.topics):
            names = [t.name for t in registry.list()]
        else:
            names = [t.name for t in request.topics if t.name is not None]
        topics = []
        for name in names:
            if name not in registry:
                topics.append({"error_code": UNKNOWN_TOPIC, "name": name})
                continue
            meta = registry.describe(name)
            topics.append({
                "name": name, "topic_id": _uuid(meta.topic_id),
                "is_internal": name in INTERNAL_TOPICS,
                "partitions": [{"partition_index": p, "leader_id": node_id, "leader_epoch": 0,
                                "replica_nodes": [node_id], "isr_nodes": [node_id]}
                               for p in range(meta.partitions)]})
        return {"brokers": [{"node_id": node_id, "host": host, "port": port}],
                "cluster_id": CLUSTER_ID, "controller_id": node_id, "topics": topics}

    async def produce(self, request: Any, version: int) -> dict[str, Any] | None:
        acks = ACKS.get(request.acks)
        if request.transactional_id is not None:
            answer = await self._refuse_produce(request, TRANSACTIONAL_ID_NOT_FOUND,
                                                "transactions are not served on this "
                                                "listener yet")
            return None if acks == "0" else answer
        if acks is None:
            return await self._refuse_produce(request, INVALID_REQUIRED_ACKS,
                                              f"acks must be 0, 1 or -1, not {request.acks}")
        pending: list[tuple[str, int, Awaitable[Any] | BaseException]] = []
        for topic in request.topic_data:
            for part in topic.partition_data:
                pending.append((topic.name, part.index,
                                self._produce_partition(topic.name, part.index, part.records,
                                                        acks)))
        results = await asyncio.gather(*(p for _, _, p in pending if not isinstance(
            p, BaseException)), return_exceptions=True)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, index, _), outcome in zip(pending, results, strict=True):
            by_topic.setdefault(name, []).append(_partition_answer(index, outcome))
        if acks == "0":
            failed = [o for o in results if isinstance(o, BaseException)]
            if failed:
                raise CloseConnection(f"an acks=0 produce failed: {failed[0]}")
            return None
        return {"responses": [{"name": n, "partition_responses": ps}
                              for n, ps in by_topic.items()]}

    async def _produce_partition(self, topic: str, partition: int, records: bytes | None,
                                 acks: Acks) -> tuple[int, int]:
        meta = self.broker.require_topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownPartitionError(topic, partition, meta.partitions)
        decoded = batches.decode(records or b"")
        if not decoded.keys:
            return -1, -1
        if decoded.transactional:
            raise InvalidRecordError("transactional batches are not served on the Kafka "
                                     "listener yet: produce them over HTTP")
        validation = self.broker.schema_validation
        if validation.applies(meta.config):
            refused = await validation.check(topic, meta.config, decoded.keys, decoded.values)
            if refused:
                raise refused[min(refused)]
        result = await self.broker.produce.produce(meta, decoded.request(partition), acks,
                                                   atomic=True)
        if result.errors:
            raise result.errors[min(result.errors)]
        metrics = self.broker.metrics
        metrics.records_in.labels(topic).inc(len(result))
        metrics.bytes_in.labels(topic).inc(result.accepted_bytes())
        return int(result.offsets[0]), int(result.timestamps[0])

    async def _refuse_produce(self, request: Any, code: int, message: str) -> dict[str, Any]:
        return {"responses": [{"name": t.name, "partition_responses": [
            {"index": p.index, "error_code": code, "base_offset": -1, "error_message": message}
            for p in t.partition_data]} for t in request.topic_data]}

    async def fetch(self, request: Any, version: int) -> dict[str, Any]:
        isolation = READ_COMMITTED if getattr(request, "isolation_level", 0) == 1 \
            else READ_UNCOMMITTED
        settings = self.broker.settings
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
        max_bytes = min(request.max_bytes, settings.max_fetch_bytes)
        wait_s = min(request.max_wait.total_seconds(), settings.max_fetch_wait_ms / 1000)
        deadline = time.monotonic() + wait_s
        while True:
            answers, total = await self._read_all(wanted, max_bytes, isolation)
            remaining = deadline - time.monotonic()
            if total >= request.min_bytes or remaining <= 0 or \
                    any(a.get("error_code") for a in answers):  # (errors: at once, as Kafka)
                break
            names = [self.broker.manager.log(t, p.partition).name for t, p in wanted
                     if _exists(self.broker, t, p.partition)]
            try:
                woken = await self.broker.notifier.wait_any(names, remaining)
            except LakelogError:  # too many fetches waiting: answer what there is
                break
            if not woken:
                answers, total = await self._read_all(wanted, max_bytes, isolation)
                break
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, _), answer in zip(wanted, answers, strict=True):
            by_topic.setdefault(topic, []).append(answer)
        return {"responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}

    async def _read_all(self, wanted: list[tuple[str, Any]], max_bytes: int, isolation: Isolation
                        ) -> tuple[list[dict[str, Any]], int]:
        answers, total = [], 0
        for topic, part in wanted:
            budget = max(0, max_bytes - total)
            answer = await self._read_one(topic, part, min(part.partition_max_bytes, budget),
                                          isolation, first=total == 0)
            total += len(answer["records"])
            answers.append(answer)
        return answers, total

    async def _read_one(self, topic: str, part: Any, max_bytes: int, isolation: Isolation,
                        first: bool) -> dict[str, Any]:
        answer: dict[str, Any] = {"partition_index": part.partition, "records": b"",
                                  "high_watermark": -1, "last_stable_offset": -1,
                                  "log_start_offset": -1, "preferred_read_replica": -1}
        try:
            meta = self.broker.manager.require_topic(topic)
            if not 0 <= part.partition < meta.partitions:
                answer["error_code"] = UNKNOWN_TOPIC
                return answer
            plog = self.broker.manager.log(topic, part.partition)
            read_from, result = await self.broker.fetch.read(
                topic, part.partition, part.fetch_offset, MAX_FETCH_RECORDS,
                max(max_bytes, 1 if first else 0) or 1, isolation)
        except LakelogError as exc:
            answer["error_code"] = code_of(exc)
            return answer
        answer.update(high_watermark=result.high_watermark,
                      last_stable_offset=plog.readable_end(READ_COMMITTED),
                      log_start_offset=result.log_start_offset)
        if not (first or max_bytes > 0):
            return answer
        out = [batches.encode(b) for b in result.batches]
        if result.batches:
            metrics = self.broker.metrics
            metrics.records_out.labels(topic).inc(sum(b.records.num_rows
                                                      for b in result.batches))
            metrics.bytes_out.labels(topic).inc(sum(
                _data_bytes(b.records) for b in result.batches))
        # Where the read stepped over offsets with nothing to give (markers, aborted
        # records, records gone), a control batch takes the client past them.
        last = result.batches[-1] if result.batches else None
        done = part.fetch_offset if last is None else \
            last.base_offset + int(last.records.num_rows)
        reached = max(read_from if last is None else done, result.read_to or 0)
        if reached > done:
            out.append(batches.gap(done, reached))
        answer["records"] = b"".join(out)
        return answer

    async def list_offsets(self, request: Any, version: int) -> dict[str, Any]:
        committed = getattr(request, "isolation_level", 0) == 1
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                stamp = p.timestamp
                answer: dict[str, Any] = {"partition_index": p.partition_index,
                                          "timestamp": -1, "offset": -1}
                try:
                    spec = "earliest" if stamp == -2 else "latest" if stamp == -1 \
                        else "timestamp"
                    if stamp < -2:
                        answer["error_code"] = UNSUPPORTED_VERSION
                    else:
                        meta = self.broker.manager.require_topic(topic.name)
                        if not 0 <= p.partition_index < meta.partitions:
                            answer["error_code"] = UNKNOWN_TOPIC
                        else:
                            answer.update(await self._list_one(topic.name, p.partition_index,
                                                               spec, stamp, committed))
                except LakelogError as exc:
                    answer["error_code"] = code_of(exc)
                parts.append(answer)
            topics.append({"name": topic.name, "partitions": parts})
        return {"topics": topics}


    async def _list_one(self, topic: str, partition: int, spec: str, stamp: int,
                        committed: bool) -> dict[str, Any]:
        """One partition's offset, and for a time the timestamp of the record found."""
        if spec == "latest" and committed:  # (the last stable offset)
            plog = self.broker.manager.log(topic, partition)
            return {"offset": plog.readable_end(READ_COMMITTED), "timestamp": -1}
        listed = await self.broker.cluster_info.list_offset(
            topic, partition, spec,  # type: ignore[arg-type]
            stamp if spec == "timestamp" else None)
        if listed.offset is None:
            return {"offset": -1, "timestamp": -1}
        found = -1
        if spec == "timestamp":
            _, result = await self.broker.fetch.read(topic, partition, listed.offset, 1,
                                                     1 << 20, READ_UNCOMMITTED)
            if result.batches:
                found = int(result.batches[0].records.column("timestamp")[0].as_py())
        return {"offset": listed.offset, "timestamp": found}


def _partition_answer(index: int, outcome: Any) -> dict[str, Any]:
    if isinstance(outcome, BaseException):
        return {"index": index, "error_code": code_of(outcome), "base_offset": -1,
                "log_append_time_ms": -1, "log_start_offset": -1,
                "error_message": str(outcome)[:1000]}
    offset, _ = outcome
    return {"index": index, "base_offset": offset, "log_append_time_ms": -1,
            "log_start_offset": -1}


def _data_bytes(rows: Any) -> int:
    """Key + value bytes (what lakelog's byte metrics count)."""
    return sum(int(pc.sum(pc.binary_length(rows.column(c))).as_py() or 0)
               for c in ("key", "value"))


def _exists(broker: Broker, topic: str, partition: int) -> bool:
    registry = broker.manager.registry
    return topic in registry and 0 <= partition < registry.describe(topic).partitions


def _uuid(topic_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return uuid.UUID(int=0)
