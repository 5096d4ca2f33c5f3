"""A stand-in for the server: starts the job process, and a second child that keeps
the write end of the job process's stdin open (as a child forked without closing its
fds would), so that the pipe never reports the parent's death. Prints the two pids,
then sleeps until killed.

``python -m tests.compaction_jobs.jobs_parent_proc DATA_DIR``
"""

from __future__ import annotations

import subprocess
import sys
import time

from compaction_jobs.scheduler import Intervals, JobProcess
from log_tables.layout import Layout


def main() -> None:
    # Only upkeep on, and not due for an hour: the job process waits, Spark never starts.
    jobs = JobProcess(Layout.of(sys.argv[1]), Intervals(0, 0, 0, 3_600_000), "local[1]")
    jobs.start()
    assert jobs._proc is not None and jobs._proc.stdin is not None
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                              pass_fds=(jobs._proc.stdin.fileno(),))
    print(jobs.pid, holder.pid, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
