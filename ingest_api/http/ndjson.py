"""A response of report lines (``application/x-ndjson``) streamed while the request
body is still being read: a produce of concatenated records answers each as it is
acknowledged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response


class NdjsonStream(Response):
    """Streams report lines while the request body is still being read.

    Starlette's StreamingResponse listens for a disconnect by calling receive()
    concurrently, which would steal the body chunks this response reads, so the
    lines are sent with plain ASGI messages instead.
    """

    media_type = "application/x-ndjson"

    def __init__(self, lines: AsyncIterator[bytes]) -> None:
        super().__init__(status_code=200, media_type=self.media_type)
        self.lines = lines

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # No content-length: uvicorn sends the lines with chunked transfer encoding.
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": [(b"content-type", self.media_type.encode())]})
        async for line in self.lines:
            await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def ndjson(reports: AsyncIterator[bytes]) -> Response:
    return NdjsonStream(reports)
