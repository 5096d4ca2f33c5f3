"""``lakelog jobs tier --roll`` against a running server: everything produced so far
reaches Delta now, and the server shows it at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ingest_api.helpers import string
from tests.server import ServerProcess

LAKELOG = Path(sys.executable).parent / "lakelog"
pytestmark = pytest.mark.slow


def test_jobs_tier_roll_tiers_what_was_produced_and_the_server_shows_it(tmp_path: Path) -> None:
    # The server's own jobs are off; API keys on: --roll finds the admin key in the
    # --data-dir it was given (the command runs in another directory).
    server = ServerProcess(tmp_path / "data", env={"LAKELOG_AUTH": "api-key"}).start()
    env = {k: v for k, v in os.environ.items() if k not in ("LAKELOG_API_KEY",
                                                            "LAKELOG_DATA_DIR")}
    env["LAKELOG_SPARK_MASTER"] = "local[1]"
    tier = [str(LAKELOG), "jobs", "tier", "--roll", "--data-dir", str(server.data_dir),
            "--url", server.url]

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)

    key_id, _, secret = (server.data_dir / "security" / "admin.key").read_text().strip() \
        .partition(":")
    try:
        with server.client(auth=(key_id, secret)) as client:
            r = client.post("/topics", json={"topic_name": "orders", "partitions_count": 3})
            assert r.status_code == 201, r.text
            for p in range(3):
                entries = [{"id": str(i), "partition_id": p, "value": string(f"o{p}-{i}")}
                           for i in range(700 if p < 2 else 600)]  # 2,000 in all
                r = client.post("/topics/orders/records:batch", params={"acks": "1"},
                                json={"entries": entries})
                assert r.status_code == 207 and not r.json()["failures"], r.text
            # Without --roll nothing is sealed yet (segment.ms is 10 minutes): nothing tiered.
            plain = run(tier[:3] + tier[4:6])
            assert plain.returncode == 0, plain.stderr[-2000:]
            assert plain.stdout.startswith("tiered 0 records"), plain.stdout
            out = run(tier)
            assert out.returncode == 0, out.stderr[-2000:]
            assert out.stdout.startswith("tiered 2000 records in 3 partition range(s)"), out.stdout
            assert "Delta holds every record produced before the roll" in out.stderr
            parts = client.get("/topics/orders/partitions").json()["data"]
            assert [(d["tiered_offset"], d["high_watermark"]) for d in parts] == [
                (700, 700), (700, 700), (600, 600)]
            unknown = client.post("/topics/nope/segments:roll")
            assert unknown.status_code == 404, unknown.text
            assert "nope" in unknown.json()["message"]
            again = run(tier)
            assert again.returncode == 0 and again.stdout.startswith("tiered 0 records"), (
                again.stdout, again.stderr[-2000:])
        # --roll needs the server: without one it is an error, not a silent no-op.
        server.stop()
        env["LAKELOG_RETRY_TIMEOUT_MS"] = "1000"  # how long the CLI waits for a server to come
        down = run([*tier, "--topic", "orders"])
        assert down.returncode == 1 and "gave up on POST /topics/orders/segments:roll" in \
            down.stderr and len(down.stderr.splitlines()) == 1, down.stderr
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
