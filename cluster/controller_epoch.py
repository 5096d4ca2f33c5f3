"""Step 1 of the controller: being elected, staying elected, and the fence on every
write it makes (Kafka's controller epoch). ``cluster.controller.Controller`` runs its
other steps on this.

The first broker to create the ephemeral ``/controller`` node is the controller (one
this session made in an interrupted try counts as made); it then raises
``/controller_epoch`` by a conditional write. Every write the controller makes is a
ZooKeeper transaction that first checks ``/controller_epoch`` still has the version it
wrote, so a controller that was replaced (its session ended while it was paused, say)
cannot change anything: its transaction fails and it resigns.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from cluster.model import BROKERS, CONTROLLER, CONTROLLER_EPOCH, BrokerInfo, broker_path, decode
from cluster.session import unreachable_as
from log_tables.errors import NotControllerError

log = logging.getLogger("cluster.controller")  # the controller's one log, as before the split
Ops = list[tuple[str, tuple[object, ...], dict[str, object]]]
"""A ZooKeeper transaction's operations: (method of kazoo's transaction, args, kwargs)."""


class ControllerEpoch:
    """A broker's claim to be the controller and the epoch that fences its writes; the
    hooks at the end are the Controller's."""

    def __init__(self, client: KazooClient, broker_id: int) -> None:
        self.client = client
        self.broker_id = broker_id
        self.epoch = 0
        self._epoch_version = -1
        self.active = False
        self._lock = threading.RLock()  # one controller step at a time (Kafka's event queue)

    def _still_controller(self) -> bool:
        if not self.active:
            return False
        try:
            data, _ = self.client.get(CONTROLLER)
            _, stat = self.client.get(CONTROLLER_EPOCH)
        except NoNodeError:
            return self._resign("the controller node is gone")
        if decode(data, dict).get("broker_id") != self.broker_id or \
                stat.version != self._epoch_version:
            return self._resign("another broker is the controller")
        return True

    def _resign(self, why: str) -> bool:
        if self.active:
            log.warning("broker %d is no longer the controller: %s", self.broker_id, why)
        self.active = False
        return False

    def _elect(self) -> None:
        try:
            self.client.create(CONTROLLER, encode_json({"broker_id": self.broker_id,
                                                        "timestamp": int(time.time() * 1000)}),
                               ephemeral=True)
        except NodeExistsError:
            # Ours when an earlier try of this session made it and was then interrupted
            # (its answer lost, or a failure before the epoch was raised): finish that
            # election, since nobody else can hold the node while this session lives.
            try:
                _, stat = self.client.get(CONTROLLER)
            except NoNodeError:
                self.poke()  # gone meanwhile: try again
                return
            if stat.ephemeralOwner != self.client.client_id[0]:
                return
        self._step("elected")
        while True:
            try:
                data, stat = self.client.get(CONTROLLER_EPOCH)
                epoch = int(data) + 1
                stat = self.client.set(CONTROLLER_EPOCH, str(epoch).encode(),
                                       version=stat.version)
                break
            except NoNodeError:
                try:
                    self.client.create(CONTROLLER_EPOCH, b"1")
                except NodeExistsError:
                    continue
                epoch, stat = 1, self.client.get(CONTROLLER_EPOCH)[1]
                break
            except BadVersionError:
                continue
        self.epoch, self._epoch_version, self.active = epoch, stat.version, True
        self._on_elected()
        self._step("epoch")
        log.warning("broker %d is the controller (controller epoch %d)", self.broker_id, epoch)

    def _commit(self, ops: Ops) -> None:
        """One ZooKeeper transaction, fenced by the controller epoch."""
        tx = self.client.transaction()
        tx.check(CONTROLLER_EPOCH, self._epoch_version)
        for op, args, kwargs in ops:
            getattr(tx, op)(*args, **kwargs)
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            return
        if isinstance(results[0], BadVersionError | NoNodeError):
            self._resign("the controller epoch moved on")
            raise NotControllerError(f"broker {self.broker_id} is no longer the controller")
        first = next((r for r in failed if not isinstance(r, RolledBackError)), failed[0])
        raise first

    def _reachable(self) -> contextlib.AbstractContextManager[None]:
        """A change asked of the controller that met ZooKeeper out of reach (this broker
        paused beyond its session, say) answers NOT_CONTROLLER, retriable, as a replaced
        controller does."""
        return unreachable_as(NotControllerError, f"the controller on broker {self.broker_id}")

    def _require_active(self) -> None:
        if not self._still_controller():
            raise NotControllerError(f"broker {self.broker_id} is not the controller")

    def live_brokers(self) -> dict[int, tuple[BrokerInfo, int]]:
        """Each registered broker with its broker epoch (the czxid of its registration)."""
        live: dict[int, tuple[BrokerInfo, int]] = {}
        for child in self.client.get_children(BROKERS):
            try:
                data, stat = self.client.get(broker_path(int(child)))
            except NoNodeError:
                continue
            live[int(child)] = (decode(data, BrokerInfo), stat.czxid)
        return live

    # -- the Controller's hooks ---------------------------------------------------------
    def poke(self) -> None:
        """Look again soon (the Controller wakes its thread)."""

    def _on_elected(self) -> None:
        """Just elected, before the ``epoch`` step is reported: start the other steps'
        state afresh."""

    def _step(self, name: str) -> None:
        """A step is done (the Controller reports it to ``cluster.controller.step_hook``)."""


def encode_json(doc: dict[str, object]) -> bytes:
    import msgspec

    return msgspec.json.encode(doc)
