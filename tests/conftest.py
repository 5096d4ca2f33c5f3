"""Shared fixtures: factories for partition logs and registries on real files."""

from __future__ import annotations

import compileall
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from log_tables.clock import ManualClock
from log_tables.config import TopicConfig
from log_tables.hot.partition_log import PartitionLog
from tests.server import ServerProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OpenLog = Callable[..., PartitionLog]
# Every server the tests start (by any route) runs without a SQL endpoint, which would
# start a JVM and take port 15002: the endpoint's tests turn it on, on a port of their own.
os.environ.setdefault("LAKELOG_SQL_PORT", "0")
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Every JVM the tests start (Spark's, in this process and in job, endpoint and notebook
processes, and ZooKeeper's) compiles with C1 only and the serial collector, and maps a
class-data-sharing archive of Spark's classes (``tests/jvm_archive.py``): the tests' JVMs
live for seconds, and start-up is most of their time. The notebooks and
tests/lakelog/test_cli.py ran in 187 s against 245 s with Java's defaults (two workers),
before the archive. lakelog's own JVMs keep Java's defaults; Java says "Picked up
JDK_JAVA_OPTIONS" on stderr."""


SOURCES = ("ingest_api", "log_tables", "cluster", "compaction_jobs", "consumer_groups",
           "lakelog", "tests", "bench")
"""The packages every process the tests start imports from this checkout."""


def pytest_configure(config: pytest.Config) -> None:
    """Once per run, in the process that starts the workers (they inherit what it sets):
    this checkout's modules byte-compiled, and the JVMs' options (the archive built in the
    background if need be; none added if JDK_JAVA_OPTIONS is set).

    Where PYTHONDONTWRITEBYTECODE is set (as on this machine), Python reads the bytecode it
    finds but writes none, so every server, broker, job and command the tests start
    compiled lakelog's modules anew: importing the server's took 1.5 s of CPU against 1.1
    s compiled."""
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parents[1]
    for name in SOURCES:
        compileall.compile_dir(root / name, quiet=2, workers=0)
    if "JDK_JAVA_OPTIONS" not in os.environ:
        from tests.jvm_archive import jvm_options

        os.environ["JDK_JAVA_OPTIONS"] = jvm_options(JVM_OPTIONS)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock) -> Iterator[OpenLog]:
    """Open (or reopen) the partition log under ``tmp_path/log`` with config overrides."""
    opened: list[PartitionLog] = []

    def factory(directory: Path | None = None, **config: object) -> PartitionLog:
        plog = PartitionLog.open(directory or tmp_path / "log", TopicConfig(**config),  # type: ignore[arg-type]
                                 name="t-0", clock=clock)
        opened.append(plog)
        return plog

    yield factory
    for plog in opened:
        plog.abandon()


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local SparkSession for the whole run (it takes seconds to start)."""
    from log_tables.spark.session import lakelog_session

    spark = lakelog_session(tmp_path_factory.mktemp("spark-default"), master="local[2]",
                            conf={"spark.driver.memory": "1g"})
    yield spark
    spark.stop()


@pytest.fixture
def spark(spark_session: SparkSession, tmp_path: Path) -> SparkSession:
    """The session, attached to this test's data directory ``tmp_path/data``."""
    from log_tables.spark.session import attach

    return attach(spark_session, tmp_path / "data")


@pytest.fixture
def jobs_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server whose jobs tier and compact every second, rolling segments as soon as
    they are due (for reads across the hot and Delta tiers and compacted gaps)."""
    proc = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "1000", "LAKELOG_COMPACT_INTERVAL_MS": "1000",
        "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}).start()
    yield proc
    proc.stop(timeout_s=90)
