"""lakelog's check in front of Spark Connect: a gRPC proxy on the endpoint's public port.

Spark Connect itself knows one shared token at most, not lakelog's API keys and topic
ACLs, so every call passes through here before the Spark Connect server (on a loopback
port of its own) sees it:

- **Authentication** (``auth=api-key``): the call must carry an API key as Spark
  Connect's bearer token (``sc://localhost:15002/;token=KEY_ID.SECRET``). The session's
  user becomes the key's principal, whatever the client claimed, so no one reaches
  another principal's session.
- **Views**: before a plan runs, the views it names are registered (again, where their
  data changed) in its session (``sessions.SessionViews``), holding only the topics the
  principal may consume.
- **ACLs**: a principal without cluster ``admin`` may only read the views of the topics
  it may consume (and lakelog's system views): its SQL, expression strings and table
  names are checked on Spark's own parse of them (``guard.PlanGuard``: queries and
  read-only commands only, single-name views, no topic it may not consume, no file
  paths, no reflection), and the plan fields that write, read files or data sources,
  run code of the caller's (UDFs, artifacts, extensions), change settings, touch the
  shared cache or make global views are refused (``plans.check_request``), each with a
  PERMISSION_DENIED that says what needs cluster admin. ``runSQLOnFiles`` is off in every session besides.
- **The backend** takes calls from this front alone: it wants a random bearer token that
  only this process knows (``spark.connect.authenticate.token``).

Bytes pass through unparsed except requests, which are small; Arrow results stream
straight back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ingest_api.broker.security import parse_credentials
from lakelog.endpoint.guard import PlanGuard, Refused
from lakelog.endpoint.plans import Choices, Strings, check_request, named, walk
from lakelog.endpoint.sessions import SessionViews

if TYPE_CHECKING:
    from ingest_api.broker.security import SecurityStore

log = logging.getLogger(__name__)
SERVICE = "spark.connect.SparkConnectService"
MAX_CONCURRENT_RPCS = 64
MAX_CALLS_PER_PRINCIPAL = 16
"""Calls one principal may have open at once (a streaming call until its last answer)."""
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""What Spark Connect's own client and server allow a message (a large plan, an
Arrow batch of results)."""


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str | None
    """None: authentication is off (loopback only)."""
    admin: bool


def _methods() -> dict[str, tuple[bool, bool, Any]]:
    """Spark Connect's methods: (client streaming, server streaming, request class)."""
    from pyspark.sql.connect.proto import base_pb2

    service = base_pb2.DESCRIPTOR.services_by_name["SparkConnectService"]
    return {m.name: (m.client_streaming, m.server_streaming,
                     getattr(base_pb2, m.input_type.name)) for m in service.methods}


class ConnectFront(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Forwards Spark Connect calls to ``backend`` once they pass lakelog's checks."""

    def __init__(self, backend: str, backend_token: str, views: SessionViews,
                 store: SecurityStore | None) -> None:
        self.views = views
        self.store = store
        self.guard = PlanGuard(views.root._jvm, views.root._jsparkSession)
        self._backend_auth = ("authorization", f"Bearer {backend_token}")
        self._channel = grpc.insecure_channel(backend, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._methods = _methods()
        self._calls: dict[str, int] = {}
        self._calls_lock = threading.Lock()

    # ---- grpc's side -----------------------------------------------------------------

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, name = details.method.lstrip("/").rpartition("/")
        found = self._methods.get(name) if service == SERVICE else None
        if found is None:
            return None  # UNIMPLEMENTED
        client_streaming, server_streaming, request_type = found
        method = details.method
        try:
            # The key is checked from the call's metadata, before gRPC reads its message:
            # a caller without a valid key makes the front hold no message (up to
            # MAX_MESSAGE_BYTES each) and is answered without one being read.
            caller = self._caller(details.invocation_metadata)
        except Denied as denied:
            return _refusal(denied)
        if client_streaming:
            return grpc.stream_unary_rpc_method_handler(
                lambda requests, context: self._stream_in(method, caller, request_type,
                                                          requests, context))
        if server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: self._stream_out(method, name, caller, request_type,
                                                          request, context))
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._unary(method, name, caller, request_type, request,
                                                 context))

    def _unary(self, method: str, name: str, caller: Caller, request_type: Any, raw: bytes,
               context: grpc.ServicerContext) -> bytes:
        with _answering(context), self._slot(caller):
            request = self._admit(caller, name, request_type, raw)
            call = self._channel.unary_unary(method)
            answer: bytes = call(request, metadata=self._forwarded(context),
                                 timeout=_deadline(context))
            return answer

    def _stream_out(self, method: str, name: str, caller: Caller, request_type: Any,
                    raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        # The slot is held until the last answer (or the cancel).
        with _answering(context), self._slot(caller):
            request = self._admit(caller, name, request_type, raw)
            call = self._channel.unary_stream(method)(
                request, metadata=self._forwarded(context), timeout=_deadline(context))
            context.add_callback(call.cancel)
            yield from call

    def _stream_in(self, method: str, caller: Caller, request_type: Any,
                   raws: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        with _answering(context):
            if not caller.admin:
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"principal {caller.principal} may not add artifacts (jars, "
                             "Python files): that needs cluster admin")
            with self._slot(caller):
                requests = (self._as_caller(caller, request_type.FromString(raw))
                            .SerializeToString() for raw in raws)
                return self._channel.stream_unary(method)(  # type: ignore[no-any-return]
                    requests, metadata=self._forwarded(context), timeout=_deadline(context))

    @contextlib.contextmanager
    def _slot(self, caller: Caller) -> Iterator[None]:
        """One of the caller's ``MAX_CALLS_PER_PRINCIPAL`` calls open at once (with
        authentication on), so no principal holds every thread of the front."""
        if caller.principal is None:
            yield
            return
        with self._calls_lock:
            held = self._calls.get(caller.principal, 0)
            if held >= MAX_CALLS_PER_PRINCIPAL:
                raise Denied(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"principal {caller.principal} has {held} calls open, the most "
                             "one principal may: wait for one to end")
            self._calls[caller.principal] = held + 1
        try:
            yield
        finally:
            with self._calls_lock:
                self._calls[caller.principal] -= 1
                if not self._calls[caller.principal]:
                    del self._calls[caller.principal]

    # ---- lakelog's side ----------------------------------------------------------------

    def _caller(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Caller:
        if self.store is None:
            return Caller(None, True)
        header = dict(metadata or ()).get("authorization")
        credentials = parse_credentials(header if isinstance(header, str) else None)
        if credentials is None:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED,
                         "an API key is needed: connect with "
                         "sc://localhost:PORT/;token=KEY_ID.SECRET")
        principal = self.store.authenticate(*credentials)
        if principal is None:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED,
                         f"API key {credentials[0]} is unknown or its secret is wrong")
        return Caller(principal, self.store.allowed(principal, "cluster", "lakelog", "admin"))

    def _as_caller(self, caller: Caller, request: Any) -> Any:
        """The request as its principal's: Spark Connect keys sessions by (user, session
        id), so one principal never reaches another's session."""
        if caller.principal is not None:
            request.user_context.user_id = caller.principal
        return request

    def _forwarded(self, context: grpc.ServicerContext) -> list[tuple[str, str | bytes]]:
        """The client's metadata, minus its credentials and gRPC's own headers, plus the
        backend's token."""
        return [*((k, v) for k, v in context.invocation_metadata()
                  if k != "authorization" and not k.startswith("grpc-") and k != "user-agent"),
                self._backend_auth]

    def _admit(self, caller: Caller, name: str, request_type: Any, raw: bytes) -> bytes:
        """The request as the backend gets it, once allowed; its session made ready."""
        request = self._as_caller(caller, request_type.FromString(raw))
        if name == "ReleaseSession":
            self.views.forget(request.user_context.user_id, request.session_id)
        if name not in ("ExecutePlan", "AnalyzePlan", "Config"):
            return request.SerializeToString()  # type: ignore[no-any-return]
        fields: set[str] = set()
        strings: Strings = []
        choices: Choices = []
        walk(request, fields, strings, choices)
        visible = None if caller.admin else self._visible(caller)
        if not caller.admin:
            self._check(caller, request, choices, strings, visible)
        if name != "Config":
            try:
                self.views.prepare(request.user_context.user_id, request.session_id,
                                   named(fields, strings), visible)
            except Exception as exc:  # a closed session, a JVM gone: say it as Spark does
                java = getattr(exc, "java_exception", None)
                message = java.getMessage() if java is not None else str(exc)
                log.warning("session %s not prepared: %s", request.session_id, message)
                raise Denied(grpc.StatusCode.FAILED_PRECONDITION,
                             (message or type(exc).__name__).strip().splitlines()[0]) from None
        return request.SerializeToString()  # type: ignore[no-any-return]

    def _visible(self, caller: Caller) -> set[str]:
        assert self.store is not None and caller.principal is not None
        return {t for t in self.views.topics()
                if self.store.allowed(caller.principal, "topic", t, "consume")}

    def _check(self, caller: Caller, request: Any, choices: Choices, strings: Strings,
               visible: set[str] | None) -> None:
        who = f"principal {caller.principal}"
        try:
            check_request(self.guard, caller.principal, request, choices, strings,
                          self.views.topics(), visible or set())
        except Refused as refused:
            if refused.sentence:  # Spark's own parse error
                raise Denied(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{who} {refused}") from None

def _refusal(denied: Denied) -> grpc.RpcMethodHandler:
    """A handler that answers ``denied`` without reading the call's messages (whatever
    the method's kind: it takes them as a stream it never iterates)."""
    return grpc.stream_unary_rpc_method_handler(
        lambda _requests, context: context.abort(denied.code, str(denied)))


class _answering:
    """Turns a refusal, or the backend's error, into the caller's gRPC status (the
    backend's trailing metadata included: Spark's error details travel there)."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self.context = context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, Denied):
            self.context.abort(exc.code, str(exc))
        if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
            trailing = exc.trailing_metadata()
            if trailing:
                self.context.set_trailing_metadata(trailing)
            self.context.abort(exc.code(), exc.details() or "")


def _deadline(context: grpc.ServicerContext) -> float | None:
    """The client's deadline, if it set one (grpc reports none as a huge or odd value)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and 0 < remaining < 86_400 * 365 else None


def serve_front(front: ConnectFront, address: str, credentials: grpc.ServerCredentials | None
                ) -> grpc.Server:
    """Start the front on ``address`` (HOST:PORT); ``credentials``: TLS or local
    (loopback with a key), None for an insecure port (auth off, loopback)."""
    # A streaming call holds its thread until its last answer: as many threads as calls.
    server = grpc.server(ThreadPoolExecutor(max_workers=MAX_CONCURRENT_RPCS,
                                            thread_name_prefix="connect-front"),
                         handlers=[front], maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
                         options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.so_reuseport", 0)])
    bound = server.add_secure_port(address, credentials) if credentials is not None \
        else server.add_insecure_port(address)
    if not bound:
        raise OSError(f"the SQL endpoint cannot listen on {address} (in use?)")
    server.start()
    return server
