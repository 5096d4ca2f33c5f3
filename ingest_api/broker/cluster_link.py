"""The server's side of a cluster: which broker a request belongs to, and the forwarding
of what belongs to another (Kafka's brokers answer NOT_LEADER; lakelog's forward, so that
any broker answers any request, as the issue of the cluster asks).

A forwarded request carries ``Lakelog-Forwarded-By: <broker id>`` and the forwarding
broker's own credentials (with ``Lakelog-Principal``, the user it acts for); a broker
never forwards a forwarded request again: if it does not lead the partition either (the
metadata moved meanwhile), it answers NOT_LEADER_OR_FOLLOWER and the first broker's
caller tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
from fastapi import Request
from fastapi.responses import Response

from cluster.broker import ClusterBroker
from cluster.model import OFFSETS_TOPIC, BrokerInfo
from cluster.replica_manager import ReplicaManager
from consumer_groups.hashing import group_slot
from ingest_api.broker.produce.runs import ProduceResult, Run
from ingest_api.broker.security import is_broker_principal
from ingest_api.http.errors import ApiError, error_of
from ingest_api.http.models import BatchEntry, ProduceRecord
from ingest_api.http.state import CLUSTER_ID
from log_tables.errors import (
    BrokerNotAvailableError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    LakelogError,
    LeaderNotAvailableError,
    NotControllerError,
    NotLeaderError,
    TopicExistsError,
    UnknownTopicError,
)

log = logging.getLogger(__name__)

LOAD_WAIT_S = 5.0
"""How long a group request waits for its coordinator (this broker) to load the group."""
FORWARDED = "lakelog-forwarded-by"
INTERNAL = "lakelog-internal"
"""A broker's own request (not one it forwards for a user): making the coordinator slots."""
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization",
               FORWARDED, INTERNAL, "lakelog-principal", "keep-alive", "accept-encoding"}


class ClusterLink:
    """Routing and forwarding for one broker of a cluster."""

    def __init__(self, broker: ClusterBroker, *, timeout_s: float, offsets_slots: int,
                 credentials: Callable[[str | None], Mapping[str, str]] | None = None,
                 verify: Any = True, on_send: Callable[[int, str], None] | None = None
                 ) -> None:
        self.broker = broker
        self.broker_id = broker.broker_id
        self.offsets_slots = offsets_slots
        self.replicas: ReplicaManager | None = None
        """Set once replication starts (after the broker joined)."""
        self.coordinator_epoch: Callable[[str], int | None] | None = None
        """The epoch at which this broker coordinates a group it leads the slot of (None:
        still loading it); set once the groups' slots are followed
        (``ingest_api.broker.group_slots``)."""
        self._credentials = credentials
        self._on_send = on_send
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0),
                                       limits=httpx.Limits(max_connections=256,
                                                           max_keepalive_connections=64),
                                       verify=verify)

    async def close(self) -> None:
        await self._http.aclose()

    # -- where -----------------------------------------------------------------------
    def ensure_topic(self, topic: str) -> None:
        if not self.broker.ensure_topic(topic):
            raise UnknownTopicError(topic)

    def route(self, topic: str, partition: int, forwarded: bool) -> int | BrokerInfo:
        """The leader epoch when this broker leads the partition; else the leader's
        broker to forward to. A forwarded request is never forwarded again."""
        try:
            return self.broker.check_leader(topic, partition)
        except NotLeaderError:
            if forwarded:
                raise
            leader = self.broker.view.leader(topic, partition)
            info = self.broker.view.broker(leader)
            if info is None:
                raise LeaderNotAvailableError(
                    f"{topic}-{partition}: its leader, broker {leader}, is not registered "
                    f"(down or restarting); try again") from None
            return info

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool:
        """After an append: this broker still leads at the same epoch and its lease holds,
        so the append may be acknowledged."""
        return (self.broker.leads(topic, partition)
                and self.broker.view.leader_epoch(topic, partition) == epoch)

    def coordinator(self, group: str) -> BrokerInfo | None:
        """The group's coordinator: the leader of coordinator slot hash(group) % slots;
        None when that is this broker."""
        slot = group_slot(group, self.offsets_slots)
        if self.broker.view.topic(OFFSETS_TOPIC) is None:
            raise CoordinatorNotAvailableError(
                "the consumer group coordinator slots are being created; try again")
        leader = self.broker.view.leader(OFFSETS_TOPIC, slot)
        if leader == self.broker_id:
            if not self.broker.session.has_lease:
                raise CoordinatorNotAvailableError(
                    f"broker {self.broker_id} has lost touch with ZooKeeper; try again")
            if self.coordinator_epoch is not None and self.coordinator_epoch(group) is None:
                raise CoordinatorLoadInProgressError(
                    f"group {group!r} (slot {slot}) moved to broker {self.broker_id} a moment "
                    f"ago, which is reading its committed offsets; try again")
            return None
        info = self.broker.view.broker(leader)
        if info is None:
            raise CoordinatorNotAvailableError(
                f"the coordinator of group {group!r} (slot {slot}, broker {leader}) is down; "
                f"try again")
        return info

    async def coordinator_of(self, group: str) -> BrokerInfo | None:
        """``coordinator``, making the coordinator slots first when the cluster has none
        yet (Kafka makes ``__consumer_offsets`` on the first group request too, so that
        the slots spread over the brokers running by then). A slot this broker has just
        come to lead is waited for while it loads (up to ``LOAD_WAIT_S``: a read of the
        offsets table), so that a client without retries (curl) is not answered
        ``coordinator_load_in_progress`` by the first request of a new cluster."""
        if self.broker.view.topic(OFFSETS_TOPIC) is None and \
                not await asyncio.to_thread(self.broker.ensure_topic, OFFSETS_TOPIC):
            await self._create_offsets_topic()
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            try:
                return self.coordinator(group)
            except CoordinatorLoadInProgressError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def _create_offsets_topic(self) -> None:
        controller = self.controller()
        if controller is None:
            def create() -> None:
                with contextlib.suppress(TopicExistsError):
                    controller = self.broker.controller
                    factor = min(controller.offsets_topic_replication_factor,
                                 len(self.broker.view.live_brokers()))
                    controller.create_topic(OFFSETS_TOPIC, self.offsets_slots, max(1, factor),
                                            {}, 0)
            await asyncio.to_thread(create)
        else:
            body = _encoder.encode({"topic_name": OFFSETS_TOPIC,
                                    "partitions_count": self.offsets_slots})
            r = await self.send(controller, "POST", f"/v3/clusters/{CLUSTER_ID}/topics",
                                principal=None, content=body,
                                headers={"content-type": "application/json",
                                         INTERNAL: OFFSETS_TOPIC})
            if r.status_code not in (200, 201) and \
                    r.json().get("error") != TopicExistsError.code:
                raise error_of(r)
        await asyncio.to_thread(self.broker.ensure_topic, OFFSETS_TOPIC)

    def controller(self) -> BrokerInfo | None:
        """The controller's broker; None when it is this one."""
        if self.broker.controller.active:
            return None
        cid = self.broker.view.controller_id
        info = self.broker.view.broker(cid) if cid is not None else None
        if info is None:
            raise NotControllerError("no controller is elected right now; try again")
        return info

    # -- forwarding ------------------------------------------------------------------
    def _headers(self, principal: str | None) -> dict[str, str]:
        headers = {FORWARDED: str(self.broker_id)}
        if self._credentials is not None:
            headers.update(self._credentials(principal))
        return headers

    async def send(self, broker: BrokerInfo, method: str, path: str, *,
                   principal: str | None, params: Mapping[str, str] | None = None,
                   content: bytes | None = None, headers: Mapping[str, str] | None = None
                   ) -> httpx.Response:
        if self._on_send is not None:
            self._on_send(broker.broker_id, request_kind(method, path))
        try:
            return await self._http.request(
                method, broker.url + path, params=params, content=content,
                headers={**(headers or {}), **self._headers(principal)})
        except httpx.TransportError as exc:
            raise BrokerNotAvailableError(
                f"broker {broker.broker_id} at {broker.url} did not answer "
                f"({type(exc).__name__}); try again") from None

    async def proxy(self, request: Request, broker: BrokerInfo, body: bytes | None = None
                    ) -> Response:
        """The same request to ``broker``; its answer, as it is."""
        if body is None:
            body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        r = await self.send(broker, request.method, request.url.path,
                            principal=principal_of(request),
                            params=dict(request.query_params), content=body or None,
                            headers=headers)
        # Lakelog-* headers carry an Arrow fetch's paging (ingest_api.broker.arrow_answer).
        keep = {k: v for k, v in r.headers.items()
                if k.lower() in ("content-type", "retry-after", "location")
                or k.lower().startswith("lakelog-")}
        return Response(r.content, status_code=r.status_code, headers=keep)


def request_kind(method: str, path: str) -> str:
    """produce, fetch, group, topic or other: what a forwarded request was, for /metrics."""
    if method == "POST" and path.endswith(("/records", "/records:batch")):
        return "produce"
    if method == "GET" and path.endswith("/records") and "/partitions/" in path:
        return "fetch"
    if "/consumer-groups" in path:
        return "group"
    if "/topics" in path:
        return "topic"
    return "other"


def forwarded(request: Request) -> bool:
    """Sent on by another broker: the header, and (with authentication on) a broker's own
    key, so that a user cannot pass as a broker to dodge forwarding."""
    if FORWARDED not in request.headers:
        return False
    if request.app.state.security is None:
        return True
    return getattr(request.state, "forwarded_by", None) is not None or \
        is_broker_principal(getattr(request.state, "principal", None) or "")


def internal(request: Request) -> bool:
    """A broker's own request: the header, from a broker's key (no user's request, even
    one a broker forwards, carries it: forwarding drops it)."""
    if request.headers.get(INTERNAL) != OFFSETS_TOPIC:
        return False
    return request.app.state.security is None or \
        is_broker_principal(getattr(request.state, "principal", None) or "")


def principal_of(request: Request) -> str | None:
    return getattr(request.state, "principal", None)


class ProduceRoute:
    """One produce request's routing (ingest_api.broker.produce.service.Route): runs of
    partitions led elsewhere go to their leaders as ``records:batch`` requests whose
    entries are the records with their partition set, ids their index in the request."""

    def __init__(self, link: ClusterLink, forwarded: bool, principal: str | None) -> None:
        self.link = link
        self.forwarded = forwarded
        self.principal = principal
        self._leaders: dict[int, BrokerInfo] = {}

    def local_epoch(self, topic: str, partition: int) -> int | None:
        where = self.link.route(topic, partition, self.forwarded)
        if isinstance(where, int):
            return where
        self._leaders[partition] = where
        return None

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool:
        return self.link.still_leads(topic, partition, epoch)

    def forward(self, topic: str, records: Sequence[ProduceRecord], runs: list[Run],
                result: ProduceResult, acks: str) -> Awaitable[None]:
        by_broker: dict[int, list[int]] = {}
        for run in runs:
            by_broker.setdefault(self._leaders[run.partition].broker_id, []).extend(
                run.indices.tolist())
        bodies: list[tuple[BrokerInfo, list[int], bytes]] = []
        partitions = result.partitions
        for broker_id, indices in by_broker.items():
            indices.sort()  # the request's order, per partition too
            entries = [_entry(records[i], i, int(partitions[i])) for i in indices]
            info = next(b for b in self._leaders.values() if b.broker_id == broker_id)
            bodies.append((info, indices, b'{"entries":[' + b",".join(entries) + b"]}"))
        return self._send_all(topic, bodies, result, acks)

    async def _send_all(self, topic: str, bodies: list[tuple[BrokerInfo, list[int], bytes]],
                        result: ProduceResult, acks: str) -> None:
        await asyncio.gather(*(self._send(topic, info, indices, body, result, acks)
                               for info, indices, body in bodies))

    async def _send(self, topic: str, info: BrokerInfo, indices: list[int], body: bytes,
                    result: ProduceResult, acks: str) -> None:
        path = f"/v3/clusters/{CLUSTER_ID}/topics/{topic}/records:batch"
        try:
            r = await self.link.send(info, "POST", path, principal=self.principal,
                                     params={"acks": acks}, content=body,
                                     headers={"content-type": "application/json"})
        except LakelogError as exc:
            for i in indices:
                result.errors[i] = exc
            return
        if r.status_code != 207:
            err = error_of(r)
            for i in indices:
                result.errors[i] = err
            return
        answer = _answer.decode(r.content)
        times: dict[str, int] = {}
        offsets, timestamps = result.offsets, result.timestamps
        for ok in answer.successes:
            i = int(ok.id)
            offsets[i] = ok.offset
            if ok.timestamp is not None:
                ms = times.get(ok.timestamp)
                if ms is None:
                    ms = times[ok.timestamp] = _epoch_ms(ok.timestamp)
                timestamps[i] = ms
        for f in answer.failures:
            result.errors[int(f.id)] = ApiError(
                f.error_code // 100 if f.error_code >= 10000 else f.error_code,
                f.message, error_code=f.error_code, name=f.error, retriable=f.retriable)


class _Ok(msgspec.Struct, gc=False):
    id: str
    offset: int
    timestamp: str | None = None


class _Failed(msgspec.Struct, gc=False):
    id: str
    error_code: int
    error: str
    message: str
    retriable: bool | None = None


class _Answer(msgspec.Struct, gc=False):
    """The part of a leader's 207 that the forwarding broker reads."""

    successes: list[_Ok]
    failures: list[_Failed]


_answer = msgspec.json.Decoder(_Answer)


def _entry(record: ProduceRecord, index: int, partition: int) -> bytes:
    """One ``records:batch`` entry: the record with its partition, id its index in the
    request (a batch entry's own id is replaced; it is put back from the index)."""
    if isinstance(record, BatchEntry):
        return _encoder.encode(msgspec.structs.replace(record, id=str(index),
                                                       partition_id=partition))
    body = _encoder.encode(msgspec.structs.replace(record, partition_id=partition))
    return b'{"id":"%d",' % index + body[1:]


def _epoch_ms(text: str) -> int:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_encoder = msgspec.json.Encoder()
