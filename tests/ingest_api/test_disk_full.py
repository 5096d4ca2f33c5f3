"""A full disk, for real: the data directory on a small tmpfs."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from log_tables.hot.hot_reader import PartitionReader
from tests.ingest_api.helpers import fetch_all, string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_is_507_and_nothing_accepted_is_lost(
        small_disk: Path, spawn_server: Callable[..., ServerProcess]) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (1 << 20))  # freed later: the disk fills, then has room again
    server = spawn_server(small_disk / "data")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "fill", "partitions_count": 1,
                                     "configs": [{"name": "segment.bytes", "value": "1048576"}]})
        accepted: list[int] = []
        statuses = []
        for i in range(200):
            r = client.post("/topics/fill/records", json={"value": string(f"{i}:" + "x" * 60_000)})
            statuses.append(r.status_code)
            if r.status_code == 200:
                accepted.append(r.json()["offset"])
            else:
                assert r.status_code == 507, r.text
                body = r.json()
                assert body["error_code"] == 50701 and "hot/fill/0/" in body["message"]
                if statuses.count(507) >= 3:
                    break
        assert 507 in statuses and accepted, statuses
        stored = fetch_all(client, "fill", 0, fmt="STRING")  # reads still served
        assert [r["offset"] for r in stored] == accepted == list(range(len(accepted)))
        assert all(r["value"]["data"].startswith(f"{r['offset']}:") for r in stored)
        ballast.unlink()  # room again: produce goes on at the next offset, nothing skipped
        r = client.post("/topics/fill/records", json={"value": string("after:" + "y" * 1000)})
        assert r.status_code == 200 and r.json()["offset"] == len(accepted), r.text
        accepted.append(r.json()["offset"])
    reader = PartitionReader(small_disk / "data" / "hot" / "fill" / "0")
    assert reader.end_offset() == len(accepted)  # no half-written batch on disk
