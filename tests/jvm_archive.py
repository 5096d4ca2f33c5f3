"""A class-data-sharing archive of Spark's classes for the JVMs the tests start.

Most of a test JVM's life is its start: a Spark driver loads and verifies some ten thousand
classes from its jars before the first query (4.7-5.4 s to a session and 2.3-3.0 s to a
first query here, C1 only). Java 17 can dump the classes a run loaded into an archive
(``-XX:ArchiveClassesAtExit``) and map it into later JVMs of the same class path
(``-XX:SharedArchiveFile``): 2.3 s to the session and 0.9 s to the first query.

``workload`` is a representative Spark run of lakelog's (a session, tiering into Delta, a
read of the topic, SQL), run by a JVM that dumps its classes as it exits. ``jvm_options``
answers the options that map the archive of this Java and this Spark (kept in the
system's temporary directory), building it in the background if it is not there yet. A JVM whose class path differs (ZooKeeper's, Spark's launcher)
cannot map it and runs as it would without it (``-Xlog:disable`` keeps its warning, which
Java prints on standard output, out of the output Spark's launcher parses).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD_TIMEOUT_S = 240


def archive_path() -> Path | None:
    """Where the archive of this Java, this Spark and this checkout lives (None: no Java)."""
    java = shutil.which("java")
    if java is None:
        return None
    try:
        import pyspark
    except ImportError:
        return None
    real = Path(java).resolve()
    key = hashlib.sha256(f"{real}:{real.stat().st_mtime_ns}:{pyspark.__version__}:"
                         f"{Path(pyspark.__file__).parent}".encode())
    return Path(tempfile.gettempdir()) / f"lakelog-tests-spark-{key.hexdigest()[:16]}.jsa"


def jvm_options(base: str) -> str:
    """``base`` and the options that map the archive. A missing archive is built in the
    background, from a process of its own: the JVMs that start before it is there run
    without it (Java skips an archive it cannot find), the later ones map it (it appears
    whole, by a rename)."""
    path = archive_path()
    if path is None:
        return base
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        env = {**os.environ, "JDK_JAVA_OPTIONS": f"{base} -XX:ArchiveClassesAtExit={partial}"}
        subprocess.Popen([sys.executable, "-m", "tests.jvm_archive", "--workload", str(partial),
                          str(path)], env=env, cwd=Path(__file__).resolve().parents[1],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    return f"{base} -XX:SharedArchiveFile={path} -Xlog:disable -Xlog:all=error:stderr"


def workload() -> None:
    """What the tests' JVMs do most: a lakelog session, tiering into Delta, reads, SQL."""
    from compaction_jobs.tier import TierJob
    from log_tables.hot.log_manager import LogManager
    from log_tables.layout import Layout
    from log_tables.spark.read import read_topic
    from log_tables.spark.session import lakelog_session
    from tests.compaction_jobs.helpers import produce

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        manager = LogManager(data)
        manager.create_topic("t", 2)
        for p in range(2):
            produce(manager, "t", p, 30, roll_every=10)
        manager.close()
        spark = lakelog_session(data, master="local[1]")
        TierJob(Layout.of(data)).run(spark)
        read_topic(spark, "t").groupBy("partition").count().collect()
        spark.sql("SELECT 1 AS x").collect()
        spark.stop()


def build(partial: Path, path: Path) -> None:
    """Run the workload in a child whose JVM dumps its classes to ``partial`` as it exits;
    then ``partial`` becomes ``path``."""
    try:
        subprocess.run([sys.executable, "-c", "from tests.jvm_archive import workload; "
                        "workload()"], capture_output=True, timeout=BUILD_TIMEOUT_S,
                       check=True)
        if partial.exists():
            partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--workload"]:
    build(Path(sys.argv[2]), Path(sys.argv[3]))
