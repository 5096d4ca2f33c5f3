"""The floor of bench.produce: the least work any server must do for a produce request.

Run by the benchmark as ``python -m bench.floor_app PORT DIR PARTITIONS``.

Same framework and server setup as the bare endpoint (``bench.bare_app``), same
decoder, and the same answer as lakelog gives, but with only the work the
request itself asks for: decode the body, take the keys and values, partition
by Kafka's murmur2, group the records by partition, append each partition's key
and value bytes to that partition's file (one file per partition, as lakelog's
hot log has) with plain writes, count offsets, and answer with every record's
partition and offset. With ``?acks=all`` the answer waits for an fdatasync of
the files written, shared by the requests waiting at the time (group commit).
It takes what the benchmark sends: keyed records.

What it leaves out is what a log needs to be a log: framing and checksums to
read records back and to recover after a crash, offset and time indexes,
validation of sizes, keys and ids, producer state, metrics. So it is the most a
server in this framework can expect: ``lakelog ÷ floor`` in the benchmark says
how close lakelog comes to it, and ``floor ÷ bare`` how much of the bare
endpoint's rate is left once the request's own work is done.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ingest_api.http.models import BatchRequest, ProduceRecord, Success  # the same answer shape
from ingest_api.http.produce_columns import envelope_bytes
from log_tables.partitioner import partition_for_key, partitions_for_key_array

_batch = msgspec.json.Decoder(BatchRequest)
_record = msgspec.json.Decoder(ProduceRecord)
_encoder = msgspec.json.Encoder()
_id, _key, _value, _data = attrgetter("id"), attrgetter("key"), attrgetter("value"), attrgetter("data")


def _sizes(blobs: list[bytes]) -> list[msgspec.Raw]:
    """Each blob's ``{"type": "BINARY", "size": n}``, each distinct one encoded once."""
    cache: dict[int, msgspec.Raw] = {}

    def raw(n: int) -> msgspec.Raw:
        out = cache.get(n)
        if out is None:
            out = cache[n] = msgspec.Raw(_encoder.encode({"type": "BINARY", "size": n}))
        return out

    return list(map(raw, map(len, blobs)))


class Floor:
    """Partition files, their next offsets, and the group fdatasync."""

    def __init__(self, directory: Path, partitions: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.fds = [os.open(directory / f"{p}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    for p in range(partitions)]
        self.next = np.zeros(partitions, np.int64)
        self.dirty: set[int] = set()
        self.waiters: list[asyncio.Future[None]] = []
        self.syncer: asyncio.Task[None] | None = None
        self.pool = ThreadPoolExecutor(partitions)

    def append_many(self, keys: list[bytes], values: list[bytes], parts: np.ndarray) -> np.ndarray:
        """Write the records partition by partition; their offsets, in request order."""
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=self.partitions)
        lo = 0
        for p, count in enumerate(counts.tolist()):
            if count:
                hi = lo + count
                rows = itemgetter(*order[lo:hi].tolist())
                picked_keys, picked_values = rows(keys), rows(values)
                if count == 1:
                    picked_keys, picked_values = (picked_keys,), (picked_values,)
                os.writev(self.fds[p], [b"".join(picked_keys), b"".join(picked_values)])
                self.dirty.add(p)
                lo = hi
        starts = np.cumsum(counts) - counts
        offsets = np.empty(len(parts), np.int64)
        offsets[order] = (np.arange(len(parts)) - np.repeat(starts, counts)
                          + np.repeat(self.next, counts))
        self.next += counts
        return offsets

    def append_one(self, key: bytes | None, value: bytes | None, p: int) -> int:
        os.write(self.fds[p], (key or b"") + (value or b""))
        self.dirty.add(p)
        offset = int(self.next[p])
        self.next[p] += 1
        return offset

    async def durable(self) -> None:
        """Once an fdatasync that started after this call has covered every file written."""
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        if self.syncer is None:
            self.syncer = asyncio.create_task(self._sync_rounds())
        await future

    async def _sync_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        while self.waiters:
            waiters, self.waiters = self.waiters, []
            fds, self.dirty = [self.fds[p] for p in self.dirty], set()
            await asyncio.gather(*(loop.run_in_executor(self.pool, os.fdatasync, fd) for fd in fds))
            for future in waiters:
                future.set_result(None)
        self.syncer = None


def create_app(floor: Floor) -> FastAPI:
    app = FastAPI()

    @app.post("/v3/clusters/lakelog/topics/{topic}/records:batch")
    async def batch(topic: str, request: Request, acks: str = "all") -> Response:
        entries = _batch.decode(await request.body()).entries
        keys = list(map(_data, map(_key, entries)))
        values = list(map(_data, map(_value, entries)))
        parts = partitions_for_key_array(pa.array(keys, pa.binary()), floor.partitions)
        offsets = floor.append_many(keys, values, parts)
        ids = list(map(_id, entries))
        key_sizes, value_sizes = _sizes(keys), _sizes(values)
        del entries, keys, values
        if acks == "all":
            await floor.durable()
        now = msgspec.Raw(_encoder.encode(datetime.now(UTC)))
        count = len(ids)
        successes = list(map(Success, ids, repeat(200, count), repeat("lakelog", count),
                             repeat(topic, count), parts.tolist(), offsets.tolist(),
                             repeat(now), key_sizes, value_sizes))
        return Response(_encoder.encode({"successes": successes, "failures": []}),
                        status_code=207, media_type="application/json")

    @app.post("/v3/clusters/lakelog/topics/{topic}/records")
    async def single(topic: str, request: Request, acks: str = "all") -> Response:
        record = _record.decode(await request.body())
        key, value = envelope_bytes(record.key), envelope_bytes(record.value)
        if key is None:
            return Response(b'{"error_code":400,"message":"the floor takes keyed records"}',
                            status_code=400, media_type="application/json")
        p = partition_for_key(key, floor.partitions)
        offset = floor.append_one(key, value, p)
        if acks == "all":
            await floor.durable()
        report: dict[str, Any] = {
            "error_code": 200, "cluster_id": "lakelog", "topic_name": topic, "partition_id": p,
            "offset": offset, "timestamp": datetime.now(UTC),
            "key": {"type": "BINARY", "size": len(key or b"")},
            "value": {"type": "BINARY", "size": len(value or b"")}}
        return Response(_encoder.encode(report), media_type="application/json")

    return app


if __name__ == "__main__":
    port, directory, partitions = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    uvicorn.run(create_app(Floor(directory, partitions)), host="127.0.0.1", port=port,
                loop="uvloop", http="httptools", log_level="warning", access_log=False)
