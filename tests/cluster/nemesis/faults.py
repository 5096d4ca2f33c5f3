"""The nemesis's faults: a schedule drawn from a seed, and the thread that deals them.

A schedule is a pure function of the seed, the length of the run and the ZooKeeper
session timeout, so a seed replays the same faults in the same order at the same
moments (which broker is "the controller" or "a leader" is read when the fault starts,
then chosen among candidates by the fault's own draw). Faults start every
``GAP_S`` and last long enough that they often overlap; a broker takes part in one
fault at a time (a fault drawn for a broker already in one goes to another, or is
skipped when none is free), ZooKeeper's faults overlap with any.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.cluster.nemesis.cluster import NemesisCluster

log = logging.getLogger("nemesis")

GAP_S = (1.5, 5.0)
"""Seconds between the starts of two faults."""

KINDS: list[tuple[str, int]] = [
    ("kill", 4),              # SIGKILL, restarted 2-6 s later
    ("pause-long", 3),        # SIGSTOP past the ZooKeeper session, then SIGCONT
    ("pause-short", 2),       # SIGSTOP short of the session (past the broker's lease)
    ("cut-zookeeper", 2),     # cut off from ZooKeeper, not from clients or brokers
    ("cut-brokers", 2),       # cut off from the other brokers, not from ZooKeeper
    ("zookeeper-restart", 1),  # ZooKeeper stopped, started again
]
TARGETS = ["any", "controller", "leader", "bootstrap"]


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str
    """any, controller, leader (of a random partition; one in two, of the transaction
    coordinator's slot of a transactional producer), bootstrap (producer 1's broker)."""
    duration_s: float
    draw: int
    """This fault's own random number: which candidate, which partition."""

    def describe(self) -> str:
        what = self.kind if self.kind == "zookeeper-restart" else f"{self.kind} {self.target}"
        return f"{self.at_s:6.1f}s {what} for {self.duration_s:.1f}s"


def schedule(seed: int, seconds: float, session_s: float) -> list[Fault]:
    rng = random.Random(seed)
    kinds = [k for k, w in KINDS for _ in range(w)]
    out: list[Fault] = []
    at = rng.uniform(*GAP_S)
    while at < seconds:
        kind = rng.choice(kinds)
        if kind == "kill":
            duration = rng.uniform(2.0, 6.0)
        elif kind == "pause-long":
            duration = session_s * rng.uniform(1.3, 2.2)
        elif kind == "pause-short":
            duration = session_s * rng.uniform(0.3, 0.8)
        elif kind == "cut-zookeeper":
            duration = session_s * rng.uniform(0.5, 2.5)
        elif kind == "cut-brokers":
            duration = rng.uniform(2.0, 10.0)
        else:
            duration = session_s * rng.uniform(0.3, 2.0)
        out.append(Fault(round(at, 2), kind, rng.choice(TARGETS), round(duration, 2),
                         rng.randrange(1 << 30)))
        at += rng.uniform(*GAP_S)
    return out


class Nemesis:
    """Deals a schedule's faults on a cluster, each on a thread of its own, and heals
    what each did when its time is up."""

    def __init__(self, cluster: NemesisCluster, faults: list[Fault], *, topic: str,
                 partitions: int, bootstrap: int,
                 coordinator: tuple[str, int] | None = None) -> None:
        self.cluster = cluster
        self.faults = faults
        self.topic = topic
        self.partitions = partitions
        self.bootstrap = bootstrap
        self.coordinator = coordinator
        """The partition whose leader is a transaction coordinator to aim at."""
        self.history: list[str] = []
        self.errors: list[str] = []
        self.dealt = 0
        """Faults begun (a fault drawn for a broker in another fault may be skipped)."""
        self._held: set[int] = set()
        self._zookeeper_held = False
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._start = 0.0

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self._start:6.1f}s {text}"
        log.warning("nemesis: %s", line)
        with self._lock:
            self.history.append(line)

    def run(self) -> None:
        """Deal every fault at its moment; returns once the last one has started."""
        self._start = time.monotonic()
        for fault in self.faults:
            delay = self._start + fault.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self._deal, args=(fault,), daemon=True,
                                 name=f"nemesis-{fault.kind}")
            t.start()
            self._threads.append(t)

    def heal(self, timeout_s: float = 180) -> None:
        """Wait for every fault to end (each heals itself), then check all is whole."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:  # the harness, not the cluster: a run that dealt fewer faults is no run
            self.errors.append(f"fault threads still running after {timeout_s:g}s: {stuck}")
        c = self.cluster
        c.start_zookeeper()
        for i in c.ids:
            c.heal(i)
            c.resume(i)
            if not c.alive(i):
                c.restart(i)

    # -- one fault --------------------------------------------------------------------------
    def _deal(self, fault: Fault) -> None:
        try:
            if fault.kind == "zookeeper-restart":
                self._zookeeper(fault)
                return
            broker = self._take(fault)
            if broker is None:
                self.note(f"skipped {fault.kind} {fault.target}: every broker is in a fault")
                return
            try:
                self._on_broker(fault, broker)
            finally:
                with self._lock:
                    self._held.discard(broker)
        except Exception as exc:  # a fault the harness could not deal is a failed run
            self.note(f"ERROR dealing {fault.describe()}: {type(exc).__name__}: {exc}")
            self.errors.append(f"{fault.describe()}: {type(exc).__name__}: {exc}")

    def _candidates(self, fault: Fault) -> list[int]:
        c = self.cluster
        if fault.target == "controller":
            found = c.controller()
            return [found] if found is not None else []
        if fault.target == "leader":
            topic, partition = (self.coordinator if self.coordinator is not None
                                and fault.draw % 2 else (self.topic, fault.draw % self.partitions))
            state = c.state(topic, partition)
            return [state.leader] if state is not None and state.leader > 0 else []
        if fault.target == "bootstrap":
            return [self.bootstrap]
        return list(c.ids)

    def _take(self, fault: Fault) -> int | None:
        wanted = self._candidates(fault)
        with self._lock:
            free = [b for b in self.cluster.ids if b not in self._held]
            chosen = [b for b in wanted if b in free] or free
            if not chosen:
                return None
            broker = chosen[fault.draw % len(chosen)]
            self._held.add(broker)
            return broker

    def _on_broker(self, fault: Fault, b: int) -> None:
        c = self.cluster
        actions: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {
            "kill": (c.kill, c.restart),
            "pause-long": (c.pause, c.resume),
            "pause-short": (c.pause, c.resume),
            "cut-zookeeper": (c.cut_from_zookeeper, c.heal),
            "cut-brokers": (c.cut_from_brokers, c.heal),
        }
        begin, end = actions[fault.kind]
        if not c.alive(b):  # still coming back from an earlier kill's restart
            self.note(f"skipped {fault.kind} of broker {b}: not running")
            return
        aim = "transaction coordinator" if fault.target == "leader" and \
            self.coordinator is not None and fault.draw % 2 else fault.target
        self.note(f"{fault.kind} broker {b} ({aim}) for {fault.duration_s:.1f}s")
        self.dealt += 1
        begin(b)
        time.sleep(fault.duration_s)
        end(b)
        self.note(f"healed {fault.kind} of broker {b}")

    def _zookeeper(self, fault: Fault) -> None:
        with self._lock:
            busy, self._zookeeper_held = self._zookeeper_held, True
        if busy:  # noted outside the lock: note() takes it too
            self.note("skipped zookeeper-restart: ZooKeeper is already down")
            return
        try:
            self.note(f"ZooKeeper stopped for {fault.duration_s:.1f}s")
            self.dealt += 1
            self.cluster.stop_zookeeper()
            time.sleep(fault.duration_s)
            self.cluster.start_zookeeper()
            self.note("ZooKeeper started")
        finally:
            with self._lock:
                self._zookeeper_held = False
