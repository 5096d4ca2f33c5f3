"""The job process's life: it stops cleanly when asked, and leaves at once when its
parent dies, even when the pipe from the parent stays open. Real processes and a
real SIGKILL; Spark is not started here (see tests/ingest_api/test_tiered.py for a
server killed while its job process runs Spark)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction_jobs.scheduler import Intervals, JobProcess
from log_tables.layout import Layout
from tests.server import process_alive

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_a_clean_stop_ends_the_job_process_and_it_leads_its_own_group(tmp_path: Path) -> None:
    jobs = JobProcess(Layout.of(tmp_path / "data"), Intervals(0, 0, 0, 3_600_000), "local[1]")
    jobs.start()
    pid = jobs.pid
    assert pid is not None
    proc = jobs._proc
    assert proc is not None
    try:
        # Its own process group: a Ctrl-C in the server's terminal reaches the server
        # alone (which then stops it cleanly), and it can kill its JVM with itself.
        assert os.getpgid(pid) == pid
    finally:
        jobs.stop()
    assert proc.returncode == 0, "the job process did not end by itself on STOP"


def test_job_process_leaves_when_its_parent_dies_though_its_pipe_stays_open(
        tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-m", "tests.compaction_jobs.jobs_parent_proc",
                               str(tmp_path / "data")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    with parent.stdout:
        job_pid, holder_pid = (int(x) for x in parent.stdout.readline().split())
    try:
        assert process_alive(job_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        # The holder keeps the write end of the job process's stdin open, so no EOF
        # comes: the parent-death signal (and the parent pid check) must end it.
        assert process_alive(holder_pid)
        deadline = time.monotonic() + 30
        while process_alive(job_pid):
            assert time.monotonic() < deadline, f"job process {job_pid} outlived its parent"
            time.sleep(0.05)
    finally:
        for pid in (job_pid, holder_pid):
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
