"""What the routes share: the log manager and the services, held by the app."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import msgspec
from fastapi import Request
from fastapi.responses import Response

from consumer_groups.coordinator import GroupCoordinator
from ingest_api.broker.fetch import FetchService
from ingest_api.broker.group_poll import GroupPoll
from ingest_api.broker.metrics import Metrics
from ingest_api.broker.produce.service import ProduceService
from ingest_api.http.body import InFlightBytes
from ingest_api.settings import ApiSettings
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.hot.log_manager import LogManager
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink
    from ingest_api.broker.group_admin import GroupAdmin
    from ingest_api.broker.topics import TopicAdmin

CLUSTER_ID = "lakelog"
_encoder = msgspec.json.Encoder()


@dataclass
class AppState:
    settings: ApiSettings
    manager: LogManager
    produce: ProduceService
    fetch: FetchService
    metrics: Metrics
    in_flight: InFlightBytes
    tiered: TieredStorage
    groups: GroupCoordinator
    poll: GroupPoll
    cluster: ClusterLink | None = None

    def require_topic(self, name: str) -> TopicMetadata:
        """The topic; in a cluster, one made through another broker a moment ago is read
        from ZooKeeper before it is called unknown."""
        if self.cluster is not None and name not in self.manager.registry:
            self.cluster.ensure_topic(name)
        return self.manager.require_topic(name)

    @cached_property
    def topic_admin(self) -> TopicAdmin:
        # Imported here: ingest_api.broker.metadata still imports CLUSTER_ID from this module.
        from ingest_api.broker.topics import TopicAdmin

        return TopicAdmin(self.manager, self.tiered, self.groups,
                          self.settings.default_replication_factor, self.cluster)

    @cached_property
    def group_admin(self) -> GroupAdmin:
        from ingest_api.broker.group_admin import GroupAdmin

        return GroupAdmin(self.groups, self.manager, self.tiered, self.topic_admin,
                          self.cluster)


def state(request: Request) -> AppState:
    st: AppState = request.app.state.lakelog
    return st


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(body), status_code=status, media_type="application/json",
                    headers=headers)


def json_body(model: type[msgspec.Struct]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a msgspec model (its schema goes into the components)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}
