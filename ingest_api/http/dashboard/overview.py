"""What ``/ui/data`` answers: topics and partitions, rates, consumer groups with their lag
history, job runs with the tiering backlog, and the broker's health, in one JSON document.

The document is built in a worker thread from what the server holds in memory (the
logs, the Delta tier's cached states, the groups, the sampler's ring buffers) and the
cached job runs, and kept for ``CACHE_S``: many open pages cost one build a second.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from consumer_groups.lag import PartitionLag, all_group_lag
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.metadata import METADATA
from ingest_api.broker.metrics import tiering_backlog
from ingest_api.http.dashboard.health import Services, broker_health
from ingest_api.http.dashboard.job_runs_view import JobRunsView
from ingest_api.http.dashboard.sampler import Sampler
from ingest_api.http.dashboard.typed_view import TypedTablesView
from ingest_api.http.state import AppState
from log_tables.cold.table import log_start
from log_tables.errors import UnknownPartitionError, UnknownTopicError

CACHE_S = 1.0
MAX_TOPICS = 200
MAX_GROUPS = 50
"""The groups shown (most lag first); the rest are counted."""


class Dashboard:
    """The page's sources, made at startup: the sampler (run as a task), the job-runs
    view (shared with ``/metrics``), the service rows (``app.state.services``)."""

    def __init__(self, st: AppState, version: str, services: Services,
                 bounds: LeaderBounds) -> None:
        self.st = st
        self.bounds = bounds
        self.version = version
        self.services = services
        self.started_s = time.time()
        self.sampler = Sampler(
            st.metrics, st.groups, bounds.latest, st.settings.ui_sample_interval_ms,
            refresh=lambda: bounds.refresh_groups(st.groups, max_age_s=CACHE_S))
        self.job_runs = JobRunsView(st.settings.layout.warehouse)
        self.typed = TypedTablesView(st.settings.layout, st.manager.registry.list)
        self._lock = threading.Lock()
        self._built: tuple[float, dict[str, Any]] | None = None

    async def overview(self) -> dict[str, Any]:
        # Group lag counts to the leaders' bounds (in a cluster), asked first.
        await self.bounds.refresh_groups(self.st.groups, max_age_s=CACHE_S)
        return await asyncio.to_thread(self._cached)

    def _cached(self) -> dict[str, Any]:
        with self._lock:
            if self._built is None or time.monotonic() - self._built[0] >= CACHE_S:
                self._built = (time.monotonic(), self.build())
            return self._built[1]

    def build(self) -> dict[str, Any]:
        history = self.sampler.snapshot()
        topics = self._topics()
        return {
            "now_ms": int(time.time() * 1000),
            "refresh_ms": max(1000, min(5000, self.st.settings.ui_sample_interval_ms)),
            "broker": broker_health(self.st, self.started_s, self.version, self.services),
            "topics": topics,
            "rates": {"topics": self.sampler.topic_rates(), "history": {
                "times_ms": history["times_ms"], **history["throughput"]}},
            "groups": self._groups(history),
            "jobs": self._jobs(topics),
        }

    def _topics(self) -> list[dict[str, Any]]:
        st = self.st
        out = []
        typed = self.typed.snapshot()
        for meta in sorted(st.manager.registry.list(), key=lambda m: m.name)[:MAX_TOPICS]:
            partitions = []
            for p in range(meta.partitions):
                placement = METADATA.placement(meta.name, p)
                row: dict[str, Any] = {"partition": p, "leader": placement.leader,
                                       "replicas": list(placement.replicas),
                                       "isr": list(placement.in_sync)}
                # A partition this broker holds no replica of shows its placement only.
                if st.cluster is not None and st.cluster.broker_id not in placement.replicas:
                    partitions.append(row)
                    continue
                try:
                    plog = st.manager.log(meta.name, p)
                    cold = st.tiered.state(meta.name, p)
                except (UnknownTopicError, UnknownPartitionError):  # deleted meanwhile
                    partitions.append(row)
                    continue
                start = log_start(plog.log_start_offset, cold)
                tiered = cold.tiered_offset if cold is not None else 0
                row.update(log_start_offset=start, high_watermark=plog.high_watermark,
                           tiered_offset=tiered, size_bytes=plog.size_bytes,
                           tiered_size_bytes=cold.size_bytes if cold is not None else 0,
                           tiering_backlog=tiering_backlog(plog.high_watermark, tiered, start))
                if meta.name in typed and p < len(typed[meta.name]):
                    row.update(typed_offset=typed[meta.name][p].typed_offset,
                               dead_letters=typed[meta.name][p].dead_letters)
                partitions.append(row)
            out.append({"name": meta.name, "partitions": partitions,
                        "table_mode": meta.config.delta_table_mode})
        return out

    def _groups(self, history: dict[str, Any]) -> dict[str, Any]:
        coordinator = self.st.groups
        rows: dict[str, list[PartitionLag]] = {}
        for group, row in all_group_lag(coordinator, self.bounds.latest):
            rows.setdefault(group, []).append(row)
        shown = []
        for group, lags in rows.items():
            live = coordinator.groups.get(group)
            shown.append({
                "group": group,
                "state": live.state() if live is not None else "Empty",
                "members": len(live.members) if live is not None else 0,
                "total_lag": sum(r.lag or 0 for r in lags),
                "partitions": [{"topic": r.topic, "partition": r.partition,
                                "committed": r.committed.offset if r.committed else None,
                                "high_watermark": r.bounds.high_watermark if r.bounds else None,
                                "lag": r.lag, "member": r.member_id} for r in lags],
                "history": history["lag"].get(group, []),
            })
        shown.sort(key=lambda g: (-g["total_lag"], g["group"]))
        return {"groups": shown[:MAX_GROUPS], "more": max(0, len(shown) - MAX_GROUPS),
                "history_truncated": history["truncated"], "times_ms": history["times_ms"]}

    def _jobs(self, topics: list[dict[str, Any]]) -> dict[str, Any]:
        runs = self.job_runs.snapshot()
        return {
            "runs": runs.rows,
            "last": sorted(runs.last.values(), key=lambda r: r["job"]),
            "error": runs.error,
            # Per topic here; per partition in the topics' rows.
            "backlog": [{"topic": t["name"], "records": sum(
                p.get("tiering_backlog", 0) for p in t["partitions"])} for t in topics],
        }
