"""What ``lakelog serve`` prints as it starts: its dashboard's address, its SQL
endpoint's state, and the settings not at their default (not all 60)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakelog.cli.serve import start_lines
from lakelog.settings import Settings
from tests.server import ServerProcess


@pytest.mark.slow
def test_serve_prints_its_dashboard_and_sql_endpoint_and_the_settings_it_was_given(
        tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        lines = server.log_path.read_text().splitlines()
    finally:
        server.stop()
    assert f"  dashboard     http://127.0.0.1:{server.port}/ui" in lines, lines
    assert "  SQL endpoint  off (--sql-port 0); `lakelog sql` starts Spark itself" in lines
    shown = [line.strip() for line in lines if line.startswith("    ") and " = " in line]
    # The test server's own: port, auth none, the jobs off, no SQL endpoint, its log level.
    assert f"port = {server.port}" in shown and "auth = none" in shown, shown
    assert "tier_interval_ms = 0" in shown and "sql_port = 0" in shown
    assert f"data_dir = {server.data_dir}" in shown
    assert not any(s.startswith("max_request_head_bytes") for s in shown)  # a default
    assert len(shown) < 15, shown


def test_the_sql_endpoint_line_says_where_it_starts_and_debug_prints_every_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("LAKELOG_")]:
        monkeypatch.delenv(name)  # what other tests of the worker set is not a default
    lines = start_lines(Settings(jdbc_port=10000))
    assert lines[2].startswith("  SQL endpoint  starting (sc://127.0.0.1:15002, JDBC on "
                               "127.0.0.1:10000); its Spark takes 10-20 s"), lines
    assert lines[3] == "  Kafka         off (--kafka-port PORT serves Kafka's protocol)"
    assert [line.strip() for line in lines[5:]] == ["jdbc_port = 10000"]
    every = start_lines(Settings(log_level="debug"))
    assert len(every) - 5 == len(Settings.names()) > 50
