"""The client's errors: one root, ``LakelogClientError``, with a ``retriable`` flag."""

from __future__ import annotations

from typing import Any

import httpx

from lakelog.client.structs import TopicPartition


class LakelogClientError(Exception):
    """An error answer of the server: HTTP status, error name and message (and the
    body's ``error_code``, e.g. 41301). ``retriable``: trying again later can succeed
    (the server was busy or unavailable)."""

    retriable = False

    def __init__(self, status: int, error: str, message: str,
                 error_code: int | None = None) -> None:
        super().__init__(f"{status} {error}: {message}" if status else message)
        self.status = status
        self.error = error
        self.message = message
        self.error_code = error_code if error_code is not None else status
        if status in (429, 502, 503, 504, 507):
            self.retriable = True


class LakelogTimeoutError(LakelogClientError):
    """The deadline (``delivery_timeout_ms``, ``default_api_timeout_ms``, ``max_block_ms``)
    passed while the server could not be reached or kept answering "try again". ``status``
    is 0 (no answer counted); the message names the server, the call and what was tried."""

    retriable = True

    def __init__(self, message: str) -> None:
        super().__init__(0, "timeout", message)


class LakelogConnectionError(LakelogClientError):
    """The connection broke after a request that must not be sent twice had left, so
    whether the server acted on it is unknown (it was not retried)."""

    retriable = True

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_error", message)


class CorruptRecordError(LakelogClientError):
    """The records at the position are in a batch whose bytes on the server's disk are
    damaged (410 ``corrupt_record``): they are never served, and polling again cannot
    help. ``consumer.seek(err.topic_partition, err.next_offset)`` skips them (as Kafka's
    consumer asks to seek past a corrupt record); the records before them were served."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        code = body.get("error_code")
        super().__init__(status, "corrupt_record", str(body.get("message", "")),
                         code if isinstance(code, int) else None)
        self.topic: str | None = body.get("topic_name")
        self.partition: int | None = body.get("partition_id")
        self.first_offset: int | None = body.get("first_offset")
        self.last_offset: int | None = body.get("last_offset")
        self.next_offset: int | None = body.get("next_offset")
        """Where the intact records go on: seek here to skip the damaged ones."""
        self.file: str | None = body.get("file")

    @property
    def topic_partition(self) -> TopicPartition:
        assert self.topic is not None and self.partition is not None
        return TopicPartition(self.topic, self.partition)


def error_from(r: httpx.Response) -> LakelogClientError:
    """The error of an answer with status >= 400."""
    try:
        body = r.json()
    except ValueError:
        return LakelogClientError(r.status_code, "error", r.text)
    if not isinstance(body, dict):
        return LakelogClientError(r.status_code, "error", r.text)
    if body.get("error") == "corrupt_record":
        return CorruptRecordError(r.status_code, body)
    code = body.get("error_code")
    return LakelogClientError(r.status_code, str(body.get("error", "error")),
                              str(body.get("message", r.text)),
                              code if isinstance(code, int) else None)


def raise_for(r: httpx.Response) -> None:
    """Raise the answer's error, if it is one."""
    if r.status_code >= 400:
        raise error_from(r)


def entry_error(failure: dict[str, object]) -> LakelogClientError:
    """The error of one failed entry of a batch answer."""
    code = failure.get("error_code")
    code = code if isinstance(code, int) else 0
    return LakelogClientError(code // 100 if code >= 1000 else code,
                              str(failure.get("error", "error")),
                              str(failure.get("message", "")), code)
