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

import contextlib
import logging
import re
import threading
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
MAX_CONCURRENT_RPCS = 64
MAX_CALLS_PER_PRINCIPAL = 16
"""Calls one principal may have open at once (a streaming call until its last answer)."""
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""What Spark Connect's own client and server allow a message (a large plan, an
Arrow batch of results)."""
_UDF = "use user-defined functions (they run code in the endpoint)"
REASONS = {
    "data_source": "read files or data sources directly (query lakelog's views)",
    "write_operation": "write", "write_operation_v2": "write",
    "write_stream_operation_start": "write a stream",
    "register_function": "register functions", "register_table_function": "register functions",
    "register_data_source": "register data sources",
    "common_inline_user_defined_function": _UDF,
    "common_inline_user_defined_table_function": _UDF,
    "common_inline_user_defined_data_source": "use data sources of its own",
    "map_partitions": _UDF, "group_map": _UDF, "co_group_map": _UDF,
    "apply_in_pandas_with_state": _UDF, "typed_aggregate_expression": _UDF,
    "extension": "use plan extensions", "ml_relation": "use ML (it runs SQL of its own)",
    "ml_command": "use ML (it runs SQL of its own)",
    "merge_into_table_command": "write", "execute_external_command": "run external commands",
    "pipeline_command": "run pipelines", "checkpoint_command": "checkpoint",
    "create_resource_profile_command": "create resource profiles",
    "streaming_query_command": "run streaming queries",
    "streaming_query_manager_command": "manage streaming queries",
    "streaming_query_listener_bus_command": "listen to streaming queries",
    "persist": "cache (the endpoint's memory is every session's)",
    "unpersist": "uncache (the endpoint's memory is every session's)",
    "compressed_operation": "send a compressed plan (lakelog checks plans as sent: turn "
                            "compression off, spark.connect.session.planCompression.threshold "
                            "-1)",
}
"""Why a part of a plan that is not allowed (``ALLOWED``) is refused, where a word helps."""
CATALOG_READS = frozenset({
    "current_database", "set_current_database", "list_databases", "list_tables",
    "list_functions", "list_columns", "get_database", "get_table", "get_function",
    "database_exists", "table_exists", "function_exists", "is_cached", "current_catalog",
    "set_current_catalog", "list_catalogs", "list_views", "list_partitions",
    "get_table_properties", "drop_temp_view"})
"""Catalog calls a principal without cluster admin may make: look-ups, and dropping a
temporary view of its own session (not one of lakelog's)."""
ALLOWED = {
    ("Plan", "op_type"): frozenset({"root", "command"}),
    ("Command", "command_type"): frozenset({"sql_command", "create_dataframe_view",
                                            "get_resources_command"}),
    ("Relation", "rel_type"): frozenset({
        "read", "project", "filter", "join", "set_op", "sort", "limit", "aggregate", "sql",
        "local_relation", "sample", "offset", "deduplicate", "range", "subquery_alias",
        "repartition", "to_df", "with_columns_renamed", "show_string", "drop", "tail",
        "with_columns", "hint", "unpivot", "to_schema", "repartition_by_expression",
        "collect_metrics", "parse", "with_watermark", "html_string", "as_of_join",
        "with_relations", "transpose", "unresolved_table_valued_function", "lateral_join",
        "nearest_by_join", "fill_na", "drop_na", "replace", "summary", "crosstab",
        "describe", "cov", "corr", "approx_quantile", "freq_items", "sample_by",
        "catalog"}),
    ("Read", "read_type"): frozenset({"named_table"}),
    ("Expression", "expr_type"): frozenset({
        "literal", "unresolved_attribute", "unresolved_function", "expression_string",
        "unresolved_star", "alias", "cast", "unresolved_regex", "sort_order",
        "lambda_function", "window", "unresolved_extract_value", "update_fields",
        "unresolved_named_lambda_variable", "call_function", "named_argument_expression",
        "subquery_expression", "direct_shuffle_partition_id"}),
    ("AnalyzePlanRequest", "analyze"): frozenset({
        "schema", "explain", "tree_string", "is_local", "is_streaming", "input_files",
        "spark_version", "ddl_parse", "same_semantics", "semantic_hash",
        "get_storage_level", "json_to_ddl"}),
    ("Catalog", "cat_type"): CATALOG_READS,
}
"""What a principal without cluster admin's plan may be made of: for each choice
(protobuf ``oneof``) of Spark Connect's plan messages, the kinds allowed. An allowlist,
so a kind Spark adds later is refused until it is listed here."""
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
Choices = list[tuple[str, str, str]]
"""(message type, oneof, the field chosen) of every choice made in a request."""
_GLOBAL_TEMP = re.compile(r"(?:^|[\s.`])global_temp(?:$|[\s.`])", re.I)


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


def _walk(message: Message, fields: set[str], strings: Strings, choices: Choices) -> None:
    """Every message field name set anywhere in ``message`` into ``fields``, every string,
    with the message type and field it is in, into ``strings``, and every choice made
    (message type, ``oneof``, field set) into ``choices``."""
    descriptor = message.DESCRIPTOR
    for oneof in descriptor.oneofs:
        chosen = message.WhichOneof(oneof.name)
        if chosen is not None:
            choices.append((descriptor.name, oneof.name, chosen))
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
                _walk(item, fields, strings, choices)
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
        _walk(request, fields, strings, choices)
        visible = None if caller.admin else self._visible(caller)
        if not caller.admin:
            self._check(caller, request, choices, strings, visible)
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

    def _check(self, caller: Caller, request: Any, choices: Choices, strings: Strings,
               visible: set[str] | None) -> None:
        who = f"principal {caller.principal}"
        try:
            self._check_request(caller, request, choices, strings, visible or set())
        except Refused as refused:
            if refused.sentence:  # Spark's own parse error
                raise Denied(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{who} {refused}") from None

    def _check_request(self, caller: Caller, request: Any, choices: Choices,
                       strings: Strings, visible: set[str]) -> None:
        for message, oneof, chosen in choices:
            allowed = ALLOWED.get((message, oneof))
            if allowed is not None and chosen not in allowed:
                what = REASONS.get(chosen) or (
                    f"call catalog.{chosen} (only look-ups)" if message == "Catalog"
                    else f"use {chosen} ({message})")
                raise Refused(f"may not {what}: that needs cluster admin")
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
            if _GLOBAL_TEMP.search(value):
                raise Refused("may not use global_temp (every session's views): that needs "
                              "cluster admin")
            if where in SQL_FIELDS:
                self.guard.check_sql(value, refusal)
            elif where in EXPRESSION_FIELDS:
                self.guard.check_expression(value, refusal)
            elif where in TABLE_NAME_FIELDS:
                self.guard.check_table_name(value, refusal)
            elif where in VIEW_NAME_FIELDS:
                parts = self.guard.name_parts(value)
                if len(parts) != 1 or parts[0].lower() in reserved:
                    raise Refused(f"may not replace or drop lakelog's view {value}")
            elif field == "function_name":
                function = self.guard.name_parts(value)[-1].lower()
                if function in REFLECTION:
                    raise Refused("may not call Java methods (reflect, java_method)")
                if owner == "UnresolvedTableValuedFunction" and \
                        function not in ALLOWED_TABLE_FUNCTIONS:
                    raise Refused(f"may not call the table function {value} (only "
                                  f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}): that needs "
                                  "cluster admin")


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
