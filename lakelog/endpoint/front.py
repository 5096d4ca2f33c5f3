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
  shared cache or make global views are refused, each with a PERMISSION_DENIED that says
  what needs cluster admin. ``runSQLOnFiles`` is off in every session besides.
- **The backend** takes calls from this front alone: it wants a random bearer token that
  only this process knows (``spark.connect.authenticate.token``).

Bytes pass through unparsed except requests, which are small; Arrow results stream
straight back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ingest_api.security import parse_credentials
from lakelog.endpoint.guard import ALLOWED_TABLE_FUNCTIONS, REFLECTION, PlanGuard, Refused
from lakelog.endpoint.sessions import SessionViews
from log_tables.config import SQL_VIEW_NAMES

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from ingest_api.security import SecurityStore

log = logging.getLogger(__name__)
SERVICE = "spark.connect.SparkConnectService"
MAX_CONCURRENT_RPCS = 32
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""What Spark Connect's own client and server allow a message (a large plan, an
Arrow batch of results)."""
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
    "extension": "use plan extensions",
    "create_external_table": "create tables", "create_table": "create tables",
    "merge_into_table_command": "write", "execute_external_command": "run external commands",
    "ml_command": "run ML commands", "pipeline_command": "run pipelines",
    "create_resource_profile_command": "create resource profiles",
}
"""Plan fields a principal without cluster admin may not use, and what they do."""
CATALOG_READS = frozenset({
    "current_database", "set_current_database", "list_databases", "list_tables",
    "list_functions", "list_columns", "get_database", "get_table", "get_function",
    "database_exists", "table_exists", "function_exists", "is_cached", "current_catalog",
    "set_current_catalog", "list_catalogs", "list_views", "list_partitions",
    "get_table_properties", "drop_temp_view"})
"""Catalog calls a principal without cluster admin may make: look-ups, and dropping a
temporary view of its own session (not one of lakelog's)."""
LISTINGS = frozenset({"list_tables", "list_columns", "table_exists", "get_table"})
"""Catalog calls that need every view registered first."""
SQL_FIELDS = frozenset({("SQL", "query"), ("SqlCommand", "sql")})
EXPRESSION_FIELDS = frozenset({("ExpressionString", "expression")})
TABLE_NAME_FIELDS = frozenset({("NamedTable", "unparsed_identifier")})
VIEW_NAME_FIELDS = frozenset({("CreateDataFrameViewCommand", "name"),
                              ("DropTempView", "view_name")})
_FIRST_WORD = re.compile(r"(?:\s|--[^\n]*\n|/\*.*?\*/|\()*([A-Za-z]+)", re.S)
_WORDS = re.compile(r"[A-Za-z0-9._-]+")
Strings = list[tuple[str, str, str]]
"""(message type, field, value) of every string set in a request."""


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str | None
    """None: authentication is off (loopback only)."""
    admin: bool


def _catalog_calls() -> frozenset[str]:
    """Every call of Spark Connect's catalog (the ``Catalog`` relation's fields)."""
    from pyspark.sql.connect.proto import catalog_pb2

    return frozenset(f.name for f in catalog_pb2.Catalog.DESCRIPTOR.fields)


def _methods() -> dict[str, tuple[bool, bool, Any]]:
    """Spark Connect's methods: (client streaming, server streaming, request class)."""
    from pyspark.sql.connect.proto import base_pb2

    service = base_pb2.DESCRIPTOR.services_by_name["SparkConnectService"]
    return {m.name: (m.client_streaming, m.server_streaming,
                     getattr(base_pb2, m.input_type.name)) for m in service.methods}


def _walk(message: Message, fields: set[str], strings: Strings) -> None:
    """Every message field name set anywhere in ``message`` into ``fields``, and every
    string, with the message type and field it is in, into ``strings``."""
    for fd, value in message.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            fields.add(fd.name)
            if fd.message_type.GetOptions().map_entry:
                items: Iterable[Any] = value.values()
                if fd.message_type.fields_by_name["value"].type != fd.TYPE_MESSAGE:
                    strings.extend((fd.message_type.name, fd.name, str(v)) for v in items)
                    continue
            elif fd.is_repeated:
                items = value
            else:
                items = (value,)
            for item in items:
                _walk(item, fields, strings)
        elif fd.type == fd.TYPE_STRING:
            owner = fd.containing_type.name
            strings.extend((owner, fd.name, v) for v in (value if fd.is_repeated else (value,)))


def _first_word(sql: str) -> str:
    """The statement's first keyword, lower case (comments and parentheses skipped)."""
    found = _FIRST_WORD.match(sql)
    return found.group(1).lower() if found else ""


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
        self._catalog_changes = _catalog_calls() - CATALOG_READS

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
            answer: bytes = call(request, metadata=self._forwarded(context),
                                 timeout=_deadline(context))
            return answer

    def _stream_out(self, method: str, name: str, request_type: Any, raw: bytes,
                    context: grpc.ServicerContext) -> Iterator[bytes]:
        with _answering(context):
            request = self._admit(name, request_type, raw, context)
            call = self._channel.unary_stream(method)(
                request, metadata=self._forwarded(context), timeout=_deadline(context))
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
                requests, metadata=self._forwarded(context), timeout=_deadline(context))

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
        strings: Strings = []
        _walk(request, fields, strings)
        visible = None if caller.admin else self._visible(caller)
        if not caller.admin:
            self._check(caller, request, fields, strings, visible)
        if name != "Config":
            texts = [v for _, _, v in strings]
            named = {w for s in texts for w in _WORDS.findall(s)}
            named |= {w.strip("`") for s in texts for w in s.split()}
            if fields & LISTINGS or any(_first_word(v) == "show" for t, f, v in strings
                                        if (t, f) in SQL_FIELDS):
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

    def _check(self, caller: Caller, request: Any, fields: set[str], strings: Strings,
               visible: set[str] | None) -> None:
        who = f"principal {caller.principal}"
        try:
            self._check_request(caller, request, fields, strings, visible or set())
        except Refused as refused:
            if refused.sentence:  # Spark's own parse error
                raise Denied(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{who} {refused}") from None

    def _check_request(self, caller: Caller, request: Any, fields: set[str],
                       strings: Strings, visible: set[str]) -> None:
        for field, what in DENIED_FIELDS.items():
            if field in fields:
                raise Refused(f"may not {what}: that needs cluster admin")
        for call in sorted(fields & self._catalog_changes):
            raise Refused(f"may not call catalog.{call} (only look-ups): that needs cluster "
                          "admin")
        if request.DESCRIPTOR.name == "ConfigRequest" and \
                request.operation.WhichOneof("op_type") not in ("get", "get_with_default",
                                                                "get_option", "get_all",
                                                                "is_modifiable"):
            raise Refused("may not change the session's settings: that needs cluster admin")
        topics = self.views.topics()
        readable = {t.lower() for t in visible}
        denied = {t.lower(): t for t in topics if t.lower() not in readable}
        reserved = {n.lower() for n in (*topics, *SQL_VIEW_NAMES)}

        def refusal(parts: Sequence[str]) -> str | None:
            if len(parts) != 1:
                return (f"may read views by their names alone, not {'.'.join(parts)} (files, "
                        "catalogs' tables and global views need cluster admin)")
            topic = denied.get(parts[0].lower())
            if topic is None:
                return None
            return (f"may not consume topic {topic} (ACL): ask an admin for `lakelog acls "
                    f"add --principal {caller.principal} --topic {topic} --operation "
                    "consume`")

        if request.DESCRIPTOR.fields_by_name.get("plan") is not None and \
                request.HasField("plan") and request.plan.HasField("command") and \
                request.plan.command.HasField("create_dataframe_view") and \
                request.plan.command.create_dataframe_view.is_global:
            raise Refused("may not create global views (every session sees them): that "
                          "needs cluster admin")
        for owner, field, value in strings:
            where = (owner, field)
            if where in SQL_FIELDS:
                self.guard.check_sql(value, refusal)
            elif where in EXPRESSION_FIELDS:
                self.guard.check_expression(value, refusal)
            elif where in TABLE_NAME_FIELDS:
                self.guard.check_table_name(value, refusal)
            elif where in VIEW_NAME_FIELDS and value.strip("`").lower() in reserved:
                raise Refused(f"may not replace or drop lakelog's view {value}")
            elif field == "function_name" and value.strip("`").lower() in REFLECTION:
                raise Refused("may not call Java methods (reflect, java_method)")
            elif where == ("UnresolvedTableValuedFunction", "function_name") and \
                    value.strip("`").lower() not in ALLOWED_TABLE_FUNCTIONS:
                raise Refused(f"may not call the table function {value} (only "
                              f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}): that needs "
                              "cluster admin")


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
