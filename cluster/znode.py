"""One znode changed only by conditional writes: read-modify-write that retries when
another writer got there first, and a watch that keeps a reader's copy current.

ZooKeeper's version number is the fence: ``set(path, data, version=v)`` succeeds only
if nobody wrote since the read that saw ``v``, and ``create`` only if nobody created the
node since the read that found none. A writer that loses reads again and re-applies its
change to what the winner wrote, so two brokers changing one document both land.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import DataWatch

log = logging.getLogger(__name__)

MAX_UPDATE_ATTEMPTS = 64
"""Losing 64 races in a row means a writer that never stops: give up loudly."""


class ZnodeContendedError(RuntimeError):
    """``update`` lost the race ``MAX_UPDATE_ATTEMPTS`` times; trying again may succeed."""

    retriable = True


class VersionedZnode:
    """The data of ``path`` (under the client's chroot), changed only conditionally."""

    def __init__(self, client: KazooClient, path: str) -> None:
        self.client = client
        self.path = path

    def read(self) -> tuple[bytes | None, int]:
        """(data, version) now; (None, -1) when the node does not exist."""
        try:
            data, stat = self.client.get(self.path)
        except NoNodeError:
            return None, -1
        return bytes(data), int(stat.version)

    def update(self, fn: Callable[[bytes | None], bytes | None]) -> bytes:
        """Replace the data with ``fn(data)`` unless someone wrote in between, then read
        and apply ``fn`` again (so ``fn`` must be pure and may run several times); ``fn``
        returning None leaves the node as it is. Returns the data stored afterwards
        (b"" when the node is absent and ``fn`` changed nothing)."""
        for _ in range(MAX_UPDATE_ATTEMPTS):
            data, version = self.read()
            new = fn(data)
            if new is None:
                return data if data is not None else b""
            try:
                if version < 0:
                    self.client.create(self.path, new, makepath=True)
                else:
                    self.client.set(self.path, new, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # another writer won (or deleted it): read what is there now
            return new
        raise ZnodeContendedError(f"{self.path}: lost {MAX_UPDATE_ATTEMPTS} conditional "
                                  "writes in a row to other writers")

    def watch(self, callback: Callable[[bytes | None], None]) -> None:
        """Call ``callback(data)`` now and after every change (None: no node), also after
        a lost session is re-established. It runs on kazoo's event thread, so it must
        not block (no ZooKeeper calls, no waiting on locks held across them)."""

        def on_change(data: bytes | None, _stat: Any) -> None:
            try:
                callback(None if data is None else bytes(data))
            except Exception:  # a raising callback would end the watch: keep watching
                log.exception("watch callback on %s failed", self.path)

        DataWatch(self.client, self.path, on_change)
