"""LocalServer: the server it starts does not outlive the Python process that started
it (a notebook kernel restarted, a script killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server import process_alive

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_a_local_server_stops_cleanly_when_its_python_process_is_killed(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner = subprocess.Popen([sys.executable, "-m", "tests.lakelog.local_server_proc",
                              str(data)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    with owner.stdout:
        line = owner.stdout.readline()
    assert line.strip().isdigit(), f"the script failed: {line!r}"
    server_pid = int(line)
    try:
        assert process_alive(server_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        deadline = time.monotonic() + 60
        while process_alive(server_pid):
            assert time.monotonic() < deadline, "the server outlived the process that started it"
            time.sleep(0.05)
        # It was stopped, not killed: a clean shutdown wrote its marker.
        assert (data / "hot" / "t" / "0" / ".clean-shutdown").exists()
    finally:
        if process_alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
