"""The schemas a produce with schemas writes with (``serde.SchemaSource``): the registry
here where this broker serves it, else asked of the broker that does (the leader of
``__schemas``-0, through ``peers.Peers.registry_get``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ingest_api.broker.schemas.formats import Reference, Schema
from ingest_api.broker.schemas.registry import LATEST, SchemaRegistry
from log_tables.errors import (
    SCHEMA_ERRORS,
    CoordinatorNotAvailableError,
    LakelogError,
    SchemaNotFoundError,
    for_name,
)

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


class RegistrySource:
    def __init__(self, registry: SchemaRegistry, link: ClusterLink | None) -> None:
        self.registry = registry
        self.link = link

    async def by_id(self, schema_id: int) -> Schema:
        state = await self.registry.serving()
        if state is not None:
            return self.registry.schema_by_id(state, schema_id)
        return _schema(await self._remote(f"/schemas/ids/{schema_id}"))

    async def by_version(self, subject: str, version: int) -> tuple[int, Schema]:
        state = await self.registry.serving()
        if state is not None:
            v = self.registry.version(state, subject, version)
            return v.id, v.schema
        doc = await self._remote(f"/subjects/{quote(subject, safe='')}/versions/"
                                 f"{'latest' if version == LATEST else version}")
        return int(doc["id"]), _schema(doc)

    async def versions_of(self, schema_id: int) -> list[tuple[str, int]]:
        """The (subject, version) pairs not deleted that have the schema of an id."""
        state = await self.registry.serving()
        if state is not None:
            return sorted((v.subject, v.version) for v in state.with_id(schema_id)
                          if not v.deleted)
        try:
            found = await self._remote(f"/schemas/ids/{schema_id}/versions")
        except SchemaNotFoundError:
            return []
        return [(str(d["subject"]), int(d["version"])) for d in found]

    async def reference(self, ref: Reference) -> Schema:
        return (await self.by_version(ref.subject, ref.version))[1]

    async def _remote(self, path: str) -> Any:
        assert self.link is not None  # a broker alone serves the registry itself
        leader = await self.link.schemas_leader()
        if leader is None:  # led here a moment ago, not served yet
            raise CoordinatorNotAvailableError("the schema registry is loading on this "
                                               "broker; try again")
        try:
            return await self.link.peers.registry_get(leader, path)
        except LakelogError as exc:  # another broker's answer: as the table's class
            cls = for_name(exc.code)
            if cls in SCHEMA_ERRORS:
                raise cls(exc.message) from None
            raise


def _schema(doc: dict[str, Any]) -> Schema:
    return Schema(str(doc.get("schemaType") or "AVRO"), str(doc["schema"]), tuple(
        Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
        for r in doc.get("references") or []))
