"""Every error the API returns, rendered in one place as an HTTP status and a JSON body.

Body: ``{"error_code": <int>, "error": <name>, "message": <what to fix>, "retriable":
<bool>}``: Confluent REST Proxy v3's ``Error`` (``error_code``, ``message``) with
lakelog's error name and whether trying again can succeed added (plus the fields an
error carries, e.g. ``log_start_offset``). Each error's status, code, name and
``retriable`` come from the table in ``log_tables.errors``; as in Confluent,
``error_code`` is the HTTP status, or the status times 100 plus a detail number where
one status covers several causes; where Confluent names a code, lakelog uses it (40002
a topic that exists, 40403 an unknown topic, 42208 an empty batch).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.session import UNREACHABLE
from log_tables import errors as e

log = logging.getLogger(__name__)


class ApiError(e.LakelogError):
    """A request-level error decided by the HTTP layer (bad JSON, too large, ...): its
    status, error code and name are the instance's own. ``retriable`` by default for
    "busy" (429) and "unavailable" (503)."""

    def __init__(self, status: int, message: str, error_code: int | None = None,
                 name: str = "bad_request", retry_after_s: int | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code or status
        self.code = name
        self.retry_after_s = retry_after_s
        self.retriable = status in (429, 503) if retriable is None else retriable


def status_of(exc: BaseException) -> tuple[int, int, str, str]:
    """(HTTP status, error_code, error name, message) for any exception: a lakelog error
    says its own (``log_tables.errors``); anything else is a 500 ``internal_error``."""
    if isinstance(exc, e.CorruptRecordError):
        log.error("%s: answered 410 corrupt_record, never served as data", exc.message)
    if isinstance(exc, e.LakelogError):
        return exc.status, exc.error_code, exc.code, exc.message
    if isinstance(exc, UNREACHABLE):  # a broker of a cluster: ZooKeeper restarting or cut off
        cls = e.BrokerNotAvailableError
        return cls.status, cls.error_code, cls.code, (
            f"ZooKeeper is out of reach ({type(exc).__name__}); try again")
    log.exception("unexpected error", exc_info=exc)
    return 500, 50000, "internal_error", f"internal error: {type(exc).__name__}"


def error_body(exc: BaseException) -> tuple[int, dict[str, object]]:
    status, code, name, message = status_of(exc)
    body: dict[str, object] = {"error_code": code, "error": name, "message": message,
                               "retriable": (isinstance(exc, e.LakelogError) and exc.retriable)
                               or isinstance(exc, UNREACHABLE)}
    if isinstance(exc, e.OffsetOutOfRangeError):
        body["log_start_offset"] = exc.log_start_offset
        body["high_watermark"] = exc.high_watermark
    if isinstance(exc, e.CorruptRecordError):
        if exc.topic is not None:
            body["topic_name"] = exc.topic
            body["partition_id"] = exc.partition
        if exc.first_offset is not None and exc.next_offset is not None:
            body["first_offset"] = exc.first_offset
            body["last_offset"] = exc.next_offset - 1
            body["next_offset"] = exc.next_offset
        body["file"] = exc.path
        body["file_position"] = exc.position
    return status, body


def error_response(exc: BaseException, headers: dict[str, str] | None = None) -> JSONResponse:
    status, body = error_body(exc)
    headers = dict(headers or {})
    retry = getattr(exc, "retry_after_s", None)
    if status == 429 or retry is not None:
        headers["Retry-After"] = str(retry or 1)
    return JSONResponse(body, status_code=status, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """The methods of every documented path that matches the request's (each method of a
    path is a route of its own, so Starlette's 405 knows only one of them)."""
    app = request.app
    table: list[tuple[re.Pattern[str], list[str]]] | None = getattr(app.state, "allowed", None)
    if table is None:
        table = [(re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$"),
                  [m.upper() for m in operations])
                 for path, operations in app.openapi()["paths"].items()]
        app.state.allowed = table
    path = request.url.path
    return sorted({m for pattern, methods in table if pattern.match(path) for m in methods})


class KeepConnectionOnError:
    """Answers an unexpected exception with the 500 body and keeps the connection.

    Starlette's outermost middleware answers it too, but then re-raises, and uvicorn
    closes a connection whose application raised: a client's next request on the same
    keep-alive connection would fail as well. Once a response has started, nothing
    honest can follow it: the exception goes on and the connection closes.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except Exception as exc:
            if started:
                raise
            await error_response(exc)(scope, receive, send)


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the error body above."""

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if exc.errors() and all(err.get("loc", ("",))[0] == "path" for err in exc.errors()):
            return error_response(path_error(exc.errors()))
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg')}")
        return error_response(ApiError(422, "; ".join(parts) or "invalid request",
                                       name="invalid_request"))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        headers = {}
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            allowed = allowed_methods(request)
            if request.method == "OPTIONS":  # RFC 9110: what the resource takes, in Allow
                return Response(status_code=204,
                                headers={"Allow": ", ".join([*allowed, "OPTIONS"])})
            message = (f"method {request.method} is not allowed on {request.url.path}; "
                       f"allowed: {', '.join(allowed)}")
            headers["Allow"] = ", ".join(allowed)
        return error_response(ApiError(exc.status_code, message, name="http_error"), headers)

    async def on_disconnect(request: Request, exc: Exception) -> JSONResponse:
        # The client left (or was timed out) before its body was complete: nothing
        # of a partial body is produced, and nobody is listening for this answer.
        return error_response(ApiError(400, "the client disconnected before the request "
                                            "body was complete", name="client_disconnected"))

    app.add_exception_handler(ClientDisconnect, on_disconnect)
    app.add_exception_handler(e.LakelogError, on_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_error)


_OUT_OF_RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def path_error(errors: Sequence[Any]) -> ApiError:
    """A path that names no resource: an integer id out of range (a negative partition) is
    404, as no such resource exists (40402 for a partition, as Confluent's "partition not
    found"); anything else that is not what the path takes (``partitions/abc``) is 400,
    which every Confluent operation documents (it documents no 422)."""
    for err in errors:
        name = str(err.get("loc", ("", ""))[-1])
        if err.get("type") in _OUT_OF_RANGE:
            partition = name == "partition_id"
            return ApiError(404, f"no {name.replace('_id', '')} {err.get('input')!s} exists "
                                 f"({name}: {err.get('msg')})",
                            error_code=40402 if partition else 404,
                            name="unknown_topic_or_partition" if partition else "not_found")
    where = "; ".join(f"path.{err.get('loc', ('', ''))[-1]}: {err.get('msg')}" for err in errors)
    return ApiError(400, where, name="invalid_parameter")


def error_of(r: httpx.Response) -> ApiError:
    """The error of another broker's answer, as this broker answers it."""
    try:
        body = r.json()
        return ApiError(r.status_code, body["message"], error_code=body["error_code"],
                        name=body["error"], retriable=body.get("retriable"))
    except (ValueError, KeyError, TypeError):
        return ApiError(r.status_code, f"another broker answered {r.status_code}: "
                                       f"{r.text[:200]}", name="broker_error")
