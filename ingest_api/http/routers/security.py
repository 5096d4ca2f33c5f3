"""API keys and ACLs (cluster ``admin`` only; the auth middleware checks that)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ingest_api.broker.security import Acl, SecurityError, SecurityStore
from ingest_api.http.body import decode, read_body
from ingest_api.http.models import AclBody, KeyCreate
from ingest_api.http.routers.cluster import check_cluster
from ingest_api.http.state import json_body, json_response
from log_tables.errors import (
    InvalidAclError,
    InvalidPrincipalError,
    SecurityDisabledError,
    UnknownAclError,
    UnknownApiKeyError,
)

router = APIRouter(tags=["security"])
BASE = "/v3/clusters/{cluster_id}"
MAX_BODY = 64 << 10
_acl = msgspec.json.Decoder(AclBody)
_key = msgspec.json.Decoder(KeyCreate)


def _store(request: Request) -> SecurityStore:
    store: SecurityStore | None = request.app.state.security
    if store is None:
        raise SecurityDisabledError("authentication is off (LAKELOG_AUTH=none): there are no "
                                    "keys or ACLs to manage; start the server with "
                                    "LAKELOG_AUTH=api-key")
    return store


def _to_acl(body: AclBody) -> Acl:
    try:
        return Acl(body.principal, body.resource_type, body.resource_name, body.pattern_type,
                   body.operation)
    except SecurityError as exc:
        raise InvalidAclError(str(exc)) from None


def _acl_body(acl: Acl) -> dict[str, str]:
    return {"principal": acl.principal, "resource_type": acl.resource_type,
            "resource_name": acl.resource_name, "pattern_type": acl.pattern_type,
            "operation": acl.operation}


@router.get(BASE + "/acls")
async def list_acls(cluster_id: str, request: Request,
                    principal: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    """Every ACL, or one principal's."""
    check_cluster(cluster_id)
    return json_response({"data": [_acl_body(a) for a in _store(request).acls(principal)]})


@router.post(BASE + "/acls", status_code=201, openapi_extra=json_body(AclBody))
async def add_acl(cluster_id: str, request: Request) -> Response:
    """Allow a principal an operation on a topic, group (by name or prefix) or the cluster."""
    check_cluster(cluster_id)
    acl = _to_acl(decode(await read_body(request, MAX_BODY), _acl))
    created = _store(request).add_acl(acl)
    return json_response(_acl_body(acl), status=201 if created else 200)


@router.post(BASE + "/acls:delete", status_code=204, openapi_extra=json_body(AclBody))
async def remove_acl(cluster_id: str, request: Request) -> Response:
    """Remove one ACL (404 if there is no such ACL)."""
    check_cluster(cluster_id)
    acl = _to_acl(decode(await read_body(request, MAX_BODY), _acl))
    if not _store(request).remove_acl(acl):
        raise UnknownAclError(f"no such ACL: {_acl_body(acl)}")
    return Response(status_code=204)


@router.get(BASE + "/api-keys")
async def list_keys(cluster_id: str, request: Request) -> Response:
    """Key ids and principals (never secrets)."""
    check_cluster(cluster_id)
    return json_response({"data": [k.public() for k in _store(request).api_keys()]})


@router.post(BASE + "/api-keys", status_code=201, openapi_extra=json_body(KeyCreate))
async def create_key(cluster_id: str, request: Request) -> Response:
    """A new key: ``{key_id, secret, principal}``; the secret is shown only here."""
    check_cluster(cluster_id)
    body = decode(await read_body(request, MAX_BODY), _key)
    try:
        key, secret = _store(request).create_key(body.principal)
    except SecurityError as exc:  # a reserved principal (broker-<id>)
        raise InvalidPrincipalError(str(exc)) from None
    return json_response({**key.public(), "secret": secret}, status=201)


@router.delete(BASE + "/api-keys/{key_id}", status_code=204)
async def delete_key(cluster_id: str, request: Request,
                     key_id: Annotated[str, Path(max_length=64)]) -> Response:
    """Revoke a key: requests with it get 401 from now on."""
    check_cluster(cluster_id)
    if not _store(request).delete_key(key_id):
        raise UnknownApiKeyError(f"no API key {key_id}")
    return Response(status_code=204)
