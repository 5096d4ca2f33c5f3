"""Real processes: a writer killed with SIGKILL, and readers in another process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from log_tables.hot.hot_reader import PartitionReader
from log_tables.hot.partition_log import PartitionLog
from tests.log_tables.helpers import assert_records_match_offsets, read_all

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def start_writer(directory: Path, segment_bytes: int = 20_000, per_batch: int = 20,
                 max_records: int = 10**9) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.log_tables.writer_proc", str(directory),
         str(segment_bytes), str(per_batch), str(max_records)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )


class AckReader:
    """Collects the offsets a writer acknowledged, from its stdout, in a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.last_acked = -1
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("start"):
                self.started.set()
            elif line.strip().isdigit():
                self.last_acked = int(line)


@pytest.mark.parametrize("round_", range(4))
def test_writer_killed_mid_append_loses_nothing_acknowledged(tmp_path: Path, round_: int) -> None:
    rng = random.Random(round_)
    directory = tmp_path / "p"
    acked = -1
    for _ in range(3):  # kill, recover, continue, kill again
        proc = start_writer(directory)
        acks = AckReader(proc)
        assert acks.started.wait(30), "writer did not start"
        deadline = time.monotonic() + 30
        while acks.last_acked <= acked + 50 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        acks.thread.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
        assert acks.last_acked > acked, "no progress between kills"
        acked = acks.last_acked
        plog = PartitionLog.open(directory)
        assert plog.high_watermark >= acked + 1, "an acknowledged batch was lost"
        assert_records_match_offsets(read_all(plog))
        plog.close()


def test_reader_in_another_process_never_sees_a_partial_batch(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    proc = start_writer(directory, segment_bytes=50_000, per_batch=30, max_records=40_000)
    acks = AckReader(proc)
    assert acks.started.wait(30)
    reader = PartitionReader(directory)
    reads = 0
    last_end = 0
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            records = [r for b in reader.batches(0) for r in b.to_records()]
            assert_records_match_offsets(records)
            assert len(records) >= last_end, "the readable end went backwards"
            last_end = len(records)
            end = reader.end_offset()
            assert end >= last_end
            reads += 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        acks.thread.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert reads >= 3, "the reader never overlapped the writer"
    assert last_end > 0
    final = [r for b in reader.batches(0) for r in b.to_records()]
    assert proc.returncode == 0 and len(final) >= 40_000  # the last batch may overshoot
    assert_records_match_offsets(final)
