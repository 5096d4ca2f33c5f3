"""One error table: every error lakelog raises is a class of ``log_tables.errors`` (name,
``retriable``, Kafka's name and number), the HTTP front maps each to a status and a
Confluent code, and no code anywhere makes an error (or an error body) under a name the
table does not have. The code is read, not run: every module of every package is parsed."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ingest_api.http.errors import DETAILS, HTTP
from lakelog.client import errors as client
from log_tables import errors as e
from log_tables.error_root import KAFKA_CODES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
TABLE_MODULES = frozenset({"log_tables/errors.py", "log_tables/error_root.py",
                           "log_tables/cluster_errors.py", "log_tables/request_errors.py",
                           "log_tables/txn_errors.py", "log_tables/schema_errors.py"})
OTHER_ROOTS = {
    # The front's error of HTTP parsing and of another broker's answer relayed as it was:
    # its status is the instance's own, its name one of the table's (checked below).
    "ingest_api/http/errors.py": {"ApiError"},
    # The client's: a server's answer as it came (typed by the table's classes), a
    # deadline, a broken connection (no answer: the client's own names, below).
    "lakelog/client/errors.py": {"LakelogClientError", "LakelogTimeoutError",
                                 "LakelogConnectionError", "CorruptRecordError"},
}
CLIENT_NAMES = frozenset({"timeout", "connection_error", "error", "no_answer"})
"""Names the client gives what has no answer body (a deadline, a broken connection, an
answer without a result for a record): in ``lakelog/client/`` only."""
API_ERROR_MODULES = frozenset({"ingest_api/http/errors.py", "ingest_api/http/body.py"})
"""Where an ``ApiError`` is made: the front's parsing of HTTP (everything else raises the
table's classes)."""
RELAY = ("ingest_api/http/errors.py", "relayed")
"""The one place an ``ApiError`` takes a name that is not written in the code: another
broker's answer, passed on."""
ERROR_BASES = frozenset({"LakelogError", "ApiError", *(c.__name__ for c in e.ERRORS),
                         *(n for names in OTHER_ROOTS.values() for n in names)})


def _pairs(cls: type[e.LakelogError]) -> set[tuple[int, int]]:
    """Every (status, code) the front may answer ``cls`` with."""
    return {HTTP[cls], *(wire for (c, _), wire in DETAILS.items() if c is cls)}


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _int(node: ast.AST | None) -> int | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _arg(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[index] if len(call.args) > index else None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _name_of(node: ast.AST | None, where: str) -> tuple[str | None, str | None]:
    """(the error name a node stands for, a problem with it)."""
    if node is None:
        return e.BadRequestError.code, None  # ApiError's default
    text = _str(node)
    if text is not None:
        return text, None
    # ``SomeError.code``: the table's class's name
    if isinstance(node, ast.Attribute) and node.attr == "code":
        owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(
            node.value, "id", "")
        cls = getattr(e, owner, None)
        if isinstance(cls, type) and cls in e.ERRORS:
            return cls.code, None
        return None, f"{where}: {ast.unparse(node)} is not a name of the table"
    return None, f"{where}: an error name that is not the table's ({ast.unparse(node)})"


def _function_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return ""


def problems(root: Path, files: list[Path]) -> list[str]:
    """What in ``files`` makes an error outside the table."""
    found: list[str] = []
    names = set(e.BY_NAME)
    for path in files:
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), rel)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        local_errors: set[str] = set()
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                if bases & (ERROR_BASES | local_errors):
                    local_errors.add(node.name)
                    if rel not in TABLE_MODULES and node.name not in OTHER_ROOTS.get(rel, ()):
                        found.append(f"{where}: error class {node.name} outside the table")
            elif isinstance(node, ast.Call) and _callee(node) == "ApiError":
                if rel not in API_ERROR_MODULES:
                    found.append(f"{where}: an ApiError outside the front's parsing of HTTP: "
                                 "raise the table's class")
                if (rel, _function_of(node, parents)) == RELAY:
                    continue
                name, problem = _name_of(_arg(node, 3, "name"), where)
                if problem:
                    found.append(problem)
                elif name not in names:
                    found.append(f"{where}: ApiError named {name!r}, not in the table")
                else:
                    status, code = _int(_arg(node, 0, "status")), _arg(node, 2, "error_code")
                    pair = (status, _int(code) if code is not None else status)
                    if status is not None and (code is None or pair[1] is not None) \
                            and pair not in _pairs(e.BY_NAME[name]):
                        found.append(f"{where}: ApiError {name!r} answered {pair}, the table's "
                                     f"front says {sorted(_pairs(e.BY_NAME[name]))}")
            elif isinstance(node, ast.Call) and _callee(node) in (
                    "LakelogClientError", "LakelogTimeoutError", "LakelogConnectionError"):
                name = _str(_arg(node, 1, "error"))
                if name is not None and name not in names and not (
                        rel.startswith("lakelog/client/") and name in CLIENT_NAMES):
                    found.append(f"{where}: client error named {name!r}, not in the table")
            elif isinstance(node, ast.Dict):  # a body made by hand
                for key, value in zip(node.keys, node.values, strict=True):
                    name = _str(value)
                    if _str(key) == "error" and name is not None and name not in names:
                        found.append(f"{where}: a body names error {name!r}, not in the table")
            elif isinstance(node, ast.Assign) and rel not in TABLE_MODULES:
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in (
                            "code", "error_code", "status") and _str(node.value) is not None:
                        found.append(f"{where}: sets an error's {target.attr} by hand")
    return found


def _package_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_no_error_is_made_outside_the_table() -> None:
    files = _package_files()
    assert len(files) > 200 and {"log_tables", "ingest_api", "cluster", "lakelog"} <= set(
        PACKAGES)
    assert problems(ROOT, files) == []


def test_the_walker_finds_errors_made_by_hand(tmp_path: Path) -> None:
    bad = tmp_path / "pkg" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(textwrap.dedent('''
        from ingest_api.http.errors import ApiError
        from log_tables.errors import LakelogError, UnknownTopicError

        class MadeUpError(LakelogError):
            code = "made_up"

        class MoreMadeUp(MadeUpError):
            pass

        class ShadowError(UnknownTopicError):
            pass

        def f(x):
            raise ApiError(404, "no", name="no_such_thing")

        def g(x):
            raise ApiError(400, "not found", 40403, "unknown_topic_or_partition")

        def h(name):
            raise ApiError(400, "made", name=name)

        def i():
            return {"error_code": 400, "error": "invented", "message": "m"}

        def j(exc):
            exc.code = "renamed"

        def k():
            raise ApiError(400, "fine", name="malformed_json")
    '''))
    found = problems(tmp_path, [bad])
    assert len(found) == 8 + 4, found  # and the four ApiErrors outside the front's parsing
    for what in ("ApiError outside", "MadeUpError outside", "MoreMadeUp outside", "ShadowError outside",
                 "'no_such_thing'", "(400, 40403)", "not the table's (name)", "'invented'",
                 "code by hand"):
        assert any(what in p for p in found), (what, found)


def test_every_entry_has_an_identity_and_kafkas_number_where_kafka_has_a_name() -> None:
    assert len({c.__name__ for c in e.ERRORS}) == len(e.ERRORS) == len(set(e.ERRORS))
    for cls in e.ERRORS:
        assert getattr(e, cls.__name__) is cls  # all importable from the table
        assert cls.code and cls.code == cls.code.lower(), cls
        assert isinstance(cls.retriable, bool)
        if cls.kafka_name is None:
            assert cls.kafka_code is None, cls
        else:
            assert cls.kafka_name == cls.kafka_name.upper(), cls
            assert cls.kafka_code == KAFKA_CODES[cls.kafka_name], cls
    # A name two classes share is one Kafka error; the front tells them apart.
    for name in e.SHARED_NAMES:
        same = [c for c in e.ERRORS if c.code == name]
        assert len({c.kafka_name for c in same}) == 1, same
        assert len({HTTP[c] for c in same}) == len(same), same
    assert len({(c.code, HTTP[c]) for c in e.ERRORS}) == len(e.ERRORS)
    # Kafka's own numbers (Errors.java), spot-checked.
    assert (e.OffsetOutOfRangeError.kafka_code, e.CorruptRecordError.kafka_code,
            e.NotLeaderError.kafka_code, e.StorageError.kafka_code,
            e.UnknownTopicIdError.kafka_code, e.StaleMemberEpochError.kafka_code) == (
        1, 2, 6, 56, 100, 113)


def test_the_front_maps_every_entry_to_a_status_and_a_confluent_code() -> None:
    assert set(HTTP) == set(e.ERRORS)
    for cls, (status, code) in [*HTTP.items(), *[(c, w) for (c, _), w in DETAILS.items()]]:
        assert cls in e.ERRORS and 400 <= status < 600, cls
        assert code == status or code // 100 == status, cls
    for cls, detail in DETAILS:
        assert isinstance(detail, str) and detail, cls


def test_the_client_reads_each_entry_back_without_the_server() -> None:
    for cls in e.DOMAIN_ERRORS:
        assert client.class_of(cls.code, HTTP[cls][1]) is cls, cls
    for cls in e.REQUEST_ERRORS:  # read by name, untyped
        assert client.class_of(cls.code, HTTP[cls][1]) is e.LakelogError, cls
    for (name, code), cls in client.SHARED_NAME_CODES.items():
        assert (cls.code, HTTP[cls][1]) == (name, code)
    assert {name for name, _ in client.SHARED_NAME_CODES} == e.SHARED_NAMES
    assert client.class_of("no_such_error", 99999) is e.LakelogError
