"""The broker's own health, as the dashboard shows it: who it is, how long it has run,
its disk, its cluster, and one row per service it runs beside the API.

A service row is added with one line, wherever the service is made::

    app.state.services["jobs"] = job_process.status      # a callable, asked per refresh
    app.state.services["sql"] = endpoint_state            # or a dict kept current

Either gives a mapping with at least ``state`` (``running``, ``starting``, ``off``,
``stopped``, ``exited``, ``failed``); every other key (``pid``, ``address``, ``error``)
is shown as it is. A callable that raises shows as ``failed`` with its error.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from ingest_api.broker.metadata import METADATA
from ingest_api.http.state import AppState

ServiceStatus = Callable[[], Mapping[str, object]] | Mapping[str, object]
Services = dict[str, ServiceStatus]


def service_rows(services: Services) -> list[dict[str, object]]:
    """One row per service, by name: ``{"name", "state", ...details}``."""
    rows: list[dict[str, object]] = []
    for name, status in sorted(services.items()):
        try:
            row = dict(status() if callable(status) else status)
        except Exception as exc:  # one broken row must not take the page down
            row = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
        rows.append({"name": name, "state": row.pop("state", "unknown"), **row})
    return rows


def broker_health(st: AppState, started_s: float, version: str, services: Services
                  ) -> dict[str, Any]:
    """This broker: id, version, uptime, data directory and its disk, the cluster it is
    in (None for a broker on its own), and its services."""
    settings = st.settings
    free: int | None = None
    total: int | None = None
    try:
        disk = shutil.disk_usage(settings.data_dir)
        free, total = disk.free, disk.total
    except OSError:  # shown as unknown
        pass
    cluster = None
    if st.cluster is not None:
        view = st.cluster.broker.view
        cluster = {"cluster_id": st.cluster.broker.cluster_id,
                   "controller_id": METADATA.controller_id,
                   "brokers": [{"broker_id": b.broker_id, "host": b.host, "port": b.port,
                                "rack": b.rack} for b in view.live_brokers()]}
    return {
        "broker_id": settings.broker_id if settings.broker_id is not None else 1,
        "version": version,
        "pid": os.getpid(),
        "started_ms": int(started_s * 1000),
        "uptime_s": round(time.time() - started_s, 1),
        "data_dir": str(settings.data_dir.resolve()),
        "warehouse": settings.layout.warehouse,
        "disk_free_bytes": free,
        "disk_total_bytes": total,
        "auth": settings.auth,
        "controller_id": METADATA.controller_id,
        "cluster": cluster,
        "services": service_rows(services),
    }
