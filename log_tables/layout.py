"""Where lakelog keeps things: the data directory (hot tier, registry) and the warehouse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

from log_tables.registry import TopicMetadata, TopicRegistry

WAREHOUSE_DIR = "warehouse"
TOPICS_DIR = "topics"
TYPED_DIR = "typed"
"""Topics' typed and upsert tables (``delta.table.mode``): ``typed/<topic>``."""
DLQ_DIR = "dlq"
"""Their dead-letter tables: ``dlq/<topic>``."""


def table_uri(warehouse: str, topic: str) -> str:
    """Where a topic's Delta table lives."""
    return f"{warehouse.rstrip('/')}/{TOPICS_DIR}/{topic}"



def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri.removeprefix("file://")


def delta_path(uri: str) -> str:
    """A file or table URI as delta-rs returns it (percent-encoded: ``jobs%20running``) as
    a path to open: local ones decoded."""
    return unquote(local_path(uri)) if is_local(uri) else uri


class Layout(NamedTuple):
    """The two roots every component agrees on (plain strings, so Spark tasks can carry it)."""

    data_dir: str
    """Absolute path of the data directory (``hot/``, ``topics.json``)."""
    warehouse: str
    """Absolute path or URI of the Delta warehouse (``topics/<topic>``, ``_consumer_offsets``)."""

    @classmethod
    def of(cls, data_dir: str | os.PathLike[str], warehouse: str | os.PathLike[str] | None = None
           ) -> Layout:
        """Resolve relative paths; the warehouse defaults to ``<data_dir>/warehouse``."""
        data = os.path.abspath(data_dir)
        if warehouse is None:
            wh = os.path.join(data, WAREHOUSE_DIR)
        else:
            wh = str(warehouse)
            wh = os.path.abspath(local_path(wh)) if is_local(wh) else wh.rstrip("/")
        return cls(data, wh)

    @property
    def hot_dir(self) -> Path:
        return Path(self.data_dir) / "hot"

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.hot_dir / topic / str(partition)

    def table_uri(self, topic: str) -> str:
        return table_uri(self.warehouse, topic)

    def typed_uri(self, topic: str) -> str:
        """Where a topic's typed (or upsert) table lives."""
        return f"{self.warehouse.rstrip('/')}/{TYPED_DIR}/{topic}"

    def dlq_uri(self, topic: str) -> str:
        """Where the records its typed table cannot hold go (``delta.errors.mode=dlq``)."""
        return f"{self.warehouse.rstrip('/')}/{DLQ_DIR}/{topic}"

    def topics(self) -> list[TopicMetadata]:
        """The registered topics, read from the registry file (any process may call this)."""
        if not (Path(self.data_dir) / "topics.json").exists():
            return []
        return TopicRegistry(Path(self.data_dir)).list()
