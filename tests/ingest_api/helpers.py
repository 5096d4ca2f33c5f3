from __future__ import annotations

import base64
from typing import Any

import httpx


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
