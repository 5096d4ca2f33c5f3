"""What a principal without cluster admin may ask of the SQL endpoint, decided on Spark's
own parse of its SQL, never on the text.

The front hands every SQL statement, expression string (``selectExpr``, ``F.expr``,
``filter("...")``) and table name of such a principal's request to ``PlanGuard``, which
parses it with the endpoint's own parser (in the same JVM, so comments, nesting, quoting
and ``FROM x INSERT ...`` read exactly as Spark will read them) and walks the unresolved
plan: every field of every plan node (a ``WINDOW`` clause's map, a CTE's pairs,
``EXPLAIN``'s query), every expression's children and every subquery's plan:

- every plan node must be a query operator or a read-only command (``ALLOWED_PLANS``):
  anything else (writes, DDL, ``SET``, ``CACHE``, SQL scripts, ``TRANSFORM ... USING``,
  which runs a program) is refused. An operator Spark adds later is refused until listed
  here: the check fails closed;
- a table named in it is a single name (a view; not ``parquet.`path```, not
  ``global_temp.x``, not a catalog's table) and not a topic the principal may not
  consume;
- a table function is one that reads no files (``ALLOWED_TABLE_FUNCTIONS``);
- no reflection (``reflect``, ``java_method``, ...) and no ``IDENTIFIER(...)`` (a name
  computed at analysis could be any of the above).

A statement Spark cannot parse is refused with Spark's own parse error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

CATALYST = "org.apache.spark.sql.catalyst"
ALLOWED_PLANS = frozenset({
    *(f"{CATALYST}.plans.logical.{n}" for n in (
        "Project", "Filter", "Aggregate", "Join", "LateralJoin", "AsOfJoin", "Sort",
        "GlobalLimit", "LocalLimit", "Offset", "Tail", "Union", "Intersect", "Except",
        "Distinct", "Deduplicate", "SubqueryAlias", "Window", "WithWindowDefinition",
        "Generate", "Expand", "Pivot", "Unpivot", "Sample", "Range", "OneRowRelation",
        "LocalRelation", "EmptyRelation", "UnresolvedWith", "WithCTE", "CTERelationDef",
        "CTERelationRef", "UnresolvedHint", "ResolvedHint", "Repartition",
        "RepartitionByExpression", "RebalancePartitions", "Transpose",
        # read-only commands
        "ShowTables", "ShowTablesExtended", "ShowViews", "ShowColumns", "ShowFunctions",
        "DescribeRelation", "DescribeColumn", "DescribeFunction")),
    *(f"{CATALYST}.analysis.{n}" for n in (
        "UnresolvedRelation", "UnresolvedTableOrView", "UnresolvedInlineTable",
        "UnresolvedTableValuedFunction", "UnresolvedTVFAliases",
        "UnresolvedSubqueryColumnAliases", "UnresolvedHaving", "UnresolvedFunctionName",
        "CurrentNamespace$")),
    f"{CATALYST}.expressions.PipeOperator",
    "org.apache.spark.sql.execution.command.ExplainCommand",
})
"""Plan nodes (as parsed, before analysis) a query may be made of."""
NAMED_RELATIONS = frozenset({f"{CATALYST}.analysis.UnresolvedRelation",
                             f"{CATALYST}.analysis.UnresolvedTableOrView"})
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "range", "explode", "explode_outer", "inline", "inline_outer", "posexplode",
    "posexplode_outer", "stack", "json_tuple", "variant_explode", "variant_explode_outer",
    "sql_keywords"})
"""Table-valued functions that compute rows (``read_files`` and the like read files)."""
REFLECTION = frozenset({"reflect", "try_reflect", "java_method"})
"""Functions that call any Java method in the endpoint's JVM."""
UNRESOLVED_FUNCTION = f"{CATALYST}.analysis.UnresolvedFunction"
UNRESOLVED_TVF = f"{CATALYST}.analysis.UnresolvedTableValuedFunction"
IDENTIFIERS = frozenset({f"{CATALYST}.analysis.PlanWithUnresolvedIdentifier",
                         f"{CATALYST}.analysis.ExpressionWithUnresolvedIdentifier"})
EXPRESSIONS = frozenset({"subquery", "leaf expression", "expression"})
MAX_NODES = 20_000
"""Plan and expression nodes checked in one request; a larger one is refused."""

Refusal = Callable[[Sequence[str]], str | None]
"""A table name's parts -> why it may not be read (None: it may)."""


class Refused(Exception):
    """What the principal may not do, to follow "principal P may not ..." or a whole
    sentence (``sentence``)."""

    def __init__(self, message: str, sentence: bool = False) -> None:
        super().__init__(message)
        self.sentence = sentence


def _names(seq: Any) -> list[str]:
    return [str(seq.apply(i)) for i in range(seq.length())]


def _items(seq: Any) -> Iterator[Any]:
    for i in range(seq.length()):
        yield seq.apply(i)


class PlanGuard:
    """Checks SQL, expressions and table names with the endpoint's parser (``jsession``:
    a JVM SparkSession whose parser all sessions share the settings of)."""

    def __init__(self, jvm: Any, jsession: Any) -> None:
        self.parser = jsession.sessionState().sqlParser()
        self._class_utils = jvm.org.apache.commons.lang3.ClassUtils
        self._kinds_of = [(kind, jvm.java.lang.Class.forName(name)) for kind, name in (
            ("plan", f"{CATALYST}.plans.logical.LogicalPlan"),
            ("subquery", f"{CATALYST}.expressions.PlanExpression"),
            ("leaf expression", f"{CATALYST}.expressions.LeafExpression"),
            ("expression", f"{CATALYST}.expressions.Expression"),
            ("collection", "scala.collection.Iterable"),
            ("product", "scala.Product"))]
        self._kinds: dict[str, str] = {}
        self._arities: dict[str, int] = {}

    def kind(self, value: Any, name: str) -> str:
        """What a JVM value of class ``name`` is to the walk: plan, subquery (an
        expression holding a plan), leaf expression, expression, collection, product (a
        case class or tuple) or other (cached by class)."""
        found = self._kinds.get(name)
        if found is None:
            found = next((k for k, c in self._kinds_of if c.isInstance(value)), "other")
            if name.startswith(("org.apache.spark.sql.types.", "org.apache.spark.unsafe.")):
                found = "other"  # data types and values: nothing to check inside
            self._kinds[name] = found
        return found

    def class_name(self, value: Any) -> str:
        return str(self._class_utils.getName(value, ""))

    def arity(self, value: Any, name: str) -> int:
        """Fields of a product (a case class's count is its class's: cached)."""
        found = self._arities.get(name)
        if found is None:
            found = self._arities[name] = int(value.productArity())
        return found

    def name_parts(self, text: str) -> list[str]:
        """A (function or table) name as Spark reads it; the text itself if it cannot."""
        try:
            return _names(self.parser.parseMultipartIdentifier(text)) or [text]
        except Exception:  # not a name Spark parses: as sent
            return [text.strip().strip("`")]

    def check_sql(self, text: str, refusal: Refusal) -> None:
        self._Walk(self, refusal).plan(self._parse(self.parser.parsePlan, text), text)

    def check_expression(self, text: str, refusal: Refusal) -> None:
        self._Walk(self, refusal).expression(self._parse(self.parser.parseExpression, text))

    def check_table_name(self, text: str, refusal: Refusal) -> None:
        self._Walk(self, refusal).name(_names(self._parse(self.parser.parseMultipartIdentifier,
                                                          text)))

    @staticmethod
    def _parse(parse: Callable[[str], Any], text: str) -> Any:
        try:
            return parse(text)
        except Exception as exc:  # py4j's Java error: Spark's own parse error, said so
            java = getattr(exc, "java_exception", None)
            message = java.getMessage() if java is not None else str(exc)
            raise Refused((message or "cannot be parsed").strip().splitlines()[0],
                          sentence=True) from None

    class _Walk:
        def __init__(self, guard: PlanGuard, refusal: Refusal) -> None:
            self.guard = guard
            self.refusal = refusal
            self.nodes = 0

        def _count(self) -> None:
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise Refused(f"ask for a plan of over {MAX_NODES} nodes (a larger one "
                              "cannot be checked): that needs cluster admin")

        def plan(self, node: Any, text: str = "") -> None:
            self._count()
            kind = self.guard.class_name(node)
            if kind not in ALLOWED_PLANS:
                if kind in IDENTIFIERS:
                    self._identifier()
                shown = f"'{' '.join(text.split())[:60]}' ({kind.rsplit('.', 1)[-1]})" \
                    if text else kind.rsplit(".", 1)[-1]
                raise Refused(f"may only query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, "
                              f"VALUES, TABLE): {shown} needs cluster admin")
            if kind in NAMED_RELATIONS:
                self.name(_names(node.multipartIdentifier()))
            elif kind == UNRESOLVED_TVF:
                function = _names(node.name())[-1].lower()
                if function not in ALLOWED_TABLE_FUNCTIONS:
                    raise Refused(f"may not call the table function {function} (only "
                                  f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}): that "
                                  "needs cluster admin")
            # Every field of the node, not only its children and expressions: a WINDOW
            # clause's definitions sit in a map, a CTE's in a list of pairs, EXPLAIN's
            # query in a field of its own.
            for i in range(self.guard.arity(node, kind)):
                self._value(node.productElement(i))

        def _value(self, value: Any) -> None:
            """A field's value: plans and expressions are walked, collections, options and
            tuples looked into, anything else (names, flags, types) passed over."""
            if type(value).__name__ != "JavaObject":
                return  # None, str, int, bool: py4j hands them over as Python values
            self._count()
            name = self.guard.class_name(value)
            kind = self.guard.kind(value, name)
            if kind == "plan":
                self.plan(value)
            elif kind in EXPRESSIONS:
                self.expression(value, kind)
            elif kind == "collection":
                if not value.isEmpty():
                    items = value.iterator()
                    while items.hasNext():
                        self._value(items.next())
            elif kind == "product":
                for i in range(self.guard.arity(value, name)):
                    self._value(value.productElement(i))

        def expression(self, node: Any, kind: str | None = None) -> None:
            """An expression: its children (Catalyst keeps every sub-expression there) and
            a subquery's plan."""
            self._count()
            name = self.guard.class_name(node)
            kind = kind or self.guard.kind(node, name)
            if name in IDENTIFIERS:
                self._identifier()
            if name == UNRESOLVED_FUNCTION and \
                    _names(node.nameParts())[-1].lower() in REFLECTION:
                raise Refused("may not call Java methods (reflect, java_method)")
            if kind == "subquery":
                self.plan(node.plan())
            if kind != "leaf expression":
                for child in _items(node.children()):
                    self.expression(child)

        def name(self, parts: list[str]) -> None:
            why = self.refusal(parts)
            if why is not None:
                raise Refused(why)

        @staticmethod
        def _identifier() -> None:
            raise Refused("may not use IDENTIFIER(...) (a name made while the query is "
                          "analysed escapes lakelog's check): that needs cluster admin")
