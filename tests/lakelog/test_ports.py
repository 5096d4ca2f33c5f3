"""``lakelog.ports``: the holder of a taken port is named by its pid and its executable's
name (for lakelog, its command), never by its arguments, which may carry secrets; the
line goes into the SQL endpoint's state file, the dashboard and ``cluster up``'s error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lakelog.ports import COMMAND_GROUPS, describe_taken, lakelog_command
from tests.server import LAKELOG, ServerProcess

SECRET = "hunter2"
LISTEN = ("import socket, sys, time\n"
          "s = socket.create_server(('127.0.0.1', 0))\n"
          "print(s.getsockname()[1], flush=True)\n"
          "time.sleep(60)\n")


def test_a_holder_is_named_by_its_pid_and_executable_alone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LISTEN, f"--api-key=llk_a:{SECRET}",
                             f"https://user:{SECRET}@example.com"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        name = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        said = describe_taken("127.0.0.1", port, "the SQL endpoint's Spark Connect")
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert said == f"port {port} (the SQL endpoint's Spark Connect) on 127.0.0.1 is taken " \
        f"by pid {proc.pid} ({name})"
    assert SECRET not in said


@pytest.mark.slow
def test_a_lakelog_holder_is_named_by_its_command_without_arguments(tmp_path: Path) -> None:
    """A real ``lakelog --api-key KEY serve ...`` holding its port."""
    server = ServerProcess(tmp_path / "data")
    server.command = [str(LAKELOG), "--api-key", f"llk_a:{SECRET}"]
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    try:
        said = describe_taken("127.0.0.1", server.port, "broker 1")
    finally:
        server.stop()
    assert said == f"port {server.port} (broker 1) on 127.0.0.1 is taken by pid {pid} " \
        "(lakelog serve)"


def test_lakelog_s_commands_and_modules_are_told_without_their_arguments() -> None:
    venv = "/srv/venv/bin/"
    cases = {
        (f"{venv}python3", f"{venv}lakelog", "serve", "--data-dir", "d"): "lakelog serve",
        (f"{venv}lakelog", "--api-key", f"k:{SECRET}", "cluster", "up", "--brokers", "3"):
            "lakelog cluster up",
        (f"{venv}python3", f"{venv}lakelog", "--api-key", SECRET, "topics", "create",
         SECRET): "lakelog topics create",
        ("python3", "-m", "lakelog", f"--api-key=k:{SECRET}", "sql", SECRET): "lakelog sql",
        ("python3", "-m", "lakelog.endpoint.process", f'{{"key": "{SECRET}"}}'):
            "python3 -m lakelog.endpoint.process",
        ("python3", "-m", "compaction_jobs.scheduler", "{}"):
            "python3 -m compaction_jobs.scheduler",
    }
    for words, said in cases.items():
        assert lakelog_command(list(words)) == said, words
    for other in (["python3", "-m", "http.server", "8000"], ["nginx: master process"],
                  ["/usr/bin/cat", "lakelog"], [""]):
        assert lakelog_command(other) is None, other


def test_the_command_groups_are_the_cli_s() -> None:
    from lakelog.cli import app

    assert {g.name for g in app.registered_groups} == COMMAND_GROUPS
