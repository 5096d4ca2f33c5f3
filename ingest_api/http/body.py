"""Reading request bodies within bounds, and decoding them with msgspec."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request

from ingest_api.http.errors import ApiError
from ingest_api.http.models import ENVELOPE_TYPES

T = TypeVar("T")


class InFlightBytes:
    """A bound on request bytes being processed at once (429 beyond it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current = 0

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        if self.current and self.current + nbytes > self.limit:
            raise ApiError(429, f"the server is busy: {self.current} request bytes in flight "
                                f"(limit {self.limit}); retry shortly",
                           name="too_many_requests", retry_after_s=1)
        self.current += nbytes
        try:
            yield
        finally:
            self.current -= nbytes


def content_length(request: Request, limit: int) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    try:
        length = int(raw)
    except ValueError:
        raise ApiError(400, f"Content-Length {raw!r} is not a number") from None
    if length > limit:
        raise ApiError(413, f"request body of {length} bytes is over the limit of {limit} bytes",
                       name="request_too_large")
    return length


def require_json(request: Request) -> None:
    """415 unless the body is sent as JSON: ``application/json`` or ``application/*+json``
    (in UTF-8, what JSON is), or with no Content-Type at all (taken as JSON)."""
    raw = request.headers.get("content-type")
    if raw is None:
        return
    media, _, params = raw.partition(";")
    media = media.strip().lower()
    if media == "application/json" or (media.startswith("application/")
                                       and media.endswith("+json")):
        charset = next((v.strip().strip('"').lower() for k, _, v in
                        (p.partition("=") for p in params.split(";"))
                        if k.strip().lower() == "charset"), "utf-8")
        if charset in ("utf-8", "utf8"):
            return
        raise ApiError(415, f"Content-Type {raw!r}: JSON bodies are UTF-8; send "
                            "'application/json' (or charset=utf-8)",
                       name="unsupported_media_type")
    raise ApiError(415, f"Content-Type {raw!r} is not JSON: send the body as "
                        "'Content-Type: application/json'", name="unsupported_media_type")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body (415 unless it is JSON), or 413 as soon as it passes ``limit`` bytes."""
    require_json(request)
    content_length(request, limit)
    return b"".join([chunk async for chunk in chunks(request, limit)])


TOO_DEEP = "malformed JSON: nested deeper than the server decodes (about 1,000 levels)"


def not_utf8(offset: int, exc: UnicodeDecodeError) -> ApiError:
    """400 for bytes that are not UTF-8, naming the first bad byte's offset in the body."""
    bad = exc.object[exc.start:exc.start + 1].hex()
    return ApiError(400, f"malformed JSON: byte {offset} (0x{bad}) is not UTF-8 ({exc.reason}); "
                         "JSON text must be UTF-8 (RFC 8259)", name="malformed_json")


def _not_utf8_body(body: bytes | msgspec.Raw) -> ApiError:
    try:
        bytes(memoryview(body)).decode()  # an entry of a batch comes as msgspec.Raw
    except UnicodeDecodeError as exc:
        return not_utf8(exc.start, exc)
    # msgspec found a string that is not UTF-8, which the whole body then is not either.
    return ApiError(400, "malformed JSON: a string is not UTF-8", name="malformed_json")


def decode(body: bytes | msgspec.Raw, decoder: msgspec.json.Decoder[T],
           shape_status: int = 422) -> T:
    """Decode a body: malformed JSON is 400, a missing body or a wrong shape
    ``shape_status`` (422 where Confluent's operation says so: produce; 400 where it
    documents no 422: the admin operations), bytes that are not base64 400 (as Confluent's
    examples answer them), each naming where."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Invalid base64"):
            raise ApiError(400, f"invalid request body: {exc}: BINARY data and header values "
                                "are base64 (RFC 4648)", name="invalid_base64") from None
        raise ApiError(shape_status, f"invalid request body: {exc}{_envelope_hint(str(exc))}",
                       name="invalid_request") from None
    except msgspec.DecodeError as exc:
        if not bytes(memoryview(body)).strip():
            raise ApiError(shape_status, "the request body is empty: it is required",
                           name="empty_body") from None
        raise ApiError(400, f"malformed JSON: {exc}", name="malformed_json") from None
    except UnicodeDecodeError:  # msgspec raises it for a string (or key) that is not UTF-8
        raise _not_utf8_body(body) from None
    except RecursionError:
        raise ApiError(400, TOO_DEEP, name="malformed_json") from None


ENVELOPE_AT = re.compile(r"- at `\$[^`]*\.(key|value)(\.type)?`$")
"""Where a key's or value's envelope (or its ``type``) is wrong, in msgspec's message."""


def _envelope_hint(message: str) -> str:
    """What a key or value looks like, for an error in one (an unknown ``type`` above all:
    the valid ones are listed)."""
    if ENVELOPE_AT.search(message) is None:
        return ""
    return (f"; a key or value is {{\"type\": T, \"data\": ...}} with T one of "
            f"{', '.join(ENVELOPE_TYPES)}")


async def decode_request(request: Request, decoder: msgspec.json.Decoder[T], limit: int,
                         shape_status: int = 422) -> T:
    return decode(await read_body(request, limit), decoder, shape_status)


class ObjectStream:
    """Splits a stream of concatenated JSON objects (``{..}{..}`` or one per line).

    Each complete object is returned as its own bytes, to be decoded with a typed
    decoder. An unfinished object waits for more data; at the end of the stream
    (or past ``max_object_bytes``) it is malformed. ``feed`` returns the objects
    before a malformed one and keeps the error in ``error`` (the stream ends
    there), so that a caller can still answer for the records it has.
    """

    def __init__(self, max_object_bytes: int) -> None:
        self.max_object_bytes = max_object_bytes
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._json = json.JSONDecoder()
        self._count = 0  # objects returned so far
        self._fed = 0  # bytes fed so far
        self.error: ApiError | None = None

    def feed(self, chunk: bytes, final: bool = False) -> list[bytes]:
        if self.error is not None:
            return []
        bad: ApiError | None = None
        try:
            self._buf += self._text.decode(chunk, final)
        except UnicodeDecodeError as exc:
            # ``exc.object`` is the bytes held back from the last chunk and this one: the
            # objects before the bad byte are still returned, then the stream ends.
            bad = not_utf8(self._fed + len(chunk) - len(exc.object) + exc.start, exc)
            self._buf += exc.object[:exc.start].decode()
            final = False
        self._fed += len(chunk)
        out: list[bytes] = []
        pos = 0
        buf = self._buf
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos >= len(buf):
                break
            index = self._count + len(out)  # of the record in the request
            try:
                _, end = self._json.raw_decode(buf, pos)
            except RecursionError:
                self.error = ApiError(400, f"record {index}: {TOO_DEEP}", name="malformed_json")
                break
            except json.JSONDecodeError as exc:
                if final or len(buf) - pos > self.max_object_bytes:
                    self.error = ApiError(400, f"malformed JSON in record {index}: {exc.msg} "
                                               f"(character {exc.pos - pos} of the record)",
                                          name="malformed_json")
                break
            out.append(buf[pos:end].encode())
            pos = end
        self.error = self.error or bad
        self._buf = "" if self.error else buf[pos:]
        self._count += len(out)
        return out


async def chunks(request: Request, limit: int) -> AsyncIterator[bytes]:
    """Body chunks as they arrive, with a running total bounded by ``limit``."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes",
                           name="request_too_large")
        if chunk:
            yield chunk


def as_json(value: Any) -> bytes:
    return msgspec.json.encode(value)
