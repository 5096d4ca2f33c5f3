"""``lakelog produce`` at speed: every line lands once, in order per key; a progress line
on a terminal's stderr and nothing on a pipe."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.lakelog.helpers import make_topic, values
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
LAKELOG = Path(sys.executable).parent / "lakelog"


def _env(tmp_path: Path, server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAKELOG_API_KEY", "LAKELOG_URL", "LAKELOG_DATA_DIR")}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "LAKELOG_URL": server.url,
            "LAKELOG_DATA_DIR": str(tmp_path / "no-data-dir")}


def test_produce_lands_every_line_once_in_order_per_key(
        server: ServerProcess, tmp_path: Path) -> None:
    """200,000 keyed lines (more than one read of stdin, several requests in flight) into
    four partitions: exactly 200,000 records, each key's values in line order, each key in
    one partition; on a pipe stderr is only the summary."""
    make_topic(server, "clicks", 4)
    n = 200_000
    lines = "".join(f"user-{i % 97}\t{i}\n" for i in range(n))
    out = subprocess.run([LAKELOG, "produce", "clicks", "--separator", "\t"], input=lines,
                         capture_output=True, text=True, env=_env(tmp_path, server),
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == f"{n:,} records produced to clicks\n"
    stored = {p: values(server, "clicks", p) for p in range(4)}
    assert sum(len(vs) for vs in stored.values()) == n
    by_key: dict[int, list[int]] = defaultdict(list)
    partition_of: dict[int, set[int]] = defaultdict(set)
    for p, vs in stored.items():
        for v in vs:
            assert v is not None
            by_key[int(v) % 97].append(int(v))
            partition_of[int(v) % 97].add(p)
    assert sorted(v for vs in by_key.values() for v in vs) == list(range(n))
    assert all(vs == sorted(vs) for vs in by_key.values()), "a key's order changed"
    assert all(len(ps) == 1 for ps in partition_of.values())


def test_a_progress_line_on_a_terminal_only(server: ServerProcess, tmp_path: Path) -> None:
    """Lines come until the progress line has shown twice, stderr a terminal: a progress
    line is rewritten in place (carriage returns), then cleared before the summary."""
    make_topic(server, "t", 1)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([LAKELOG, "produce", "t"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=follower,
                            env=_env(tmp_path, server))
    os.close(follower)
    assert proc.stdin is not None
    seen = b""
    sent = 0
    try:
        # Lines until the progress line has shown twice (the CLI shows one once its run has
        # taken a second, however slowly it started on a loaded machine).
        ends = time.monotonic() + 60
        while seen.count(b"\r") < 2 and time.monotonic() < ends:
            proc.stdin.write(b"".join(b"r%d\n" % (sent + i) for i in range(500)))
            proc.stdin.flush()
            sent += 500
            if select.select([leader], [], [], 0.05)[0]:
                seen += os.read(leader, 65536)
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while proc.poll() is None or select.select([leader], [], [], 0)[0]:
            assert time.monotonic() < deadline, seen
            if select.select([leader], [], [], 0.05)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:  # the terminal closed with the process
                    break
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    assert proc.returncode == 0, seen
    text = seen.decode()
    assert "records sent" in text and "acknowledged" in text and "\r" in text, text
    assert text.endswith(f"\r\x1b[K{sent:,} records produced to t\r\n"), text[-200:]
    assert len(values(server, "t", 0)) == sent
