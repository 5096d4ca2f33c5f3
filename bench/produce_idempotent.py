"""bench.produce's idempotent case: what an entry with producer fields costs the server
against the same entry without them.

Run by the benchmark as ``python -m bench.produce_idempotent URL TOPIC SECONDS
{plain|idempotent} ACKS {spread|partition}`` (pinned to the client's CPU); prints one
JSON line.

wrk posts one body again and again, which an idempotent server answers as a retry (the
original offsets, nothing appended): not the work of new records. Here each request
carries the next sequences, made from a template with one ``%`` format, so the server
appends every request, in order per producer. ``spread``: each connection is a producer
of its own (``POST /producers``) whose requests hold records of every partition (the
server appends each producer's run alone, where it appends the plain runs of several
requests as one batch). ``partition``: one producer, each connection the records of one
partition (as the ``Producer`` keeps one request in flight per partition): one append a
request either way, so the difference is the producer fields' own cost. The plain case
posts the same entries (keys, values, partitions) without the producer fields.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from urllib.parse import urlsplit

import httpx

PARTITIONS = 8
RECORDS = 1000
CONNECTIONS = 8
KEY_BYTES, VALUE_BYTES = 16, 100


def template(idempotent: bool, producer_id: int, partition: int | None) -> bytes:
    """A ``records:batch`` body of ``RECORDS`` entries; idempotent: a ``%d`` for each
    entry's sequence."""
    entries = []
    for i in range(RECORDS):
        key = base64.b64encode(os.urandom(KEY_BYTES)).decode()
        value = base64.b64encode(os.urandom(VALUE_BYTES)).decode()
        entry = (f'{{"id":"{i}","partition_id":{i % PARTITIONS if partition is None else partition},'
                 f'"key":{{"type":"BINARY","data":"{key}"}},'
                 f'"value":{{"type":"BINARY","data":"{value}"}}')
        if idempotent:
            entry += f',"producer_id":{producer_id},"producer_epoch":0,"sequence":%d'
        entries.append(entry + "}")
    return ('{"entries":[' + ",".join(entries) + "]}").encode()


async def new_producer(url: str) -> int:
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.post("/v3/clusters/lakelog/producers", json={})
        return int(r.json()["producer_id"])


async def connection(url: str, topic: str, acks: str, idempotent: bool, until: float,
                     counts: list[int], partition: int | None, pid: int | None) -> None:
    parts = urlsplit(url)
    if idempotent and pid is None:
        pid = await new_producer(url)
    body = template(idempotent, pid or 0, partition)
    if partition is None:
        offsets = [i // PARTITIONS for i in range(RECORDS)]
        per_request = RECORDS // PARTITIONS
    else:
        offsets, per_request = list(range(RECORDS)), RECORDS
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = (f"POST /v3/clusters/lakelog/topics/{topic}/records:batch?acks={acks} HTTP/1.1\r\n"
            f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n").encode()
    n = 0
    while time.monotonic() < until:
        payload = body % tuple(n * per_request + o for o in offsets) if idempotent else body
        writer.write(head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        header = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in header.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        answer = await reader.readexactly(length)
        if not header.startswith(b"HTTP/1.1 207") or not answer.endswith(b'"failures":[]}'):
            counts[1] += 1
        counts[0] += 1
        n += 1
    writer.close()


async def main(url: str, topic: str, seconds: float, idempotent: bool, acks: str,
               by_partition: bool) -> None:
    counts = [0, 0]  # requests, errors
    shared = await new_producer(url) if idempotent and by_partition else None
    started = time.monotonic()
    await asyncio.gather(*(connection(url, topic, acks, idempotent, started + seconds, counts,
                                      c if by_partition else None, shared)
                           for c in range(CONNECTIONS)))
    elapsed = time.monotonic() - started
    print(json.dumps({"requests": counts[0], "errors": counts[1], "seconds": elapsed,
                      "records": counts[0] * RECORDS}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]),
                     sys.argv[4] == "idempotent", sys.argv[5], sys.argv[6] == "partition"))
