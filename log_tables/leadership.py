"""Files a cluster's broker keeps in its data directory for the processes beside it.

``leadership.json``: the partitions this broker leads and those it tiers (not the same:
``cluster.tierers``), written by the broker whenever either changes and read by its job
process, which compacts and expires only the first and tiers only the second.
``cluster.json``: the id of the cluster this data directory belongs to, so that a data
directory is never joined to another cluster by mistake (a wrong chroot, say); and, as of
the broker's latest start, where it answers (its URL, and the CA bundle it checks other
brokers' certificates with), so that Spark reading this data directory can ask the
partitions' leaders for the hot tails it lacks (``log_tables.spark.tails``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from log_tables.files import atomic_write

LEADERSHIP_FILE = "leadership.json"
CLUSTER_FILE = "cluster.json"


def write_leadership(data_dir: Path, broker_id: int, led: dict[str, list[int]],
                     tiers: dict[str, list[int]] | None = None, settle_ms: int = 0) -> None:
    """``tiers`` None: the broker tiers what it leads. ``settle_ms``: how old a
    transaction's marker must be before the tiering job takes it (``cluster.tierers``)."""
    doc = {"broker_id": broker_id, "partitions": led, "tiers": led if tiers is None else tiers,
           "settle_ms": settle_ms}
    atomic_write(data_dir / LEADERSHIP_FILE, json.dumps(doc).encode())


def read_settle_ms(data_dir: Path) -> int:
    """``settle_ms`` of ``leadership.json`` (0 without one: a broker alone)."""
    try:
        return int(json.loads((data_dir / LEADERSHIP_FILE).read_bytes()).get("settle_ms", 0))
    except FileNotFoundError:
        return 0


def read_leadership(data_dir: Path, key: str = "partitions") -> dict[str, set[int]] | None:
    """The partitions led here (``key`` "tiers": tiered here) by topic; None when this is
    not a cluster's broker. A file without "tiers" (its broker predates them) tiers what
    it leads."""
    try:
        doc = json.loads((data_dir / LEADERSHIP_FILE).read_bytes())
    except FileNotFoundError:
        return None
    return {t: set(ps) for t, ps in doc.get(key, doc["partitions"]).items()}


def clear_leadership(data_dir: Path) -> None:
    (data_dir / LEADERSHIP_FILE).unlink(missing_ok=True)


def read_cluster_id(data_dir: Path) -> str | None:
    try:
        return str(json.loads((data_dir / CLUSTER_FILE).read_bytes())["cluster_id"])
    except FileNotFoundError:
        return None


def write_cluster_id(data_dir: Path, cluster_id: str, broker_id: int, url: str | None = None,
                     tls_ca: str | None = None) -> None:
    doc: dict[str, object] = {"cluster_id": cluster_id, "broker_id": broker_id}
    if url is not None:
        doc.update(url=url, tls_ca=tls_ca)
    atomic_write(data_dir / CLUSTER_FILE, json.dumps(doc).encode())


class BrokerAddress(NamedTuple):
    """Where the broker of a data directory answered when it last started."""

    broker_id: int
    url: str
    tls_ca: str | None
    """The CA bundle (PEM path) its certificates are checked against; None: the system's."""
    cluster_id: str
    """The cluster it belongs to: a broker answering at ``url`` must be of it."""


def read_broker_address(data_dir: Path) -> BrokerAddress | None:
    """The address ``cluster.json`` holds; None for a cluster of one (no file) or a data
    directory whose broker wrote none (it predates addresses: its next start writes one)."""
    try:
        doc = json.loads((data_dir / CLUSTER_FILE).read_bytes())
    except FileNotFoundError:
        return None
    if not doc.get("url"):
        return None
    return BrokerAddress(int(doc["broker_id"]), str(doc["url"]), doc.get("tls_ca") or None,
                         str(doc["cluster_id"]))
