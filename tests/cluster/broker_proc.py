"""``lakelog serve`` that SIGKILLs itself right after a controller or replication step.

``python -m tests.cluster.broker_proc STEP serve ARGS...``: the broker runs as usual
until its controller completes STEP (``cluster.controller.step``), or its replication
does (``cluster.replicas.step``), then the process is killed. ``STEP+SECONDS``: the
thread that completed STEP stalls there for SECONDS (the rest of the broker goes on,
answering requests), then the process is killed. A real kill of a real broker; the hook
only picks the moment, since a crash cannot otherwise be aimed between two of the
controller's ZooKeeper writes, or into the moment between two threads' work.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from cluster import controller, replicas
from lakelog.cli import main as lakelog_main


def run() -> None:
    target, _, stall = sys.argv[1].partition("+")

    def hook(done: str) -> None:
        if done == target:
            if stall:
                time.sleep(float(stall))
            os.kill(os.getpid(), signal.SIGKILL)

    controller.step_hook = replicas.step_hook = hook
    sys.argv = ["lakelog", *sys.argv[2:]]
    lakelog_main()


if __name__ == "__main__":
    run()
