"""Confluent Schema Registry's REST API, at its own paths from the server's root, so that
a registry client given lakelog's URL (and an API key) just works: ``/subjects``,
``/schemas/ids/{id}``, ``/config``, ``/mode``, ``/compatibility``. Each route decodes,
calls the registry (``ingest_api.broker.schemas``), encodes. In a cluster the registry
is served by the leader of ``__schemas``-0; another broker passes the request on.

ACLs: a subject named by Confluent's default strategy, ``<topic>-key`` or
``<topic>-value``, is its topic's: reading it needs ``describe`` of the topic,
registering a schema ``produce``, deleting or configuring it ``alter``. Another subject
is the cluster's (``describe`` to read, ``admin`` to change), as are the global level
and mode; a schema by id is readable by any principal.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from msgspec import Meta

from ingest_api.broker.schemas.formats import SCHEMA_TYPES, Reference, Schema
from ingest_api.broker.schemas.registry import LATEST, SchemaRegistry, version_number
from ingest_api.http.auth import may, require
from ingest_api.http.body import decode, read_body
from ingest_api.http.forwarding import forwarded
from ingest_api.http.state import state
from log_tables.errors import (
    CoordinatorNotAvailableError,
    InvalidSchemaError,
    NotCoordinatorError,
    SubjectNotFoundError,
    VersionNotFoundError,
)
from log_tables.typed.registry_state import RegistryState, Version

router = APIRouter(tags=["schema registry"])
T = TypeVar("T")
MEDIA = "application/vnd.schemaregistry.v1+json"
MAX_BODY = 4 << 20
SERVE_WAIT_S = 5.0
"""How long a request waits for a registry this broker has just come to serve."""
Subject = Annotated[str, Path(min_length=1, max_length=1024)]
Flag = Annotated[bool, Query()]


class RefBody(msgspec.Struct):
    name: str
    subject: str
    version: int


class SchemaBody(msgspec.Struct):
    """What registering, looking up and testing take (Confluent's ``RegisterSchemaRequest``)."""

    schema: str
    schemaType: str | None = None
    references: list[RefBody] | None = None
    id: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    version: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    metadata: dict[str, Any] | None = None
    ruleSet: dict[str, Any] | None = None


_schema_body = msgspec.json.Decoder(SchemaBody)
_encoder = msgspec.json.Encoder()


def answer(body: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(body), status_code=status, media_type=MEDIA)


def registry_of(request: Request) -> SchemaRegistry:
    return state(request).broker.schemas


async def served(request: Request) -> RegistryState | Response:
    """The registry, where this broker serves it; else the answer of the broker that does."""
    registry = registry_of(request)
    deadline = time.monotonic() + SERVE_WAIT_S
    while True:
        found = await registry.serving()
        if found is not None:
            return found
        link = state(request).cluster
        assert link is not None  # a broker alone always serves it
        leader = await link.schemas_leader()
        if leader is not None:
            break
        if time.monotonic() > deadline:  # led here, not served yet (the lease, a load)
            raise CoordinatorNotAvailableError("the schema registry is loading on broker "
                                               f"{link.broker_id}; try again")
        await asyncio.sleep(0.05)
    if forwarded(request):
        raise NotCoordinatorError(f"broker {link.broker_id} does not serve the schema "
                                  "registry (the metadata moved); ask again")
    return await link.proxy(request, leader, getattr(request.state, "raw_body", None))


def read_json(request: Request, raw: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """The body decoded (422 for a wrong shape), kept as it came for passing on."""
    request.state.raw_body = raw
    return decode(raw, decoder, 422)


def topic_of(subject: str) -> str | None:
    """The topic of a subject of Confluent's default strategy; None for another."""
    for suffix in ("-key", "-value"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[:-len(suffix)]
    return None


def allow(request: Request, subject: str | None, operation: str) -> None:
    """403 unless the principal may ``operation`` (describe, produce, alter) the subject."""
    topic = topic_of(subject) if subject is not None else None
    if topic is not None:
        require(request, "topic", topic, operation)
    else:
        require(request, "cluster", "lakelog", "describe" if operation == "describe"
                else "admin")


async def _schema_of(request: Request) -> SchemaBody:
    body = read_json(request, await read_body(request, MAX_BODY), _schema_body)
    if body.ruleSet or body.metadata:
        raise InvalidSchemaError("metadata and ruleSet (Confluent's data contracts) are not "
                                 "supported: register the schema without them")
    return body


def _refs(body: SchemaBody) -> list[Reference]:
    return [Reference(r.name, r.subject, r.version) for r in body.references or []]


def _parsed(registry: SchemaRegistry, reg: RegistryState, body: SchemaBody,
            normalize: bool) -> Schema:
    return registry.parse(reg, body.schemaType, body.schema, _refs(body), normalize)


def schema_json(schema: Schema) -> dict[str, Any]:
    """A schema as Confluent answers it: ``schemaType`` left out for Avro, references
    only when it has some."""
    out: dict[str, Any] = {"schema": schema.text}
    if schema.schema_type != "AVRO":
        out["schemaType"] = schema.schema_type
    if schema.references:
        out["references"] = [r.as_json() for r in schema.references]
    return out


def version_json(v: Version) -> dict[str, Any]:
    return {"subject": v.subject, "version": v.version, "id": v.id, **schema_json(v.schema)}


# -- subjects ------------------------------------------------------------------------------
@router.get("/subjects")
async def list_subjects(request: Request, deleted: Flag = False,
                        subjectPrefix: str = "") -> Response:
    """Every subject with a version not deleted (``deleted``: the soft-deleted too)."""
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    names = registry_of(request).subjects(reg, deleted, subjectPrefix)
    return answer([s for s in names if _readable(request, s)])


def _readable(request: Request, subject: str) -> bool:
    topic = topic_of(subject)
    return may(request, "topic", topic, "describe") if topic is not None else \
        may(request, "cluster", "lakelog", "describe")


@router.get("/subjects/{subject}/versions")
async def list_versions(subject: Subject, request: Request, deleted: Flag = False
                        ) -> Response:
    allow(request, subject, "describe")
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(registry_of(request).versions(reg, subject, deleted))


@router.post("/subjects/{subject}/versions")
async def register(subject: Subject, request: Request, normalize: Flag = False) -> Response:
    """Register a schema under the subject: its id (the one it has if registered)."""
    allow(request, subject, "produce")
    body = await _schema_of(request)
    if body.id is not None or body.version is not None:  # an import: cluster-wide ids
        require(request, "cluster", "lakelog", "admin")
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    v = await registry_of(request).register(subject, body.schemaType, body.schema, _refs(body),
                                          normalize, body.id, body.version)
    return answer({"id": v.id})


@router.post("/subjects/{subject}")
async def lookup(subject: Subject, request: Request, normalize: Flag = False,
                 deleted: Flag = False) -> Response:
    """The subject's version of the schema sent, if it has it."""
    allow(request, subject, "describe")
    body = await _schema_of(request)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    registry = registry_of(request)
    registry.versions(reg, subject, deleted)  # 40401 first, as Confluent answers
    return answer(version_json(registry.lookup(reg, subject, _parsed(registry, reg, body,
                                                                      normalize), deleted)))


@router.get("/subjects/{subject}/versions/{version}")
async def get_version(subject: Subject, version: str, request: Request,
                      deleted: Flag = False) -> Response:
    allow(request, subject, "describe")
    number = version_number(version)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(version_json(registry_of(request).version(reg, subject, number, deleted)))


@router.get("/subjects/{subject}/versions/{version}/schema")
async def get_version_schema(subject: Subject, version: str, request: Request,
                             deleted: Flag = False) -> Response:
    """The version's schema alone, as its own JSON."""
    allow(request, subject, "describe")
    number = version_number(version)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    text = registry_of(request).version(reg, subject, number, deleted).schema.text
    return Response(text, media_type=MEDIA)


@router.get("/subjects/{subject}/versions/{version}/referencedby")
async def referenced_by(subject: Subject, version: str, request: Request) -> Response:
    allow(request, subject, "describe")
    number = version_number(version)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(registry_of(request).referenced_by(reg, subject, number))


@router.delete("/subjects/{subject}")
async def delete_subject(subject: Subject, request: Request, permanent: Flag = False
                         ) -> Response:
    """Soft-delete every version (``permanent``: remove a soft-deleted subject for good)."""
    allow(request, subject, "alter")
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(await registry_of(request).delete_subject(subject, permanent))


@router.delete("/subjects/{subject}/versions/{version}")
async def delete_version(subject: Subject, version: str, request: Request,
                         permanent: Flag = False) -> Response:
    allow(request, subject, "alter")
    number = version_number(version)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(await registry_of(request).delete_version(subject, number, permanent))


# -- schemas by id ---------------------------------------------------------------------------
@router.get("/schemas/types")
async def schema_types() -> Response:
    return answer(list(SCHEMA_TYPES))


@router.get("/schemas/ids/{schema_id}")
async def get_schema(schema_id: int, request: Request) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer(schema_json(registry_of(request).schema_by_id(reg, schema_id)))


@router.get("/schemas/ids/{schema_id}/schema")
async def get_schema_text(schema_id: int, request: Request) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return Response(registry_of(request).schema_by_id(reg, schema_id).text, media_type=MEDIA)


@router.get("/schemas/ids/{schema_id}/subjects")
async def schema_subjects(schema_id: int, request: Request, deleted: Flag = False
                          ) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    registry_of(request).schema_by_id(reg, schema_id)
    return answer(sorted({v.subject for v in reg.with_id(schema_id)
                           if deleted or not v.deleted}))


@router.get("/schemas/ids/{schema_id}/versions")
async def schema_versions(schema_id: int, request: Request, deleted: Flag = False
                          ) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    registry_of(request).schema_by_id(reg, schema_id)
    return answer([{"subject": v.subject, "version": v.version}
                    for v in sorted(reg.with_id(schema_id),
                                    key=lambda v: (v.subject, v.version))
                    if deleted or not v.deleted])


# -- compatibility ---------------------------------------------------------------------------
@router.post("/compatibility/subjects/{subject}/versions/{version}")
async def test_one(subject: Subject, version: str, request: Request, verbose: Flag = False,
                   normalize: Flag = False) -> Response:
    """Whether the schema sent keeps the subject's level against one version."""
    return await _test(request, subject, version_number(version), verbose, normalize)


@router.post("/compatibility/subjects/{subject}/versions")
async def test_all(subject: Subject, request: Request, verbose: Flag = False,
                   normalize: Flag = False) -> Response:
    """Whether the schema sent keeps the subject's level against the versions it names."""
    return await _test(request, subject, None, verbose, normalize)


async def _test(request: Request, subject: str, number: int | None, verbose: bool,
                normalize: bool) -> Response:
    allow(request, subject, "describe")
    body = await _schema_of(request)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    registry = registry_of(request)
    schema = _parsed(registry, reg, body, normalize)
    if number not in (None, LATEST) and not reg.subjects.get(subject):
        raise SubjectNotFoundError(f"subject {subject!r} not found")
    try:
        found = registry.test(reg, subject, schema, number)
    except (SubjectNotFoundError, VersionNotFoundError):
        if number != LATEST:
            raise
        found = []
    out: dict[str, Any] = {"is_compatible": not found}
    if verbose:
        out["messages"] = found
    return answer(out)
