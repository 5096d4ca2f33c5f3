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
- **ACLs**: a plan naming a topic the principal may not consume is refused
  (PERMISSION_DENIED, naming the topic). A principal without cluster ``admin`` may only
  read: no file paths (``spark.read.parquet(...)``, ``runSQLOnFiles`` is off), no writes,
  no UDFs or data sources of its own (they run code in the endpoint), no artifacts, and
  SQL that is a query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, VALUES, TABLE, FROM).

Bytes pass through unparsed except requests, which are small; Arrow results stream
straight back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ingest_api.security import parse_credentials
from lakelog.endpoint.sessions import SessionViews

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from ingest_api.security import SecurityStore

log = logging.getLogger(__name__)
SERVICE = "spark.connect.SparkConnectService"
MAX_CONCURRENT_RPCS = 64
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""What Spark Connect's own client and server allow a message (a large plan, an
Arrow batch of results)."""
QUERY_WORDS = frozenset({"select", "with", "show", "describe", "desc", "explain", "values",
                         "table", "from"})
_UDF = "use user-defined functions (they run code in the endpoint)"
DENIED_FIELDS = {
    "data_source": "read files or data sources directly (query lakelog's views)",
    "write_operation": "write", "write_operation_v2": "write",
    "write_stream_operation_start": "write a stream",
    "register_function": "register functions", "register_table_function": "register functions",
    "register_data_source": "register data sources",
    "common_inline_user_defined_function": _UDF,
    "common_inline_user_defined_table_function": _UDF,
    "common_inline_user_defined_data_source": "use data sources of its own",
    "python_udf": _UDF, "scalar_scala_udf": _UDF, "java_udf": _UDF,
    "create_external_table": "create tables", "create_table": "create tables",
    "merge_into_table_command": "write", "execute_external_command": "run external commands",
    "ml_command": "run ML commands", "pipeline_command": "run pipelines",
    "create_resource_profile_command": "create resource profiles",
}
"""Plan fields a principal without cluster admin may not use, and what they do."""
LISTINGS = frozenset({"list_tables", "list_columns", "table_exists", "get_table"})
"""Catalog calls that need every view registered first."""
_FIRST_WORD = re.compile(r"(?:\s|--[^\n]*\n|/\*.*?\*/|\()*([A-Za-z]+)", re.S)
_WORDS = re.compile(r"[A-Za-z0-9._-]+")
_REFLECTION = re.compile(r"\b(reflect|try_reflect|java_method)\s*\(", re.I)


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


def _walk(message: Message, fields: set[str], strings: list[str]) -> None:
    """Every message field name set anywhere in ``message`` into ``fields``, and every
    string into ``strings``."""
    for fd, value in message.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            fields.add(fd.name)
            if fd.message_type.GetOptions().map_entry:
                items: Iterable[Any] = value.values()
                if fd.message_type.fields_by_name["value"].type != fd.TYPE_MESSAGE:
                    strings.extend(str(v) for v in items)
                    continue
            elif fd.is_repeated:
                items = value
            else:
                items = (value,)
            for item in items:
                _walk(item, fields, strings)
        elif fd.type == fd.TYPE_STRING:
            strings.extend(value if fd.is_repeated else (value,))


def _first_word(sql: str) -> str:
    """The statement's first keyword, lower case (comments and parentheses skipped)."""
    found = _FIRST_WORD.match(sql)
    return found.group(1).lower() if found else ""


def _sql_texts(message: Message) -> Iterator[str]:
    """The SQL statements of a plan (``spark.sql``'s relation and command)."""
    for fd, value in message.ListFields():
        if fd.type != fd.TYPE_MESSAGE:
            if fd.name in ("query", "sql") and fd.type == fd.TYPE_STRING and \
                    fd.containing_type.name in ("SQL", "SqlCommand"):
                yield value
            continue
        if fd.message_type.GetOptions().map_entry:
            continue
        for item in (value if fd.is_repeated else (value,)):
            yield from _sql_texts(item)


class ConnectFront(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Forwards Spark Connect calls to ``backend`` once they pass lakelog's checks."""

    def __init__(self, backend: str, views: SessionViews, store: SecurityStore | None) -> None:
        self.views = views
        self.store = store
        self._channel = grpc.insecure_channel(backend, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._methods = _methods()

    # ---- grpc's side -----------------------------------------------------------------

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, name = details.method.lstrip("/").rpartition("/")
        found = self._methods.get(name) if service == SERVICE else None
        if found is None:
            return None  # UNIMPLEMENTED
        client_streaming, server_streaming, request_type = found
        method = details.method
        if client_streaming:
            return grpc.stream_unary_rpc_method_handler(
                lambda requests, context: self._stream_in(method, request_type, requests,
                                                          context))
        if server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: self._stream_out(method, name, request_type, request,
                                                          context))
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._unary(method, name, request_type, request, context))

    def _unary(self, method: str, name: str, request_type: Any, raw: bytes,
               context: grpc.ServicerContext) -> bytes:
        with _answering(context):
            request = self._admit(name, request_type, raw, context)
            call = self._channel.unary_unary(method)
            answer: bytes = call(request, metadata=_forwarded(context),
                                 timeout=_deadline(context))
            return answer

    def _stream_out(self, method: str, name: str, request_type: Any, raw: bytes,
                    context: grpc.ServicerContext) -> Iterator[bytes]:
        with _answering(context):
            request = self._admit(name, request_type, raw, context)
            call = self._channel.unary_stream(method)(
                request, metadata=_forwarded(context), timeout=_deadline(context))
            context.add_callback(call.cancel)
            yield from call

    def _stream_in(self, method: str, request_type: Any, raws: Iterator[bytes],
                   context: grpc.ServicerContext) -> bytes:
        with _answering(context):
            caller = self._caller(context)
            if not caller.admin:
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"principal {caller.principal} may not add artifacts (jars, "
                             "Python files): that needs cluster admin")
            requests = (self._as_caller(caller, request_type.FromString(raw)).SerializeToString()
                        for raw in raws)
            return self._channel.stream_unary(method)(  # type: ignore[no-any-return]
                requests, metadata=_forwarded(context), timeout=_deadline(context))

    # ---- lakelog's side ----------------------------------------------------------------

    def _caller(self, context: grpc.ServicerContext) -> Caller:
        if self.store is None:
            return Caller(None, True)
        header = dict(context.invocation_metadata()).get("authorization")
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
        if caller.principal is not None and request.HasField("user_context"):
            request.user_context.user_id = caller.principal
        return request

    def _admit(self, name: str, request_type: Any, raw: bytes,
               context: grpc.ServicerContext) -> bytes:
        """The request as the backend gets it, once allowed; its session made ready."""
        caller = self._caller(context)
        request = self._as_caller(caller, request_type.FromString(raw))
        if name == "ReleaseSession":
            self.views.forget(request.user_context.user_id, request.session_id)
        if name not in ("ExecutePlan", "AnalyzePlan", "Config"):
            return request.SerializeToString()  # type: ignore[no-any-return]
        fields: set[str] = set()
        strings: list[str] = []
        _walk(request, fields, strings)
        visible = None if caller.admin else self._visible(caller)
        if not caller.admin:
            self._check(caller, request, fields, strings, visible)
        if name != "Config":
            named = {w for s in strings for w in _WORDS.findall(s)}
            named |= {w.strip("`") for s in strings for w in s.split()}
            if fields & LISTINGS or any(_first_word(t) == "show" for t in _sql_texts(request)):
                named.add("*")
            try:
                self.views.prepare(request.user_context.user_id, request.session_id, named,
                                   visible)
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

    def _check(self, caller: Caller, request: Any, fields: set[str], strings: list[str],
               visible: set[str] | None) -> None:
        who = f"principal {caller.principal}"
        for field, what in DENIED_FIELDS.items():
            if field in fields:
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"{who} may not {what}: that needs cluster admin")
        if request.DESCRIPTOR.name == "ConfigRequest" and \
                request.operation.WhichOneof("op_type") not in ("get", "get_with_default",
                                                                "get_option", "get_all",
                                                                "is_modifiable"):
            raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                         f"{who} may not change the session's settings: that needs cluster "
                         "admin")
        for text in _sql_texts(request):
            if _first_word(text) not in QUERY_WORDS:
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"{who} may only query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, "
                             f"VALUES, TABLE); '{text.strip()[:60]}' needs cluster admin")
            if _REFLECTION.search(text):
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"{who} may not call Java methods (reflect, java_method)")
        if visible is not None:
            words = {w.strip("`") for s in strings for w in (*_WORDS.findall(s), *s.split())}
            for topic in sorted(words & set(self.views.topics()) - visible):
                raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                             f"{who} may not consume topic {topic} (ACL): ask an admin for "
                             f"`lakelog acls add --principal {caller.principal} --topic "
                             f"{topic} --operation consume`")


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


def _forwarded(context: grpc.ServicerContext) -> list[tuple[str, str | bytes]]:
    """The client's metadata, minus its credentials and gRPC's own headers."""
    return [(k, v) for k, v in context.invocation_metadata()
            if k != "authorization" and not k.startswith("grpc-") and k != "user-agent"]


def serve_front(front: ConnectFront, address: str, credentials: grpc.ServerCredentials | None
                ) -> grpc.Server:
    """Start the front on ``address`` (HOST:PORT); ``credentials``: TLS or local
    (loopback with a key), None for an insecure port (auth off, loopback)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=16, thread_name_prefix="connect-front"),
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
