"""Every error the API returns, rendered in one place as an HTTP status and a JSON body.

Body: ``{"error_code": <int>, "error": <name>, "message": <what to fix>, "retriable":
<bool>}``: Confluent REST Proxy v3's ``Error`` (``error_code``, ``message``) with
lakelog's error name and whether trying again can succeed added (plus the fields an
error carries, e.g. ``log_start_offset``). Name and ``retriable`` come from the one table
(``log_tables.errors``); the HTTP status and ``error_code`` of each of its classes are
this module's (``HTTP``, and ``DETAILS`` for an instance's finer cause: a full disk is
507). As in Confluent, ``error_code`` is the HTTP status, or the status times 100 plus a
detail number where one status covers several causes; where Confluent names a code,
lakelog uses it (40002 a topic that exists, 40403 an unknown topic, 42208 an empty batch).
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
from log_tables.request_errors import MALFORMED

log = logging.getLogger(__name__)


HTTP: dict[type[e.LakelogError], tuple[int, int]] = {
    e.LakelogError: (400, 40000), e.InvalidTopicError: (400, 40002),
    e.TopicExistsError: (400, 40002), e.UnknownTopicError: (404, 40403),
    e.UnknownTopicIdError: (404, 40403), e.UnknownPartitionError: (404, 40402),
    e.InvalidPartitionsError: (400, 40003), e.InvalidConfigError: (400, 40004),
    e.InvalidOptionError: (400, 40000), e.InvalidRecordError: (422, 42201),
    e.RecordTooLargeError: (413, 41301), e.OffsetOutOfRangeError: (416, 41601),
    e.CorruptRecordError: (410, 41001), e.CorruptIndexError: (400, 40000),
    e.IndexOrderError: (400, 40000), e.LogClosedError: (503, 50301),
    e.StorageError: (500, 50001), e.StaleTableError: (500, 50001),
    e.QueueFullError: (429, 42901), e.OutOfOrderSequenceError: (409, 40904),
    e.InvalidProducerEpochError: (409, 40903), e.UnknownProducerIdError: (404, 40404),
    e.DataDirLockedError: (400, 40000), e.UnknownGroupError: (404, 40405),
    e.UnknownMemberError: (404, 40406), e.StaleMemberEpochError: (409, 40905),
    e.GroupNotEmptyError: (409, 40906), e.InconsistentGroupError: (400, 40005),
    e.NoOffsetError: (416, 41602), e.InvalidReplicationFactorError: (400, 40005),
    e.InvalidReplicaAssignmentError: (400, 40005),
    # a cluster's
    e.NotLeaderError: (421, 42101), e.LeaderNotAvailableError: (503, 50302),
    e.NotControllerError: (503, 50304), e.BrokerNotAvailableError: (503, 50305),
    e.NotCoordinatorError: (421, 42102), e.CoordinatorNotAvailableError: (503, 50306),
    e.CoordinatorLoadInProgressError: (503, 50310), e.NotEnoughReplicasError: (503, 50307),
    e.NotEnoughReplicasAfterAppendError: (503, 50308), e.FencedLeaderEpochError: (421, 42103),
    e.UnknownLeaderEpochError: (503, 50309), e.RequestTimedOutError: (504, 50401),
    e.IsrConflictError: (409, 40901), e.IsrFencedError: (409, 40901),
    e.InvalidIsrError: (400, 40010),
    # transactions'
    e.ProducerFencedError: (409, 40907), e.InvalidProducerIdMappingError: (409, 40908),
    e.InvalidTxnStateError: (409, 40909), e.InvalidTransactionTimeoutError: (400, 40011),
    e.ConcurrentTransactionsError: (409, 40910), e.TransactionalIdNotFoundError: (404, 40407),
    e.UnstableOffsetCommitError: (409, 40911), e.TransactionAbortableError: (409, 40912),
    # the schema registry's: Confluent Schema Registry's own codes
    e.SubjectNotFoundError: (404, 40401), e.VersionNotFoundError: (404, 40402),
    e.SchemaNotFoundError: (404, 40403), e.SubjectSoftDeletedError: (404, 40404),
    e.SubjectNotSoftDeletedError: (404, 40405), e.SchemaVersionSoftDeletedError: (404, 40406),
    e.SchemaVersionNotSoftDeletedError: (404, 40407),
    e.SubjectLevelCompatibilityNotConfiguredError: (404, 40408),
    e.SubjectLevelModeNotConfiguredError: (404, 40409), e.IncompatibleSchemaError: (409, 409),
    e.InvalidSchemaError: (422, 42201), e.InvalidVersionError: (422, 42202),
    e.InvalidCompatibilityLevelError: (422, 42203), e.InvalidModeError: (422, 42204),
    e.OperationNotPermittedError: (422, 42205), e.ReferenceExistsError: (422, 42206),
    # a request's form
    e.BadRequestError: (400, 400), e.InvalidRequestError: (422, 422),
    e.InvalidParameterError: (400, 400), e.MalformedJsonError: (400, 400),
    e.InvalidBase64Error: (400, 400), e.EmptyBodyError: (422, 422),
    e.UnsupportedMediaTypeError: (415, 415), e.RequestTooLargeError: (413, 413),
    e.TooManyRequestsError: (429, 429), e.ServiceUnavailableError: (503, 503),
    e.MalformedHttpError: (400, 400), e.RequestTimeoutError: (408, 408),
    e.RequestHeaderTooLargeError: (431, 431), e.HttpError: (404, 404),
    e.ClientDisconnectedError: (400, 400), e.BrokerAnswerError: (502, 502),
    e.InvalidBatchError: (422, 42208), e.EmptyBatchError: (422, 42208),
    e.TooManyEntriesError: (413, 413), e.InvalidOffsetTypeError: (400, 400),
    # security
    e.AuthenticationFailedError: (401, 40101), e.AuthorizationFailedError: (403, 40301),
    e.ImpersonationRefusedError: (403, 40302), e.InvalidPrincipalError: (400, 40007),
    e.InvalidAclError: (400, 40006), e.UnknownAclError: (404, 40407),
    e.UnknownApiKeyError: (404, 40408), e.SecurityDisabledError: (409, 40907),
    # look-ups, and the server's own processes
    e.NotFoundError: (404, 404), e.UnknownClusterError: (404, 404),
    e.UnknownBrokerError: (404, 404), e.UnknownReplicaError: (404, 404),
    e.NoReassignmentError: (404, 404), e.UnknownConfigError: (404, 40409),
    e.NoOffsetsError: (404, 404), e.NotAClusterError: (404, 404),
    e.InternalError: (500, 50000), e.PortTakenError: (400, 40000),
    e.EndpointUnavailableError: (400, 40000),
}
"""(HTTP status, Confluent ``error_code``) of every class of the table."""

DETAILS: dict[tuple[type[e.LakelogError], str], tuple[int, int]] = {
    (e.StorageError, e.DISK_FULL): (507, 50701),  # 507 Insufficient Storage
    (e.UnknownMemberError, e.CONSUMER): (404, 404),
    (e.InvalidRequestError, MALFORMED): (400, 400),  # where Confluent documents no 422
    (e.EmptyBodyError, MALFORMED): (400, 400),
}
"""The same for an instance's ``detail``, where it has its own."""


class ApiError(e.LakelogError):
    """An error whose status, error code and name are the instance's own: the front's
    parsing of HTTP (bad JSON, too large, ...), whose names are the table's (its
    ``request_errors``), and another broker's error answer passed on as it was.
    ``retriable`` by default for "busy" (429) and "unavailable" (503)."""

    def __init__(self, status: int, message: str, error_code: int | None = None,
                 name: str = e.BadRequestError.code, retry_after_s: int | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code or status
        self.code = name
        self.retry_after_s = retry_after_s
        self.retriable = status in (429, 503) if retriable is None else retriable


def for_code(error_code: int, error: str | None = None) -> type[e.LakelogError]:
    """The table's class of an error body: by its ``error_code``; by its ``error`` name
    where one code has several classes (40002 is both a taken and an invalid topic name)
    or none; ``LakelogError`` for what the table does not know. (Once
    ``log_tables.errors.for_code``; the client types bodies by name:
    ``lakelog.client.errors.class_of``.)"""
    found = [cls for cls in e.ERRORS if HTTP.get(cls, (0, 0))[1] == error_code]
    if found and (error is None or (len(found) == 1 and found[0].code == error)):
        return found[0]  # without a name, a shared code's first class
    for cls in found:
        if cls.code == error:
            return cls
    return e.for_name(error)


def wire_of(exc: e.LakelogError) -> tuple[int, int]:
    """(HTTP status, ``error_code``) of a lakelog error: its detail's, else its class's
    (or the nearest table class it derives from)."""
    if isinstance(exc, ApiError):
        return exc.status, exc.error_code
    if exc.detail is not None:
        found = DETAILS.get((type(exc), exc.detail))
        if found is not None:
            return found
    for cls in type(exc).__mro__:
        wire = HTTP.get(cls)
        if wire is not None:
            return wire
    raise AssertionError("unreachable: LakelogError is in HTTP")


def status_of(exc: BaseException) -> tuple[int, int, str, str]:
    """(HTTP status, error_code, error name, message) for any exception: a lakelog error
    by the table (``HTTP``); anything else is a 500 ``internal_error``."""
    if isinstance(exc, e.CorruptRecordError):
        log.error("%s: answered 410 corrupt_record, never served as data", exc.message)
    if isinstance(exc, e.LakelogError):
        return (*wire_of(exc), exc.code, exc.message)
    if isinstance(exc, UNREACHABLE):  # a broker of a cluster: ZooKeeper restarting or cut off
        cls = e.BrokerNotAvailableError
        return (*HTTP[cls], cls.code,
                f"ZooKeeper is out of reach ({type(exc).__name__}); try again")
    log.exception("unexpected error", exc_info=exc)
    return (*HTTP[e.InternalError], e.InternalError.code,
            f"internal error: {type(exc).__name__}")


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
                                       name=e.InvalidRequestError.code))

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
        return error_response(ApiError(exc.status_code, message, name=e.HttpError.code),
                              headers)

    async def on_disconnect(request: Request, exc: Exception) -> JSONResponse:
        # The client left (or was timed out) before its body was complete: nothing
        # of a partial body is produced, and nobody is listening for this answer.
        return error_response(e.ClientDisconnectedError(
            "the client disconnected before the request body was complete"))

    app.add_exception_handler(ClientDisconnect, on_disconnect)
    app.add_exception_handler(e.LakelogError, on_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_error)


_OUT_OF_RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def path_error(errors: Sequence[Any]) -> e.LakelogError:
    """A path that names no resource: an integer id out of range (a negative partition) is
    404, as no such resource exists (40402 for a partition, as Confluent's "partition not
    found"); anything else that is not what the path takes (``partitions/abc``) is 400,
    which every Confluent operation documents (it documents no 422)."""
    for err in errors:
        name = str(err.get("loc", ("", ""))[-1])
        if err.get("type") in _OUT_OF_RANGE:
            message = (f"no {name.replace('_id', '')} {err.get('input')!s} exists "
                       f"({name}: {err.get('msg')})")
            if name == "partition_id":
                return e.UnknownPartitionError.saying(message)
            return e.NotFoundError(message)
    where = "; ".join(f"path.{err.get('loc', ('', ''))[-1]}: {err.get('msg')}" for err in errors)
    return e.InvalidParameterError(where)


def relayed(name: str, message: str, error_code: int, retriable: bool | None = None,
            status: int | None = None) -> ApiError:
    """Another broker's error answer (or a failed entry of it), passed on as it was: its
    name is a table's name of that broker's (which may be newer than this one's)."""
    if status is None:  # an entry's: its status is in its code
        status = error_code // 100 if error_code >= 10000 else error_code
    return ApiError(status, message, error_code=error_code, name=name, retriable=retriable)


def error_of(r: httpx.Response) -> ApiError:
    """The error of another broker's answer, as this broker answers it."""
    try:
        body = r.json()
        return relayed(body["error"], body["message"], body["error_code"],
                       body.get("retriable"), r.status_code)
    except (ValueError, KeyError, TypeError):
        return ApiError(r.status_code, f"another broker answered {r.status_code}: "
                                       f"{r.text[:200]}", name=e.BrokerAnswerError.code)
