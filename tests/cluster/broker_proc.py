"""``lakelog serve`` that SIGKILLs itself right after a controller, replication or
transaction coordinator step.

``python -m tests.cluster.broker_proc STEP serve ARGS...``: the broker runs as usual
until its controller completes STEP (``cluster.controller.step``), or its replication
does (``cluster.replicas.step``), then the process is killed. ``STEP+SECONDS``: the
thread that completed STEP stalls there for SECONDS (the rest of the broker goes on,
answering requests), then the process is killed. A real kill of a real broker; the hook
only picks the moment, since a crash cannot otherwise be aimed between two of the
controller's ZooKeeper writes, or into the moment between two threads' work.

``slow-watches:PREFIX+SECONDS``: nothing is killed; the broker's ZooKeeper watches of the
topics whose names begin with PREFIX are applied SECONDS late (``slow_watches`` says
which): what a loaded machine does to them now and then, aimed, since a slow watch cannot
be produced at will otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cluster import controller, replicas
from cluster.view import ClusterView
from ingest_api.broker.transactions import parts as txn_parts
from lakelog.cli import main as lakelog_main


def slow_watches(prefix: str, seconds: float) -> None:
    """The view's watch thread applies the changes of the topics named ``prefix...`` and
    their partition states ``seconds`` late; a new topic itself comes at once, so that it
    is known while its states are not yet (reads on demand, by other threads, are never
    delayed)."""

    def late(apply: Callable[..., Any], new_too: bool) -> Callable[..., Any]:
        def wrapper(self: ClusterView, name: str, *args: Any) -> Any:
            if name.startswith(prefix) and (new_too or name in self.topics) and \
                    threading.current_thread().name == "cluster-metadata":
                time.sleep(seconds)
            return apply(self, name, *args)
        return wrapper

    ClusterView._apply_topic = late(ClusterView._apply_topic, False)  # type: ignore[method-assign]
    ClusterView._drop_topic = late(ClusterView._drop_topic, True)  # type: ignore[method-assign]
    ClusterView._apply_state = late(ClusterView._apply_state, True)  # type: ignore[method-assign]


def run() -> None:
    target, _, stall = sys.argv[1].partition("+")
    if target.startswith("slow-watches:"):
        slow_watches(target.removeprefix("slow-watches:"), float(stall))
        sys.argv = ["lakelog", *sys.argv[2:]]
        lakelog_main()
        return

    def hook(done: str) -> None:
        if done == target:
            if stall:
                time.sleep(float(stall))
            os.kill(os.getpid(), signal.SIGKILL)

    controller.step_hook = replicas.step_hook = txn_parts.step_hook = hook
    sys.argv = ["lakelog", *sys.argv[2:]]
    lakelog_main()


if __name__ == "__main__":
    run()
