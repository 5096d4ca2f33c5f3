"""Files a cluster's broker keeps in its data directory for the processes beside it.

``leadership.json``: the partitions this broker leads, written by the broker whenever
that changes and read by its job process, which tiers, compacts and expires only those.
``cluster.json``: the id of the cluster this data directory belongs to, so that a data
directory is never joined to another cluster by mistake (a wrong chroot, say).
"""

from __future__ import annotations

import json
from pathlib import Path

from log_tables.files import atomic_write

LEADERSHIP_FILE = "leadership.json"
CLUSTER_FILE = "cluster.json"


def write_leadership(data_dir: Path, broker_id: int, led: dict[str, list[int]]) -> None:
    atomic_write(data_dir / LEADERSHIP_FILE,
                 json.dumps({"broker_id": broker_id, "partitions": led}).encode())


def read_leadership(data_dir: Path) -> dict[str, set[int]] | None:
    """The partitions led here by topic; None when this is not a cluster's broker."""
    try:
        doc = json.loads((data_dir / LEADERSHIP_FILE).read_bytes())
    except FileNotFoundError:
        return None
    return {t: set(ps) for t, ps in doc["partitions"].items()}


def clear_leadership(data_dir: Path) -> None:
    (data_dir / LEADERSHIP_FILE).unlink(missing_ok=True)


def read_cluster_id(data_dir: Path) -> str | None:
    try:
        return str(json.loads((data_dir / CLUSTER_FILE).read_bytes())["cluster_id"])
    except FileNotFoundError:
        return None


def write_cluster_id(data_dir: Path, cluster_id: str, broker_id: int) -> None:
    atomic_write(data_dir / CLUSTER_FILE,
                 json.dumps({"cluster_id": cluster_id, "broker_id": broker_id}).encode())
