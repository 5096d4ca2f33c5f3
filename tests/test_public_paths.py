"""Every name a user was shown keeps importing.

The README, ``docs/`` and the notebooks must show only current paths (importing them
raises no ``DeprecationWarning``), and every path the README ever showed (read from its
git history when this test was written, listed below) still imports the same object,
with a ``DeprecationWarning`` that names where it lives now when it moved."""

from __future__ import annotations

import importlib
import json
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("lakelog", "log_tables", "ingest_api", "consumer_groups", "compaction_jobs", "cluster")
IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(?:\(([^)]*)\)|([\w ,]+))", re.M)

# Every (module, name) the README showed since its first commit, with where it lives now.
SHOWN_BEFORE: dict[tuple[str, str], str] = {
    ("log_tables.spark_session", "lakelog_session"): "lakelog.spark",
    ("log_tables.spark_read", "read_topic"): "lakelog.spark",
    ("log_tables.spark_read", "register_views"): "lakelog.spark",
    ("log_tables.spark.read", "register_views"): "lakelog.spark",
    ("log_tables.partition_log", "PartitionLog"): "lakelog.log",
    ("log_tables.spark.session", "lakelog_session"): "",
    ("log_tables.spark.read", "read_topic"): "",
    ("log_tables.hot.partition_log", "PartitionLog"): "",
    ("log_tables.records", "build_batch"): "",
    ("log_tables.config", "TopicConfig"): "",
    ("lakelog.views", "register_views"): "",
    ("lakelog.client", "Consumer"): "",
    ("lakelog.client", "Producer"): "",
    ("lakelog.client", "AdminClient"): "",
}
# Old paths of the streaming source and the session's helpers, moved with the above.
MOVED_BESIDE: dict[tuple[str, str], str] = {
    ("log_tables.spark_session", "attach"): "lakelog.spark",
    ("log_tables.spark_source", "LakelogDataSource"): "lakelog.spark",
    # The broker core's HTTP shapes, moved to the HTTP front after a landing (issue 36).
    **{("ingest_api.broker.metadata", name): "ingest_api.http.resources" for name in (
        "CLUSTER", "topic_url", "partition_url", "broker_url", "related", "resource",
        "collection", "replica_body")},
    **{("ingest_api.broker.arrow_answer", name): "ingest_api.http.arrow_headers"
       for name in ("ARROW_STREAM", "NEXT_OFFSET", "HIGH_WATERMARK", "LOG_START_OFFSET",
                    "MEMBER_EPOCH", "RECORD_COUNT", "ARROW_RESPONSE", "wants_arrow")},
}


def shown_imports(text: str) -> set[tuple[str, str]]:
    """(module, name) for each ``from <ours> import a, b`` in ``text``."""
    found: set[tuple[str, str]] = set()
    for module, wrapped, names in IMPORT.findall(text):
        names = wrapped or names
        if module.split(".")[0] in OURS:
            found.update((module, n.split(" as ")[0].strip())
                         for n in names.replace("\n", " ").split(",") if n.strip())
    return found


def documents() -> dict[str, str]:
    """The text of the README, every page of ``docs/`` and every notebook's code."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        texts[str(page.relative_to(ROOT))] = page.read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        texts[str(notebook.relative_to(ROOT))] = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return texts


def import_name(module: str, name: str) -> object:
    return getattr(importlib.import_module(module), name)


def test_what_the_docs_show_imports_without_a_warning() -> None:
    shown = {(doc, m, n) for doc, text in documents().items() for m, n in shown_imports(text)}
    assert len(shown) >= 10, "the scan found too few imports: is the pattern broken?"
    failures = []
    for doc, module, name in sorted(shown):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            try:
                import_name(module, name)
            except (ImportError, AttributeError, DeprecationWarning) as e:
                failures.append(f"{doc}: from {module} import {name}: {e}")
    assert not failures, "\n".join(failures)


def test_the_docs_show_the_public_paths() -> None:
    shown = shown_imports((ROOT / "README.md").read_text())
    for name in ("read_topic", "lakelog_session", "register_views"):
        assert ("lakelog.spark", name) in shown, f"the README should import {name} " \
                                                 "from lakelog.spark"
    assert ("lakelog.client", "Producer") in shown


@pytest.mark.parametrize(("module", "name"), sorted({**SHOWN_BEFORE, **MOVED_BESIDE}))
def test_every_path_shown_before_still_imports(module: str, name: str) -> None:
    new = {**SHOWN_BEFORE, **MOVED_BESIDE}[(module, name)]
    if not new:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert import_name(module, name) is not None
        return
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(module)}\.{name} moved: "
                                                rf"import it from {re.escape(new)}"):
        old = import_name(module, name)
    assert old is import_name(new, name)


def test_the_public_modules_export_what_they_say() -> None:
    for module in ("lakelog.spark", "lakelog.log", "lakelog.client"):
        exported = importlib.import_module(module).__all__
        for name in exported:
            assert import_name(module, name) is not None


def test_a_name_an_old_path_never_had_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="cannot import name 'nothing'"):
        exec("from log_tables.spark_read import nothing", {})


def test_the_scan_reads_multi_line_and_aliased_imports() -> None:
    text = "from lakelog.spark import (read_topic,\n    attach as a)\nfrom os import path\n"
    assert shown_imports(text) == {("lakelog.spark", "read_topic"), ("lakelog.spark", "attach")}
