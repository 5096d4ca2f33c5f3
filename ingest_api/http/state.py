"""What the routes share: the broker (``ingest_api.broker.core``) and its services, held
by the app, with what only the HTTP front keeps (the bytes of requests in flight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response

from consumer_groups.coordinator import GroupCoordinator
from ingest_api.broker.cluster_info import ClusterInfo
from ingest_api.broker.core import Broker
from ingest_api.broker.fetch import FetchService
from ingest_api.broker.group_admin import GroupAdmin
from ingest_api.broker.group_poll import GroupPoll
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.metadata import CLUSTER_ID as CLUSTER_ID
from ingest_api.broker.metrics import Metrics
from ingest_api.broker.produce.service import ProduceService
from ingest_api.broker.records_admin import RecordsAdmin
from ingest_api.broker.replica_server import ReplicaServer
from ingest_api.broker.topics import TopicAdmin
from ingest_api.http.body import InFlightBytes
from ingest_api.http.peers import HttpLink
from ingest_api.settings import ApiSettings
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.hot.log_manager import LogManager
from log_tables.registry import TopicMetadata

_encoder = msgspec.json.Encoder()


@dataclass
class AppState:
    """The running broker as the routes reach it (its services by their old names)."""

    broker: Broker
    in_flight: InFlightBytes

    @property
    def settings(self) -> ApiSettings:
        return self.broker.settings

    @property
    def manager(self) -> LogManager:
        return self.broker.manager

    @property
    def produce(self) -> ProduceService:
        return self.broker.produce

    @property
    def fetch(self) -> FetchService:
        return self.broker.fetch

    @property
    def metrics(self) -> Metrics:
        return self.broker.metrics

    @property
    def tiered(self) -> TieredStorage:
        return self.broker.tiered

    @property
    def groups(self) -> GroupCoordinator:
        return self.broker.groups

    @property
    def poll(self) -> GroupPoll:
        return self.broker.poll

    @property
    def bounds(self) -> LeaderBounds:
        return self.broker.bounds

    @property
    def cluster(self) -> HttpLink | None:
        """The broker's ``ClusterLink`` (None: no cluster), with the HTTP forwarding."""
        link = self.broker.link
        assert link is None or isinstance(link, HttpLink)
        return link

    def require_topic(self, name: str) -> TopicMetadata:
        """The topic; in a cluster, one made through another broker a moment ago is read
        from ZooKeeper before it is called unknown."""
        return self.broker.require_topic(name)

    @property
    def topic_admin(self) -> TopicAdmin:
        return self.broker.topic_admin

    @property
    def group_admin(self) -> GroupAdmin:
        return self.broker.group_admin

    @property
    def cluster_info(self) -> ClusterInfo:
        return self.broker.cluster_info

    @property
    def records_admin(self) -> RecordsAdmin:
        return self.broker.records_admin

    @property
    def replica_server(self) -> ReplicaServer:
        return self.broker.replica_server


def state(request: Request) -> AppState:
    st: AppState = request.app.state.lakelog
    return st


def leader_bounds(request: Request) -> LeaderBounds:
    """The broker's ``LeaderBounds`` (made at startup)."""
    return state(request).bounds


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(body), status_code=status, media_type="application/json",
                    headers=headers)


def json_body(model: type[msgspec.Struct]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a msgspec model (its schema goes into the components)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}
