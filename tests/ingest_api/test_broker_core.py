"""A ``Broker`` runs with no HTTP anywhere: made from its settings in a plain asyncio
loop, started, given a topic, produced to and fetched from through its services, and
stopped cleanly, in a process that never loads fastapi, starlette, httpx, uvicorn or
``ingest_api.http``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import asyncio
    import json
    import sys

    import pyarrow as pa

    from ingest_api.broker.core import Broker
    from ingest_api.broker.produce.request import ProduceRequest
    from ingest_api.settings import ApiSettings


    async def main(data_dir: str) -> None:
        broker = Broker(ApiSettings(data_dir=data_dir, auth="none"))
        await broker.start()
        try:
            meta = broker.manager.create_topic("orders", 1)
            request = ProduceRequest(keys=pa.array([b"k0", None, b"k2"], pa.binary()),
                                     values=pa.array([b"v0", b"v1", None], pa.binary()))
            result = await broker.produce.produce(meta, request, "all")
            assert not result.errors, result.errors
            assert result.offsets.tolist() == [0, 1, 2], result.offsets
            body = json.loads(await broker.fetch.fetch("orders", 0, 1, 10, 1 << 20, 0,
                                                       "STRING"))
            assert [(r["offset"], r["key"], r["value"]) for r in body["records"]] == [
                (1, None, {"type": "STRING", "data": "v1"}),
                (2, {"type": "STRING", "data": "k2"}, None)], body
            assert (body["next_offset"], body["high_watermark"]) == (3, 3), body
            offset, read = await broker.fetch.read("orders", 0, 0, 10, 1 << 20)
            assert offset == 0 and sum(b.records.num_rows for b in read.batches) == 3
        finally:
            await broker.stop()
        http = sorted(m for m in sys.modules
                      if m.split(".")[0] in ("fastapi", "starlette", "httpx", "uvicorn")
                      or m.startswith("ingest_api.http"))
        assert not http, http
        print("stopped cleanly")


    asyncio.run(main(sys.argv[1]))
""")


def test_a_broker_runs_without_http(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(data)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "stopped cleanly"
    partition = data / "hot" / "orders" / "0"
    assert (partition / ".clean-shutdown").exists(), sorted(p.name for p in partition.iterdir())
