"""The baseline of bench.produce: the same framework and decoder, the body discarded.

Run by the benchmark as ``python -m bench.bare_app PORT``.
"""

from __future__ import annotations

import sys

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ingest_api.http.models import BatchRequest, ProduceRecord

app = FastAPI()
_batch = msgspec.json.Decoder(BatchRequest)
_record = msgspec.json.Decoder(ProduceRecord)


@app.post("/v3/clusters/lakelog/topics/{topic}/records:batch")
async def batch(topic: str, request: Request) -> Response:
    decoded = _batch.decode(await request.body())
    return Response(b'{"entries":%d}' % len(decoded.entries), status_code=207,
                    media_type="application/json")


@app.post("/v3/clusters/lakelog/topics/{topic}/records")
async def single(topic: str, request: Request) -> Response:
    _record.decode(await request.body())
    return Response(b"{}", media_type="application/json")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                log_level="warning", access_log=False)
