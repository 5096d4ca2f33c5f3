"""Run one job and SIGKILL this process right after one of its steps.

``job_proc.py DATA_DIR JOB STEP [NOW_MS]``. A real kill of a real process; the
hook only picks the moment, since a crash cannot otherwise be aimed at one step
of a multi-step commit.
"""

from __future__ import annotations

import os
import signal
import sys

from compaction_jobs import job
from compaction_jobs.compact import CompactJob
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.tier import TierJob
from log_tables.layout import Layout
from log_tables.spark.session import lakelog_session


def main() -> None:
    data_dir, name, step = sys.argv[1], sys.argv[2], sys.argv[3]
    now_ms = int(sys.argv[4]) if len(sys.argv) > 4 else None

    def hook(done: str) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGKILL)

    job.step_hook = hook
    layout = Layout.of(data_dir)
    spark = lakelog_session(data_dir, master="local[2]", conf={"spark.driver.memory": "512m"})
    if name == "tier":
        TierJob(layout).run(spark)
    elif name == "compact":
        CompactJob(layout, now_ms=now_ms).run(spark)
    else:
        OptimizeJob(layout, target_bytes=1 << 30).run(spark)
    sys.exit(f"the {name} job finished without reaching step {step!r}")


if __name__ == "__main__":
    main()
