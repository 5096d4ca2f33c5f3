"""What the SQL endpoint needs installed, and the one line that says what is missing.

The endpoint's front parses plans with PySpark's Spark Connect classes, and importing
``pyspark.sql.connect`` checks pandas, pyarrow, grpcio, grpcio-status,
googleapis-common-protos and zstandard (all core dependencies of lakelog). One that is
missing is not fixed by starting the endpoint again: it exits with
``process.EXIT_NOT_RESTARTED``, the server does not start it again, and the state file
and the server's log name the command that installs it.

Only a package lakelog pins (or the one PySpark's own error names) counts as missing: any
other ModuleNotFoundError (a module of lakelog's, a library's optional import) is an
ordinary failure, restarted as any other, and never turned into ``pip install`` advice for
a name that may not even be its distribution's on PyPI.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shlex
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

CONNECT_PACKAGE = "pyspark.sql.connect"
DISTRIBUTIONS = {"grpc": "grpcio", "grpc_status": "grpcio-status",
                 "google": "googleapis-common-protos", "google.protobuf": "protobuf",
                 "google._upb": "protobuf"}
"""Distribution of a module, where the two names differ (the longest prefix wins)."""


class MissingDependency(NamedTuple):
    """A package the endpoint cannot start without."""

    distribution: str
    """Its name on PyPI, e.g. ``pandas``."""
    command: str
    """The command that installs the version lakelog pins, into this Python."""

    def message(self) -> str:
        return (f"the SQL endpoint needs {self.distribution}, which is not installed (or "
                f"too old): `{self.command}` installs it; then restart `lakelog serve`")


def check_connect() -> None:
    """Import what the endpoint's front needs, before any JVM starts (raises ImportError,
    or PySpark's PySparkImportError, on a missing package)."""
    importlib.import_module(CONNECT_PACKAGE)


def missing_dependency(exc: BaseException) -> MissingDependency | None:
    """The pinned package whose absence ``exc`` (or an exception raised ``from`` it) reports.

    Only ``__cause__`` is followed: an ImportError a library handled on its way to ``exc``
    (its ``__context__``) says nothing about why ``exc`` happened."""
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk down the chain of causes
        if seen is None:
            return None
        package = _pyspark_package(seen)
        if package is not None:
            return _missing(package)
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            distribution = _distribution(seen.name)
            if pinned(distribution) is not None:
                return _missing(distribution)
        seen = seen.__cause__
    return None


def _distribution(module: str) -> str:
    """The distribution that would hold ``module``, by its longest known prefix."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        known = DISTRIBUTIONS.get(".".join(parts[:end]))
        if known is not None:
            return known
    return parts[0]


def _pyspark_package(exc: BaseException) -> str | None:
    """``package_name`` of PySpark's PACKAGE_NOT_INSTALLED or UNSUPPORTED_PACKAGE_VERSION."""
    parameters = getattr(exc, "getMessageParameters", None)
    if not callable(parameters) or not isinstance(exc, ImportError):
        return None
    name = (parameters() or {}).get("package_name")
    return name.lower() if isinstance(name, str) else None


def _missing(distribution: str) -> MissingDependency:
    requirement = pinned(distribution) or distribution
    return MissingDependency(distribution, f"{shlex.quote(sys.executable)} -m pip install "
                                           f"{shlex.quote(requirement)}")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[str]:
    """lakelog's requirements: its checkout's pyproject.toml when it runs from one (an
    editable install's metadata is as old as its install), else its installed metadata."""
    source = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if source.is_file():
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
            project = tomllib.loads(source.read_text())["project"]
            if project.get("name") == "lakelog":
                return list(project["dependencies"])
    try:
        return metadata.requires("lakelog") or []
    except metadata.PackageNotFoundError:
        return []


def pinned(distribution: str) -> str | None:
    """lakelog's own requirement on ``distribution`` (e.g. ``pandas==2.3.3``), or None."""
    for requirement in _requirements():
        spec, _, marker = requirement.partition(";")
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name and "extra" not in marker and \
                _canonical(name.group()) == _canonical(distribution):
            return re.sub(r"\[.*?\]", "", spec.strip()).replace(" ", "")
    return None
