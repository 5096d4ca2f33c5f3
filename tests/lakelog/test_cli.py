from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from log_tables.partition_log import PartitionLog
from tests.log_tables.helpers import append_n

LAKELOG = Path(sys.executable).parent / "lakelog"


def test_version_and_help() -> None:
    out = subprocess.run([LAKELOG, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("lakelog ")
    out = subprocess.run([LAKELOG, "--help"], capture_output=True, text=True, check=True)
    assert "dump-log" in out.stdout


def test_dump_log_shows_batches_and_a_torn_tail(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "p")
    append_n(plog, 5, per_batch=2)
    path = plog.active_segment.path
    plog.close()
    with path.open("ab") as f:
        f.write(b"\x01" * 30)
    out = subprocess.run([LAKELOG, "dump-log", "--records", str(tmp_path / "p")],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("baseOffset:") == 3 and out.count("| offset:") == 5
    assert "stop at position" in out and "30 bytes not readable" in out


def test_dump_log_bad_path_is_one_line_on_stderr(tmp_path: Path) -> None:
    out = subprocess.run([LAKELOG, "dump-log", str(tmp_path / "nope.txt")], capture_output=True,
                         text=True)
    assert out.returncode == 1
    assert out.stderr.strip().startswith("lakelog: error:") and len(out.stderr.strip().splitlines()) == 1
