"""What a Spark Connect request is made of, and which of its parts a principal without
cluster admin may send: the protobuf side of the front's check (``front.ConnectFront``),
beside ``guard.PlanGuard``'s walk of Spark's parse of the SQL, expressions and names in
it.

A request is walked once (``walk``) into the message fields set, every string with the
message type and field it is in, and every ``oneof`` choice made. The choices are held
to an allowlist (``ALLOWED``: a kind Spark adds later is refused until it is listed),
with a reason where a word helps (``REASONS``); the strings go to the guard by the field
they are in (SQL, expression strings, table names, view names, function names). The
words of the strings tell the front which views a request names (``named``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from lakelog.endpoint.guard import ALLOWED_TABLE_FUNCTIONS, REFLECTION, PlanGuard, Refused
from log_tables.config import SQL_VIEW_NAMES

if TYPE_CHECKING:
    from google.protobuf.message import Message

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


def walk(message: Message, fields: set[str], strings: Strings, choices: Choices) -> None:
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
                walk(item, fields, strings, choices)
        elif fd.type == fd.TYPE_STRING:
            owner = fd.containing_type.name
            strings.extend((owner, fd.name, v) for v in (value if fd.is_repeated else (value,)))


def first_word(sql: str) -> str:
    """The statement's first keyword, lower case (comments and parentheses skipped)."""
    found = _FIRST_WORD.match(sql)
    return found.group(1).lower() if found else ""

def named(fields: set[str], strings: Strings) -> set[str]:
    """The words of a walked request's strings, which may name views, with ``*`` when it
    lists them (``SHOW``, a catalog listing: every view is wanted)."""
    texts = [v for _, _, v in strings]
    words = {w for s in texts for w in _WORDS.findall(s)}
    words |= {w.strip("`") for s in texts for w in s.split()}
    if fields & LISTINGS or any(first_word(v) == "show" for t, f, v in strings
                                if (t, f) in SQL_FIELDS):
        words.add("*")
    return words


def check_request(guard: PlanGuard, principal: str | None, request: Any, choices: Choices,
                  strings: Strings, topics: Sequence[str], visible: set[str]) -> None:
    """Refused unless ``principal`` (without cluster admin) may send ``request``: each
    choice in its plan allowed (``ALLOWED``), Config calls only reading, and its SQL,
    expression strings and names as ``guard`` reads them on Spark's parse, where
    ``visible`` are those of the endpoint's ``topics`` it may consume."""
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
                f"add --principal {principal} --topic {topic} --operation "
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
            guard.check_sql(value, refusal)
        elif where in EXPRESSION_FIELDS:
            guard.check_expression(value, refusal)
        elif where in TABLE_NAME_FIELDS:
            guard.check_table_name(value, refusal)
        elif where in VIEW_NAME_FIELDS:
            parts = guard.name_parts(value)
            if len(parts) != 1 or parts[0].lower() in reserved:
                raise Refused(f"may not replace or drop lakelog's view {value}")
        elif field == "function_name":
            function = guard.name_parts(value)[-1].lower()
            if function in REFLECTION:
                raise Refused("may not call Java methods (reflect, java_method)")
            if owner == "UnresolvedTableValuedFunction" and \
                    function not in ALLOWED_TABLE_FUNCTIONS:
                raise Refused(f"may not call the table function {value} (only "
                              f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}): that needs "
                              "cluster admin")
