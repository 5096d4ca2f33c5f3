"""The endpoint's Spark side: lakelog's views in every Spark Connect session, and in the
one session the JDBC server shares.

A Spark Connect client's session is an isolated SparkSession in the endpoint's JVM
(``SparkConnectService.getOrCreateIsolatedSession(user, session id)``). Before a request
of that session runs, the front calls ``SessionViews.prepare`` with the names the request
mentions: the session is made (attached to the data directory, the ``lakelog`` source
registered in it), and every view named is registered again when its data changed, so a
query sees the live tail as of its start, and a topic made after the session began is
found by name. A principal's session holds views of the topics it may consume only,
and ``partitions``, ``job_runs`` and the group views hold rows of those topics only.

The JDBC server runs in single-session mode on the root session: ``refresh_root``
registers every view there, again whenever its data changed (the JDBC front calls it
before a request, at most once a second).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer_groups.offsets import offsets_uri
from consumer_groups.subscriptions import subscriptions_path
from lakelog.views import register_views
from log_tables.cold.job_runs import job_runs_uri
from log_tables.config import GROUP_HELPER_VIEWS, GROUP_VIEWS, LOG_VIEWS
from log_tables.layout import Layout, delta_path, is_local
from log_tables.spark.read import read_topic
from log_tables.spark.session import CONF_DATA_DIR, CONF_WAREHOUSE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
SYSTEM_VIEWS = (*LOG_VIEWS, *GROUP_VIEWS)
"""``partitions``, ``job_runs``, ``consumer_offsets``, ``consumer_lag``,
``consumer_group_lag``: registered together (the group views read ``partitions``)."""
SESSION_CONF = {
    # `parquet.`/path`` in SQL would read any file the endpoint can: off, for everyone.
    "spark.sql.runSQLOnFiles": "false",
}
SYSTEM = "*system*"
ALL_USERS = 8
"""Sessions open in all: this many times the bound of one user."""


def fingerprint(layout: Layout, topic: str) -> str:
    """Changes whenever the topic's data may have: its hot files (names, sizes, times)
    and its Delta log's newest commit. (An object-store table: always new.)"""
    digest = hashlib.blake2b(digest_size=16)
    hot = layout.hot_dir / topic
    with contextlib.suppress(FileNotFoundError):
        for part in sorted(os.scandir(hot), key=lambda e: e.name):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for entry in os.scandir(part.path):
                    st = entry.stat()
                    digest.update(f"{part.name}/{entry.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    digest.update(_newest_commit(layout.table_uri(topic)).encode())
    return digest.hexdigest()


def _newest_commit(uri: str) -> str:
    """The name of a local Delta table's newest log entry ("" if none); random for a
    table on an object store (not listed on every query: always refreshed)."""
    if not is_local(uri):
        return os.urandom(8).hex()
    with contextlib.suppress(FileNotFoundError):
        return max((e.name for e in os.scandir(Path(delta_path(uri)) / "_delta_log")),
                   default="")
    return ""


def system_fingerprint(layout: Layout, topics: Collection[str], marks: dict[str, str]) -> str:
    """Changes whenever a system view's rows may have: a topic's data (``marks``: the
    topics' fingerprints, made here where missing), the offsets and job-runs tables, the
    groups' subscriptions, or the set of topics."""
    digest = hashlib.blake2b(digest_size=16)
    for topic in sorted(topics):
        mark = marks.get(topic) or marks.setdefault(topic, fingerprint(layout, topic))
        digest.update(f"{topic}={mark};".encode())
    for uri in (offsets_uri(layout.warehouse), job_runs_uri(layout.warehouse)):
        digest.update(_newest_commit(uri).encode())
    with contextlib.suppress(FileNotFoundError):
        st = subscriptions_path(layout.data_dir).stat()
        digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()


class _Prepared:
    """What one session holds: the fingerprint each view was registered at."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.views: dict[str, str] = {}
        self.visible: frozenset[str] | None = None
        """The topics its principal could consume when last prepared (None: all)."""
        self.used = False
        self.lock = threading.Lock()


class SessionViews:
    """Registers lakelog's views in Spark Connect sessions and in the root session."""

    def __init__(self, root: SparkSession, layout: Layout, zookeeper: str | None,
                 max_sessions: int) -> None:
        """``max_sessions``: open at once per user (a principal, with authentication on);
        beyond it the user's least recently used is closed in Spark too (its client may
        come back with the same id, to a new, empty session), so no principal closes
        another's. ``ALL_USERS`` times as many in all. Spark Connect closes sessions idle
        for a day itself."""
        self.root = root
        self.max_sessions = max_sessions
        self.layout = layout
        self.zookeeper = zookeeper
        self._sessions: OrderedDict[tuple[str, str], _Prepared] = OrderedDict()
        self._lock = threading.Lock()
        self._root = _Prepared(root)
        jvm = root._jvm
        assert jvm is not None
        self._jvm = jvm
        self.connect_service = getattr(getattr(jvm.org.apache.spark.sql.connect.service,
                                        "SparkConnectService$"), "MODULE$")

    def topics(self) -> list[str]:
        return [t.name for t in self.layout.topics()]

    def prepare(self, user_id: str, session_id: str, named: Collection[str],
                visible: Collection[str] | None) -> None:
        """Make the session ready for a request naming ``named`` (words of its plan):
        register the views among them that are new to the session or whose data changed
        since (``*`` among them: every view, for SHOW and the catalog's listings).
        ``visible``: the topics the session's principal may consume (None: all)."""
        key = (user_id, session_id)
        evicted = []
        with self._lock:
            prepared = self._sessions.get(key)
            if prepared is None:
                holder = self.connect_service.getOrCreateIsolatedSession(user_id, session_id)
                prepared = _Prepared(self._wrap(holder.session()))
                self._sessions[key] = prepared
                mine = [k for k in self._sessions if k[0] == user_id]
                evicted.extend(mine[:max(0, len(mine) - self.max_sessions)])
                for old in evicted:
                    del self._sessions[old]
                while len(self._sessions) > ALL_USERS * self.max_sessions:
                    evicted.append(self._sessions.popitem(last=False)[0])
            else:
                self._sessions.move_to_end(key)
        for user, session in evicted:
            self._close(user, session)
        everything = "*" in named
        topics = [t for t in self.topics() if (visible is None or t in visible)
                  and (everything or t in named)]
        system = everything or any(v in named for v in (*SYSTEM_VIEWS, *GROUP_HELPER_VIEWS))
        self._refresh(prepared, topics, system, visible)

    def refresh_root(self) -> None:
        """Every view in the root session (the JDBC server's), where its data changed."""
        self._refresh(self._root, self.topics(), True, None)

    def _close(self, user_id: str, session_id: str) -> None:
        """Close a session in Spark, allowing its id back (a new, empty session)."""
        service = self._jvm.org.apache.spark.sql.connect.service
        try:
            self.connect_service.sessionManager().closeSession(
                service.SessionKey(user_id, session_id), True)
        except Exception:  # closed meanwhile (idle, or by its client)
            log.debug("session %s of %s not closed", session_id, user_id, exc_info=True)

    def forget(self, user_id: str, session_id: str) -> None:
        with self._lock:
            self._sessions.pop((user_id, session_id), None)

    def _wrap(self, jsession: Any) -> SparkSession:
        """A Python handle on a JVM session, attached to lakelog (the ``lakelog`` source
        registered in it: a new session's data sources are its own)."""
        from pyspark.sql import SparkSession
        from pyspark.sql.udf import _wrap_function

        from log_tables.spark.source import attached_source

        spark = SparkSession(self.root.sparkContext, jsession)
        spark.conf.set(CONF_DATA_DIR, self.layout.data_dir)
        spark.conf.set(CONF_WAREHOUSE, self.layout.warehouse)
        for key, value in SESSION_CONF.items():
            spark.conf.set(key, value)
        manager = jsession.sessionState().dataSourceManager()
        if not manager.dataSourceExists("lakelog"):
            source = attached_source(self.layout)
            udds = self._jvm.org.apache.spark.sql.execution.datasources.v2.python
            manager.registerDataSource("lakelog", udds.UserDefinedPythonDataSource(
                _wrap_function(self.root.sparkContext, source)))
        return spark

    def _refresh(self, prepared: _Prepared, topics: list[str], system: bool,
                 visible: Collection[str] | None) -> None:
        with prepared.lock:
            now = None if visible is None else frozenset(visible)
            if now is not None and (not prepared.used or prepared.visible is None
                                    or not now >= prepared.visible):
                # An ACL taken away: no view of the session may still read that topic, the
                # caller's own included (one made over it would), so all go; lakelog's come
                # back as they are named. A session new to this process may be a clone of
                # one made under older ACLs (CloneSession copies views): it starts bare.
                prepared.spark._jsparkSession.sessionState().catalog().clearTempTables()
                prepared.views.clear()
            prepared.visible, prepared.used = now, True
            marks: dict[str, str] = {}
            for topic in topics:
                mark = marks[topic] = fingerprint(self.layout, topic)
                if prepared.views.get(topic) == mark:
                    continue
                try:
                    read_topic(prepared.spark, topic).createOrReplaceTempView(f"`{topic}`")
                except Exception:  # deleted meanwhile: Spark says so when it is queried
                    log.debug("view of topic %s not registered", topic, exc_info=True)
                    continue
                prepared.views[topic] = mark
            if system:
                shown = [t for t in self.topics() if visible is None or t in visible]
                # A cluster's leaders and ISR live in ZooKeeper: asked again every time.
                mark = system_fingerprint(self.layout, shown, marks) \
                    if self.zookeeper is None else os.urandom(8).hex()
                if prepared.views.get(SYSTEM) != mark:
                    register_views(prepared.spark, [], zookeeper=self.zookeeper,
                                   visible=visible)
                    prepared.views[SYSTEM] = mark
