"""Forwarding in the HTTP front: whether a request came from another broker, and a
produce request's records sent on to the leaders of their partitions.

A broker never forwards a forwarded request again: if it does not lead the partition
either (the metadata moved meanwhile), it answers NOT_LEADER_OR_FOLLOWER and the first
broker's caller tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import msgspec
from fastapi import Request

from cluster.model import OFFSETS_TOPIC, BrokerInfo
from ingest_api.broker.produce.request import ProduceRequest
from ingest_api.broker.produce.runs import ProduceResult, Run
from ingest_api.broker.security import is_broker_principal
from ingest_api.http.errors import error_of, relayed
from ingest_api.http.peers import FORWARDED, INTERNAL, HttpLink
from ingest_api.http.peers import principal_of as principal_of
from ingest_api.http.produce_columns import forward_entries
from ingest_api.http.resources import CLUSTER
from log_tables.errors import LakelogError


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


class ProduceRoute:
    """One produce request's routing (``ingest_api.broker.produce.service.Route``): runs of
    partitions led elsewhere go to their leaders as ``records:batch`` requests whose
    entries are the records with their partition set, ids their index in the request."""

    def __init__(self, link: HttpLink, forwarded: bool, principal: str | None) -> None:
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

    def forward(self, topic: str, request: ProduceRequest, runs: list[Run],
                result: ProduceResult, acks: str) -> Awaitable[None]:
        by_broker: dict[int, list[int]] = {}
        for run in runs:
            by_broker.setdefault(self._leaders[run.partition].broker_id, []).extend(
                run.indices.tolist())
        bodies: list[tuple[BrokerInfo, list[int], bytes]] = []
        partitions = result.partitions
        for broker_id, indices in by_broker.items():
            indices.sort()  # the request's order, per partition too
            entries = forward_entries(request, indices, partitions)
            info = next(b for b in self._leaders.values() if b.broker_id == broker_id)
            bodies.append((info, indices, b'{"entries":[' + b",".join(entries) + b"]}"))
        return self._send_all(topic, bodies, result, acks, request.transactional_id)

    async def _send_all(self, topic: str, bodies: list[tuple[BrokerInfo, list[int], bytes]],
                        result: ProduceResult, acks: str, tid: str | None = None) -> None:
        await asyncio.gather(*(self._send(topic, info, indices, body, result, acks, tid)
                               for info, indices, body in bodies))

    async def _send(self, topic: str, info: BrokerInfo, indices: list[int], body: bytes,
                    result: ProduceResult, acks: str, tid: str | None = None) -> None:
        path = f"{CLUSTER}/topics/{topic}/records:batch"
        params = {"acks": acks} if tid is None else {"acks": acks, "transactional_id": tid}
        try:
            r = await self.link.send(info, "POST", path, principal=self.principal,
                                     params=params, content=body,
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
            result.errors[int(f.id)] = relayed(f.error, f.message, f.error_code, f.retriable)


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


def _epoch_ms(text: str) -> int:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
