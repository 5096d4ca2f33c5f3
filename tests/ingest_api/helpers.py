from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx

from log_tables.cold_table import STAGE_DIR


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def string(data: str) -> dict[str, str]:
    return {"type": "STRING", "data": data}


def fetch_all(client: httpx.Client, topic: str, partition: int, start: int = 0,
              fmt: str = "BINARY") -> list[dict[str, Any]]:
    """Every record of a partition from ``start`` to the high watermark, over HTTP."""
    out: list[dict[str, Any]] = []
    offset = start
    while True:
        r = client.get(f"/topics/{topic}/partitions/{partition}/records",
                       params={"offset": offset, "max_records": 5000, "format": fmt})
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["records"])
        if body["next_offset"] >= body["high_watermark"]:
            return out
        offset = body["next_offset"]


def locked_inodes() -> set[int]:
    """Inodes of files with a flock held, from /proc/locks (read only: taking a lock to
    probe one could make a starting job fail to take its own)."""
    inodes = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields:
            inodes.add(int(fields[fields.index("FLOCK") + 4].rsplit(":", 1)[1]))
    return inodes


def live_stages(table: Path) -> dict[str, list[str]]:
    """The stage directories of a table whose job is running (its lock is held): job id →
    the files in it. Those of killed jobs stay until a later job cleans them."""
    stage = table / STAGE_DIR
    if not stage.is_dir():
        return {}
    locked = locked_inodes()
    out = {}
    for job in stage.iterdir():
        try:
            if (job / ".lock").stat().st_ino in locked:
                out[job.name] = sorted(f.name for f in job.iterdir() if f.is_file())
        except FileNotFoundError:  # the job finished while we looked
            continue
    return out
