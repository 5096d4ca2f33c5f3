"""Run one job and SIGKILL this process right after one of its steps.

``job_proc.py DATA_DIR JOB STEP [NOW_MS]``. A real kill of a real process; the
hook only picks the moment, since a crash cannot otherwise be aimed at one step
of a multi-step commit.

STEP ``-`` kills nothing: the job runs to its end and prints its report (the tiering
job's committed ranges and conflicts) as one JSON line. ``LAKELOG_WAREHOUSE`` in the
environment sets the warehouse (an ``s3://...`` one reads the AWS variables there);
``LAKELOG_BARRIER=DIR:COUNT:STEP`` makes the job wait after STEP until COUNT processes
have reached it (a marker file each in DIR), so that several jobs really race.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from compaction_jobs import job
from compaction_jobs.compact import CompactJob
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.tier import TierJob
from compaction_jobs.typed import TypedJob
from log_tables.layout import Layout
from log_tables.spark.session import lakelog_session

BARRIER_TIMEOUT_S = 300.0


def wait_for_peers(directory: str, count: int) -> None:
    """Mark this process as arrived, then wait (bounded) until ``count`` have."""
    Path(directory, str(os.getpid())).touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(os.listdir(directory)) < count:
        if time.monotonic() > deadline:
            sys.exit(f"only {len(os.listdir(directory))} of {count} jobs reached the barrier")
        time.sleep(0.05)


def main() -> None:
    data_dir, name, step = sys.argv[1], sys.argv[2], sys.argv[3]
    now_ms = int(sys.argv[4]) if len(sys.argv) > 4 else None
    barrier = os.environ.get("LAKELOG_BARRIER")
    barrier_dir, barrier_count, barrier_step = (barrier.rsplit(":", 2) if barrier
                                                else ("", "0", ""))

    def hook(done: str) -> None:
        if done == barrier_step:
            wait_for_peers(barrier_dir, int(barrier_count))
        if done == step:
            os.kill(os.getpid(), signal.SIGKILL)

    job.step_hook = hook
    warehouse = os.environ.get("LAKELOG_WAREHOUSE") or None
    layout = Layout.of(data_dir, warehouse)
    if name == "typed":  # no Spark: the typed tables' job decodes in this process
        report = TypedJob(layout).run()
        result = {"runs": [[r.partition, r.status, r.detail] for r in report.runs]}
        if step != "-":
            sys.exit(f"the {name} job finished without reaching step {step!r}")
        print(json.dumps(result), flush=True)
        return
    spark = lakelog_session(data_dir, warehouse, master="local[2]",
                            conf={"spark.driver.memory": "512m"})
    if name == "tier":
        report = TierJob(layout).run(spark)
        result = {"tiered": [[r.partition, r.start, r.end] for r in report.tiered],
                  "conflicts": report.conflicts}
    elif name == "compact":
        result = {"runs": len(CompactJob(layout, now_ms=now_ms).run(spark).runs)}
    else:
        result = {"runs": len(OptimizeJob(layout, target_bytes=1 << 30).run(spark).runs)}
    if step != "-":
        sys.exit(f"the {name} job finished without reaching step {step!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
