"""The HTTP front's ``Peers`` (``ingest_api.broker.peers``): the other brokers of a cluster
reached at their URLs, each question a request of the REST API (or of the replica
protocol), each error answer raised as this broker would answer it.

A request one broker sends another carries ``Lakelog-Forwarded-By: <broker id>`` and
the sender's own credentials (with ``Lakelog-Principal``, the user it acts for).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pyarrow as pa
from fastapi import Request
from fastapi.responses import Response

from cluster.model import OFFSETS_TOPIC, BrokerInfo
from cluster.replica_protocol import CONTENT_TYPE, EPOCH_END_PATH, FETCH_PATH
from ingest_api.broker.cluster_link import ClusterLink
from ingest_api.broker.credentials import forward_headers
from ingest_api.broker.fetch import Format, RemoteFetch
from ingest_api.broker.peers import GroupSummary, PartitionBounds, PartitionInfo, PeerSetup
from ingest_api.http.arrow_headers import ARROW_STREAM, NEXT_OFFSET
from ingest_api.http.errors import error_of
from ingest_api.http.resources import CLUSTER, partition_url, topic_url
from log_tables.errors import (
    BrokerNotAvailableError,
    NotLeaderError,
    OffsetOutOfRangeError,
    TopicExistsError,
)
from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation

TXN_PATH = "/internal/txn"
"""Where a broker answers the transaction calls of the others (``routers.txn_internal``)."""
FORWARDED = "lakelog-forwarded-by"
INTERNAL = "lakelog-internal"
"""A broker's own request (not one it forwards for a user): making the coordinator slots."""
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization",
               FORWARDED, INTERNAL, "lakelog-principal", "keep-alive", "accept-encoding"}
_encoder = msgspec.json.Encoder()
_remote_fetch = msgspec.json.Decoder(RemoteFetch)


class HttpPeers:
    """One broker's HTTP client to the others (``ingest_api.broker.peers.Peers``)."""

    def __init__(self, setup: PeerSetup) -> None:
        settings = setup.settings
        self.broker_id = setup.broker_id
        self.max_wait_ms = settings.replica_fetch_wait_max_ms
        self._credentials = setup.credentials
        self._on_send = setup.on_send
        # Brokers reach each other over HTTPS when they serve it; their certificates are
        # checked against the system's CAs, or ``tls_ca`` (a private CA's bundle).
        self.verify: bool | str = str(settings.tls_ca) if settings.tls_ca is not None else True
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.max_fetch_wait_ms / 1000 + 30, connect=5.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            verify=self.verify)

    async def close(self) -> None:
        await self._http.aclose()

    def _headers(self, principal: str | None) -> dict[str, str]:
        headers = {FORWARDED: str(self.broker_id)}
        if self._credentials is not None:
            headers.update(forward_headers(self._credentials, principal))
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
        # The path as it came (a schema registry subject may hold '/', '?', '%'): the
        # broker it goes to must act on what this one checked.
        raw_path = request.scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else request.url.path
        r = await self.send(broker, request.method, path,
                            principal=principal_of(request),
                            params=dict(request.query_params), content=body or None,
                            headers=headers)
        # Lakelog-* headers carry an Arrow fetch's paging (ingest_api.http.arrow_headers).
        keep = {k: v for k, v in r.headers.items()
                if k.lower() in ("content-type", "retry-after", "location")
                or k.lower().startswith("lakelog-")}
        return Response(r.content, status_code=r.status_code, headers=keep)

    # -- the core's questions ------------------------------------------------------------
    async def create_topic(self, broker: BrokerInfo, topic: str, partitions: int) -> None:
        body = _encoder.encode({"topic_name": topic, "partitions_count": partitions})
        r = await self.send(broker, "POST", f"{CLUSTER}/topics", principal=None,
                            content=body, headers={"content-type": "application/json",
                                                   INTERNAL: OFFSETS_TOPIC})
        if r.status_code in (200, 201):
            return
        if r.json().get("error") == TopicExistsError.code:
            raise TopicExistsError(topic)
        raise error_of(r)

    async def registry_get(self, broker: BrokerInfo, path: str) -> Any:
        r = await self.send(broker, "GET", path, principal=None)
        if r.status_code == 200:
            return r.json()
        raise error_of(r)

    async def _fetch(self, broker: BrokerInfo, topic: str, partition: int, offset: int,
                     max_records: int, max_bytes: int, params: dict[str, str],
                     headers: dict[str, str] | None = None) -> httpx.Response:
        """A fetch from the leader (no waiting); its errors raised as this broker's."""
        r = await self.send(
            broker, "GET", f"{partition_url(topic, partition)}/records", principal=None,
            params={"offset": str(offset), "max_records": str(max_records),
                    "max_bytes": str(max(max_bytes, 1)), "timeout_ms": "0", **params},
            headers=headers)
        if r.status_code == 416:
            body = r.json()
            raise OffsetOutOfRangeError(f"{topic}-{partition}", offset,
                                        int(body["log_start_offset"]),
                                        int(body["high_watermark"]))
        if r.status_code != 200:
            err = error_of(r)
            if err.retriable or r.status_code in (404, 421):  # moved, busy or gone there
                raise NotLeaderError(f"{topic}-{partition}: broker {broker.broker_id} "
                                     f"answered {err.code}: {err.message}") from err
            raise err
        return r

    async def fetch(self, broker: BrokerInfo, topic: str, partition: int, offset: int,
                    max_records: int, max_bytes: int, fmt: Format,
                    isolation: Isolation = READ_UNCOMMITTED) -> RemoteFetch:
        r = await self._fetch(broker, topic, partition, offset, max_records, max_bytes,
                              {"format": fmt, "isolation_level": isolation.value})
        return _remote_fetch.decode(r.content)

    async def fetch_arrow(self, broker: BrokerInfo, topic: str, partition: int,
                          offset: int, max_records: int, max_bytes: int,
                          isolation: Isolation = READ_UNCOMMITTED
                          ) -> tuple[list[pa.RecordBatch], int]:
        r = await self._fetch(broker, topic, partition, offset, max_records, max_bytes,
                              {"isolation_level": isolation.value}, {"accept": ARROW_STREAM})
        return list(pa.ipc.open_stream(r.content)), int(r.headers[NEXT_OFFSET])

    async def offsets(self, broker: BrokerInfo, topic: str, partition: int
                      ) -> tuple[int, int]:
        r = await self.send(broker, "GET", f"{partition_url(topic, partition)}/offsets",
                            principal=None, params={"spec": "earliest"})
        if r.status_code != 200:
            raise error_of(r)
        body = r.json()
        return int(body["log_start_offset"]), int(body["high_watermark"])

    async def partitions(self, broker: BrokerInfo, topic: str) -> list[PartitionBounds]:
        r = await self.send(broker, "GET", f"{topic_url(quote(topic, safe=''))}/partitions",
                            principal=None)
        if r.status_code != 200:
            raise error_of(r)
        return [PartitionBounds(body["partition_id"], body.get("leader_id", -1),
                                int(body["log_start_offset"]), int(body["high_watermark"]))
                for body in r.json().get("data", [])
                if isinstance(body.get("partition_id"), int)]

    async def partition(self, broker: BrokerInfo, topic: str, partition: int,
                        principal: str | None) -> PartitionInfo | None:
        try:
            r = await self.send(broker, "GET", partition_url(topic, partition),
                                principal=principal)
        except BrokerNotAvailableError:
            return None
        if r.status_code != 200:
            raise error_of(r)
        b = r.json()
        return PartitionInfo(
            b["topic_name"], b["partition_id"], b["leader_id"], tuple(b["replica_ids"]),
            tuple(b["isr_ids"]), b["leader_epoch"], b["log_start_offset"],
            b["high_watermark"], b["size_bytes"], b["segments"], b["hot_log_start_offset"],
            b["tiered_offset"], b["tiered_size_bytes"])

    async def groups(self, broker: BrokerInfo, principal: str | None) -> list[GroupSummary]:
        r = await self.send(broker, "GET", f"{CLUSTER}/consumer-groups", principal=principal)
        if r.status_code != 200:
            raise error_of(r)
        return [GroupSummary(g["consumer_group_id"],
                             int(g["coordinator"]["related"].rsplit("/", 1)[1]), g["state"],
                             g["assignor"], g["group_epoch"], g["members"])
                for g in r.json()["data"]]

    async def delete_records(self, broker: BrokerInfo, topic: str,
                             offsets: Mapping[int, int], principal: str | None
                             ) -> dict[int, int]:
        body = _encoder.encode({"partitions": [{"partition_id": p, "offset": o}
                                               for p, o in offsets.items()]})
        r = await self.send(broker, "POST", f"{topic_url(quote(topic, safe=''))}/records:delete",
                            principal=principal, content=body,
                            headers={"content-type": "application/json"})
        if r.status_code != 200:
            raise error_of(r)
        return {int(row["partition_id"]): int(row["low_watermark"])
                for row in r.json()["partitions"]}

    async def seal(self, broker: BrokerInfo, topic: str, principal: str | None
                   ) -> list[tuple[int, bool, int]]:
        r = await self.send(broker, "POST", f"{topic_url(quote(topic, safe=''))}/segments:roll",
                            principal=principal, headers={"content-type": "application/json"})
        if r.status_code != 200:
            raise error_of(r)
        return [(int(row["partition_id"]), bool(row["rolled"]), int(row["end_offset"]))
                for row in r.json()["partitions"]]

    async def txn(self, broker: BrokerInfo, call: str, body: Mapping[str, object]) -> None:
        r = await self.send(broker, "POST", f"{TXN_PATH}/{call}", principal=None,
                            content=_encoder.encode(body),
                            headers={"content-type": "application/json"})
        if r.status_code != 204:
            raise error_of(r)

    def replica_channel(self, max_wait_ms: int) -> HttpReplicaChannel:
        headers = {} if self._credentials is None else forward_headers(self._credentials, None)
        return HttpReplicaChannel(headers, self.verify, max_wait_ms)


class HttpReplicaChannel:
    """A replica fetcher thread's blocking client (``ingest_api.broker.peers.ReplicaChannel``)."""

    def __init__(self, headers: Mapping[str, str], verify: bool | str, max_wait_ms: int
                 ) -> None:
        self._http = httpx.Client(
            timeout=httpx.Timeout(max_wait_ms / 1000 + 10, connect=2.0),
            verify=verify, headers={**headers, "content-type": CONTENT_TYPE})

    def _post(self, leader: BrokerInfo, path: str, request: bytes) -> bytes:
        try:
            r = self._http.post(leader.url + path, content=request)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise BrokerNotAvailableError(f"broker {leader.broker_id}: {exc}") from None
        return r.content

    def epoch_end(self, leader: BrokerInfo, request: bytes) -> bytes:
        return self._post(leader, EPOCH_END_PATH, request)

    def fetch(self, leader: BrokerInfo, request: bytes) -> bytes:
        return self._post(leader, FETCH_PATH, request)

    def close(self) -> None:
        self._http.close()


class HttpLink(ClusterLink):
    """The broker's ``ClusterLink`` as the routes use it: with the HTTP transport's
    ``send`` and ``proxy`` for the requests they forward as they are."""

    peers: HttpPeers

    async def send(self, broker: BrokerInfo, method: str, path: str, *,
                   principal: str | None, params: Mapping[str, str] | None = None,
                   content: bytes | None = None, headers: Mapping[str, str] | None = None
                   ) -> httpx.Response:
        return await self.peers.send(broker, method, path, principal=principal,
                                     params=params, content=content, headers=headers)

    async def proxy(self, request: Request, broker: BrokerInfo, body: bytes | None = None
                    ) -> Response:
        return await self.peers.proxy(request, broker, body)


def connect(setup: PeerSetup) -> HttpPeers:
    """The HTTP front's ``ingest_api.broker.peers.Connect``."""
    return HttpPeers(setup)


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


def principal_of(request: Request) -> str | None:
    return getattr(request.state, "principal", None)

