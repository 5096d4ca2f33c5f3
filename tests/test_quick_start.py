"""The README's quick start on a fresh venv: ``pip install`` of the checkout, no extras,
then ``lakelog serve`` and ``lakelog sql``. Whatever ``serve`` starts (the SQL endpoint
and its Spark Connect classes) must be installed by that one command: a dependency
missing from pyproject.toml's core list fails here, where the developers' venv (with
the dev extras) would hide it.

It downloads nothing it need not: pip's cache serves the wheels (PySpark's is 450 MB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakelog.endpoint.state import read_state
from lakelog.local import free_port
from tests.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
INSTALL_S = 480.0
READY_S = 240.0

pytestmark = pytest.mark.slow


def _checkout(to: Path) -> Path:
    """The files a clone would have (and new ones not yet committed), without the
    working tree's build output, venv and data."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def _clean_env(venv: Path) -> dict[str, str]:
    """This machine's environment, less what ties a process to the tests' venv or
    settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKELOG_", "PYTEST"))
           and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_pip_install_without_extras_then_serve_and_lakelog_sql(tmp_path: Path) -> None:
    source, venv = _checkout(tmp_path / "lakelog"), tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _clean_env(venv)
    started = time.monotonic()
    installed = subprocess.run(
        # --no-compile: byte-compiling PySpark's 2,000 modules is not what is tested
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
         "--disable-pip-version-check", str(source)],
        env=env, capture_output=True, text=True, timeout=INSTALL_S)
    assert installed.returncode == 0, installed.stderr[-3000:]
    print(f"pip install took {time.monotonic() - started:.0f} s")
    lakelog = venv / "bin" / "lakelog"

    server = ServerProcess(tmp_path / "data")
    server.command = [str(lakelog)]
    sql_port = free_port()
    server.env = {**env, "LAKELOG_AUTH": "none", "LAKELOG_TIER_INTERVAL_MS": "0",
                  "LAKELOG_SQL_PORT": str(sql_port), "LAKELOG_SQL_MASTER": "local[1]"}
    server.start(timeout_s=60)
    try:
        deadline = time.monotonic() + READY_S
        while (state := read_state(server.data_dir)) is None or state["state"] != "ready":
            assert state is None or state["state"] != "failed", (state, server.log())
            assert time.monotonic() < deadline, (state, server.log())
            time.sleep(0.2)
        print(f"the SQL endpoint ready {time.monotonic() - started:.0f} s after the install began")
        done = subprocess.run(
            [str(lakelog), "sql", "--data-dir", str(server.data_dir), "--json",
             "SELECT 6 * 7 AS n"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"n": 42}
        assert "starting Spark in this process" not in done.stderr  # the endpoint answered
        assert "starting it again" not in server.log_path.read_text(errors="replace")
    finally:
        server.stop(timeout_s=60)
