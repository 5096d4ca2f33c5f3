"""Authentication and authorisation of every request, before any route runs.

One table maps each endpoint (method + path) to the resource and operation it
needs. The check runs before routing, so a denied request learns nothing about
whether its topic or group exists: 403 reads the same either way. An endpoint
missing from the table needs cluster ``admin`` (deny by default); a test checks
that every route of the app has its rule. Lists (topics, groups) are filtered in
their routers to what the principal may describe.

A broker forwarding a user's request authenticates with its own key (principal
``broker-N``) and names the user in ``Lakelog-Principal``; every check then uses the
user's ACLs. Anyone else sending that header is refused: users cannot act as others.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ingest_api.broker.security import (
    CLUSTER,
    PRINCIPAL_HEADER,
    SecurityStore,
    is_broker_principal,
    parse_credentials,
    valid_principal,
)
from ingest_api.http.errors import wire_of
from log_tables import errors as e

_B = r"^/v3/clusters/lakelog"
_NAME = r"(?P<name>[^/]+)"


class Rule(NamedTuple):
    methods: frozenset[str]
    pattern: re.Pattern[str]
    resource_type: str | None
    """None: any authenticated principal may call it."""
    operation: str


def _rule(methods: str, pattern: str, resource_type: str | None, operation: str = "") -> Rule:
    return Rule(frozenset(methods.split()), re.compile(pattern + "$"), resource_type, operation)


RULES: tuple[Rule, ...] = (
    _rule("GET", r"^/v3/clusters(/lakelog)?", None),
    _rule("GET", r"^/(openapi\.json|docs|docs/oauth2-redirect|redoc)", None),
    _rule("GET", r"^/metrics", "cluster", "describe"),
    _rule("GET", r"^/ui/data", "cluster", "describe"),  # the dashboard sees what /metrics does
    _rule("POST", _B + r"/topics", "cluster", "admin"),
    _rule("GET", _B + r"/topics", None),  # filtered to what the principal may describe
    _rule("POST", _B + rf"/topics/{_NAME}/records(:batch)?", "topic", "produce"),
    _rule("POST", _B + rf"/topics/{_NAME}/records:delete", "topic", "delete"),
    _rule("GET", _B + rf"/topics/{_NAME}/partitions/[^/]+/(records|offsets)", "topic", "consume"),
    _rule("DELETE", _B + rf"/topics/{_NAME}", "topic", "delete"),
    _rule("PATCH", _B + rf"/topics/{_NAME}", "topic", "alter"),
    _rule("PUT DELETE", _B + rf"/topics/{_NAME}/configs/[^/]+", "topic", "alter"),
    _rule("POST", _B + rf"/topics/{_NAME}/configs:alter", "topic", "alter"),
    _rule("POST", _B + rf"/topics/{_NAME}/segments:roll", "topic", "alter"),
    _rule("GET", _B + r"/topics/-/partitions/-/reassignment", None),  # always empty
    _rule("GET", _B + rf"/topics/{_NAME}(/configs(/[^/]+)?|/partitions(/[^/]+(/replicas(/[^/]+)?"
          r"|/reassignment|/offset)?)?)?", "topic", "describe"),
    _rule("GET", _B + r"/brokers(/[^/]+(/partition-replicas)?)?", None),  # filtered
    _rule("GET", _B + r"/(brokers/[^/]+/configs|broker-configs)", "cluster", "describe"),
    _rule("POST", _B + r"/producers", None),
    _rule("GET", _B + r"/consumer-groups", None),  # filtered
    _rule("POST", _B + rf"/consumer-groups/{_NAME}/offsets", "group", "commit"),
    _rule("POST", _B + rf"/consumer-groups/{_NAME}/offsets:reset", "group", "alter"),
    _rule("DELETE", _B + rf"/consumer-groups/{_NAME}", "group", "delete"),
    _rule("GET", _B + rf"/consumer-groups/{_NAME}(/offsets|/coordinator|/lag-summary|/lags(/[^/]+"
          r"/partitions/[^/]+)?|/consumers(/[^/]+(/assignments(/[^/]+/partitions/[^/]+)?)?)?)?",
          "group", "describe"),
    _rule("POST GET DELETE", _B + rf"/consumer-groups/{_NAME}/members(/[^/]+(/heartbeat|"
          r"/records|/positions)?)?", "group", "consume"),
    _rule("POST", _B + rf"/transactions/{_NAME}(:init|:commit|:abort|/partitions|/offsets)",
          "transactional_id", "write"),
    _rule("GET", _B + rf"/transactions/{_NAME}", "transactional_id", "describe"),
    _rule("GET", _B + r"/transactions", "cluster", "describe"),
    _rule("GET", _B + r"/jobs/runs", "cluster", "describe"),
    _rule("GET POST", _B + r"/(acls|acls:delete|api-keys)", "cluster", "admin"),
    _rule("DELETE", _B + r"/api-keys/[^/]+", "cluster", "admin"),
    # The schema registry (Confluent's paths): any principal; the routes check subjects.
    _rule("GET POST PUT DELETE", r"^/(subjects|schemas|config|mode|compatibility)(/.*)?",
          None),
    _rule("POST", r"^/internal/replica/(fetch|epoch-end)", None),  # brokers only: see there
    _rule("POST", r"^/internal/txn/(marker|verify|offsets-check|offsets-commit)", None),  # same
)
OPEN_PATHS = frozenset({"/healthz", "/", "/ui", "/ui/login", "/ui/logout"})
"""No credentials needed: liveness, and the dashboard's page and sign-in (they hold no
data; the page's data comes from ``UI_DATA_PATH``)."""
UI_COOKIE = "lakelog_ui"
"""The dashboard's sign-in cookie: the API key (``key_id.secret``), HttpOnly and
SameSite=Strict, accepted as credentials on ``UI_DATA_PATH`` alone, a GET that changes
nothing, so no other request can be made with it from a page."""
UI_DATA_PATH = "/ui/data"
ADMIN = Rule(frozenset(), re.compile(""), "cluster", "admin")
CHALLENGE = b'Basic realm="lakelog", Bearer realm="lakelog"'
_ON_BEHALF = PRINCIPAL_HEADER.lower().encode()


def rule_for(method: str, path: str) -> tuple[Rule, str]:
    """The rule of a request and the resource name it names (deny by default: admin)."""
    for rule in RULES:
        if method in rule.methods and (m := rule.pattern.match(path)):
            return rule, m.groupdict().get("name") or CLUSTER
    return ADMIN, CLUSTER


class AuthMiddleware:
    """Sets ``request.state.principal`` (None with authentication off; the user a broker
    acts for when it names one) and ``request.state.forwarded_by`` (that broker's
    principal, else None), or answers 401 (no or wrong credentials) / 403 (not allowed,
    or ``Lakelog-Principal`` from a non-broker) / 400 (a malformed ``Lakelog-Principal``)."""

    def __init__(self, app: ASGIApp, store: SecurityStore | None) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["principal"] = state["forwarded_by"] = None
        if self.store is None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = on_behalf = cookie = None
        for k, v in scope["headers"]:
            if k == b"authorization" and header is None:
                header = v.decode("latin-1")
            elif k == _ON_BEHALF and on_behalf is None:
                on_behalf = v.decode("latin-1").strip()
            elif k == b"cookie" and cookie is None:
                cookie = v
        if header is None and cookie is not None and scope["path"] == UI_DATA_PATH:
            header = ui_credentials(cookie)
        creds = parse_credentials(header)
        principal = self.store.authenticate(*creds) if creds else None
        if principal is None:
            why = ("no credentials: send an API key as HTTP Basic (key id, secret) or "
                   "'Authorization: Bearer <key id>.<secret>'" if creds is None and not header
                   else "unknown API key or wrong secret" if creds
                   else "malformed Authorization header: use Basic or Bearer")
            # No challenge to the dashboard's page: a browser would answer it with its
            # own password dialog, and the page asks for the key itself.
            await _reject(send, e.AuthenticationFailedError(why),
                          [(b"www-authenticate", CHALLENGE)]
                          if scope["path"] != UI_DATA_PATH else None)
            return
        if on_behalf is not None:
            if not is_broker_principal(principal):
                await _reject(send, e.ImpersonationRefusedError(
                    f"principal '{principal}' may not send {PRINCIPAL_HEADER}: only brokers "
                    "forwarding a request name the principal it is for; drop the header"))
                return
            if not valid_principal(on_behalf):
                await _reject(send, e.InvalidPrincipalError(
                    f"{PRINCIPAL_HEADER} must be 1-200 characters of [A-Za-z0-9._@-]"))
                return
            state["forwarded_by"], principal = principal, on_behalf
        rule, name = rule_for(scope["method"], scope["path"])
        if rule.resource_type is not None and not self.store.allowed(
                principal, rule.resource_type, name, rule.operation):
            what = CLUSTER if rule.resource_type == "cluster" else f"{rule.resource_type} '{name}'"
            await _reject(send, e.AuthorizationFailedError(
                f"principal '{principal}' is not allowed to {rule.operation} on {what}"))
            return
        state["principal"] = principal
        await self.app(scope, receive, send)


def ui_credentials(cookie: bytes) -> str | None:
    """The ``Authorization`` value the dashboard's cookie stands for (None: no such cookie)."""
    for part in cookie.decode("latin-1").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == UI_COOKIE and value:
            return f"Bearer {value.strip().strip(chr(34))}"
    return None


async def _reject(send: Send, error: e.LakelogError,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    status, code = wire_of(error)
    body = msgspec.json.encode({"error_code": code, "error": error.code,
                                "message": error.message, "retriable": False})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def may(request: Request, resource_type: str, name: str, operation: str) -> bool:
    """Whether the request's principal may (always, with authentication off)."""
    store: SecurityStore | None = request.app.state.security
    if store is None:
        return True
    principal = request.state.principal
    return principal is not None and store.allowed(principal, resource_type, name, operation)


def require(request: Request, resource_type: str, name: str, operation: str) -> None:
    """403 unless the principal may (for checks that depend on the body)."""
    if not may(request, resource_type, name, operation):
        raise e.AuthorizationFailedError(f"principal '{request.state.principal}' is not "
                                         f"allowed to {operation} on {resource_type} '{name}'")
