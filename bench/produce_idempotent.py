"""bench.produce's idempotent case: what an entry with producer fields costs the server
against the same entry without them.

Run by the benchmark as ``python -m bench.produce_idempotent URL TOPIC SECONDS
{plain|idempotent} ACKS`` (pinned to the client's CPU); prints one JSON line.

wrk posts one body again and again, which an idempotent server answers as a retry (the
original offsets, nothing appended): not the work of new records. Here each connection
is a producer of its own (``POST /producers``) and each of its requests carries the next
sequences of every partition, made from a template with one ``%`` format, so the server
appends every request, in order per producer. The plain case posts the same entries
(keys, values, partitions) without the producer fields, over the same connections.
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


def template(idempotent: bool, producer_id: int) -> bytes:
    """A ``records:batch`` body of ``RECORDS`` entries; idempotent: a ``%d`` for each
    entry's sequence."""
    entries = []
    for i in range(RECORDS):
        key = base64.b64encode(os.urandom(KEY_BYTES)).decode()
        value = base64.b64encode(os.urandom(VALUE_BYTES)).decode()
        entry = (f'{{"id":"{i}","partition_id":{i % PARTITIONS},'
                 f'"key":{{"type":"BINARY","data":"{key}"}},'
                 f'"value":{{"type":"BINARY","data":"{value}"}}')
        if idempotent:
            entry += f',"producer_id":{producer_id},"producer_epoch":0,"sequence":%d'
        entries.append(entry + "}")
    return ('{"entries":[' + ",".join(entries) + "]}").encode()


async def connection(url: str, topic: str, acks: str, idempotent: bool, until: float,
                     counts: list[int]) -> None:
    parts = urlsplit(url)
    pid = 0
    if idempotent:
        async with httpx.AsyncClient(base_url=url) as client:
            r = await client.post("/v3/clusters/lakelog/producers", json={})
            pid = int(r.json()["producer_id"])
    body = template(idempotent, pid)
    offsets = [i // PARTITIONS for i in range(RECORDS)]
    per_request = RECORDS // PARTITIONS
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


async def main(url: str, topic: str, seconds: float, idempotent: bool, acks: str) -> None:
    counts = [0, 0]  # requests, errors
    started = time.monotonic()
    await asyncio.gather(*(connection(url, topic, acks, idempotent, started + seconds, counts)
                           for _ in range(CONNECTIONS)))
    elapsed = time.monotonic() - started
    print(json.dumps({"requests": counts[0], "errors": counts[1], "seconds": elapsed,
                      "records": counts[0] * RECORDS}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]),
                     sys.argv[4] == "idempotent", sys.argv[5]))
