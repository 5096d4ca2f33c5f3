"""Run the tiering job and SIGKILL this process right after one step (argv[2]).

A real kill of a real process; the hook only picks the moment, since a crash
cannot otherwise be aimed at one step of a multi-step commit.
"""

from __future__ import annotations

import os
import signal
import sys

from compaction_jobs import job, tier
from log_tables.layout import Layout
from log_tables.spark_session import lakelog_session


def main() -> None:
    data_dir, step = sys.argv[1], sys.argv[2]

    def hook(done: str) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGKILL)

    job.step_hook = hook
    layout = Layout.of(data_dir)
    spark = lakelog_session(data_dir, master="local[2]", conf={"spark.driver.memory": "512m"})
    tier.TierJob(layout).run(spark)
    sys.exit(f"the job finished without reaching step {step!r}")


if __name__ == "__main__":
    main()
