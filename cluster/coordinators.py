"""Coordinators for keys on a replicated internal topic: Kafka's way of placing its group
(and transaction) coordinators, as one mechanism.

A key (a group id) belongs to slot ``hash(key) % slots`` of an internal topic; its
coordinator is the slot's leader. The slots are replicated partitions like any other,
so when a coordinator's broker dies the controller elects another replica and the
coordinator moves with the leadership; the new one loads the slot's state from where it
is durable before it answers (Kafka's COORDINATOR_LOAD_IN_PROGRESS meanwhile).

``CoordinatorSlots`` is the bookkeeping of one broker: which slots it leads now (and at
which leader epoch: the coordinator epoch, which fences what an older coordinator of the
slot writes late), which it has loaded, and which it must load or let go. Its owner (the
server, ``ingest_api.broker.group_slots``) loads and unloads the state; a slot is served only
while it is led here, with this broker's ZooKeeper lease, and loaded at the epoch it is
led at (``epoch``).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from cluster.broker import ClusterBroker


class SlotChanges(NamedTuple):
    """What a broker must do to serve the slots it leads: ``load`` (slot -> the leader
    epoch it leads it at; loaded at another epoch, or not at all) and ``unload`` (slots
    loaded here that it no longer leads)."""

    load: dict[int, int]
    unload: set[int]


class CoordinatorSlots:
    def __init__(self, broker: ClusterBroker, topic: str, slots: int) -> None:
        self.broker = broker
        self.topic = topic
        self.slots = slots
        self._loaded: dict[int, int] = {}
        self._lock = threading.Lock()

    def led(self) -> dict[int, int]:
        """The slots this broker leads now, with their leader epochs (none without its
        ZooKeeper lease: another broker may lead them by now)."""
        if not self.broker.session.has_lease:
            return {}
        me = self.broker.broker_id
        return {p: s.leader_epoch for (t, p), s in self.broker.view.all_states().items()
                if t == self.topic and s.leader == me and p < self.slots}

    def changes(self) -> SlotChanges:
        led = self.led()
        with self._lock:
            load = {s: e for s, e in led.items() if self._loaded.get(s) != e}
            unload = {s for s, e in self._loaded.items() if led.get(s) != e}
        return SlotChanges(load, unload)

    def loaded(self, slot: int, epoch: int) -> None:
        """The slot's state is loaded here as of leader epoch ``epoch``."""
        with self._lock:
            self._loaded[slot] = epoch

    def unloaded(self, slot: int) -> None:
        with self._lock:
            self._loaded.pop(slot, None)

    def epoch(self, slot: int) -> int | None:
        """The leader epoch at which this broker serves ``slot`` now; None when it does not
        (another broker leads it, it lost its lease, or the state is still loading)."""
        placement = self.broker.view.placement(self.topic, slot)
        if placement is None or placement.leader != self.broker.broker_id or \
                not self.broker.session.has_lease:
            return None
        with self._lock:
            loaded = self._loaded.get(slot)
        return loaded if loaded == placement.leader_epoch else None

    def loading(self, slot: int) -> bool:
        """Led here, with the lease, but not (yet) loaded at its leader epoch."""
        return self.epoch(slot) is None and slot in self.led()
