"""The dashboard's routes: the page (``/ui``, one HTML file shipped in the package), its
data (``/ui/data``, JSON, cluster ``describe`` as ``/metrics``) and the sign-in.

Signing in: the page posts the API key (``KEY_ID:SECRET``) as JSON to ``/ui/login``,
which checks it as every request is checked and answers with an HttpOnly,
SameSite=Strict cookie (Secure under TLS) scoped to ``/ui`` that holds the key; the
authentication middleware accepts that cookie on ``/ui/data`` only
(``ingest_api.http.auth.UI_COOKIE``). So the page's script never holds the secret after
sign-in, a revoked key stops working on the next refresh, any broker of a cluster
accepts it, and the API's own endpoints still take only the ``Authorization`` header:
no request that changes anything can ride on the cookie. The login is JSON-only, which
a form on another site cannot send.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ingest_api.broker.security import CLUSTER, SecurityStore
from ingest_api.http.auth import UI_COOKIE, UI_DATA_PATH
from ingest_api.http.body import decode, read_body
from ingest_api.http.dashboard.overview import Dashboard
from ingest_api.http.state import json_response
from log_tables.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
)

router = APIRouter(include_in_schema=False)
MAX_LOGIN_BYTES = 4096
PAGE = resources.files("ingest_api.http.dashboard").joinpath("dashboard.html").read_bytes()


def _csp(page: bytes) -> str:
    """A policy that runs only the page's own inline script and style (by hash): data
    shown on it can never become code."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rb"<%s>(.*?)</%s>" % (tag.encode(), tag.encode()), page, re.S)
        digests = (base64.b64encode(hashlib.sha256(b).digest()).decode() for b in blocks)
        return " ".join(f"'sha256-{d}'" for d in digests)
    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'")


PAGE_HEADERS = {"content-security-policy": _csp(PAGE), "cache-control": "no-store",
                "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
                "x-frame-options": "DENY"}


class Login(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    """``KEY_ID:SECRET`` as ``lakelog keys create`` prints it (``KEY_ID.SECRET`` too)."""


_login = msgspec.json.Decoder(Login)


def dashboard(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
async def page() -> Response:
    """The page: no data in it; its script reads ``/ui/data`` (and asks for a key on 401)."""
    return Response(PAGE, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.get(UI_DATA_PATH)
async def data(request: Request) -> Response:
    """Everything the page shows (see ``overview``), and who is signed in."""
    body = await dashboard(request).overview()
    return json_response({**body, "principal": request.state.principal},
                         headers={"cache-control": "no-store"})


@router.post("/ui/login")
async def login(request: Request) -> Response:
    """Check an API key and keep it in the page's cookie: 401 for a wrong one, 403 for a
    principal that may not describe the cluster (what the page shows)."""
    store: SecurityStore | None = request.app.state.security
    body = decode(await read_body(request, MAX_LOGIN_BYTES), _login)
    if store is None:
        return json_response({"principal": None, "auth": "none"})
    key_id, sep, secret = body.key.strip().replace(".", ":", 1).partition(":")
    principal = store.authenticate(key_id, secret) if sep and key_id and secret else None
    if principal is None:
        raise AuthenticationFailedError("unknown API key or wrong secret: paste KEY_ID:SECRET "
                                        "as 'lakelog keys create' printed it (the first admin "
                                        "key is in the data directory's security/admin.key)")
    if not store.allowed(principal, "cluster", CLUSTER, "describe"):
        raise AuthorizationFailedError(
            f"principal '{principal}' may not describe the cluster, which the dashboard shows "
            "(as /metrics); an admin can allow it: lakelog acls add --principal "
            f"{principal} --operation describe --cluster")
    response = json_response({"principal": principal})
    response.set_cookie(UI_COOKIE, f"{key_id}.{secret}", path="/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    response = Response(status_code=204)
    response.delete_cookie(UI_COOKIE, path="/ui", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response
