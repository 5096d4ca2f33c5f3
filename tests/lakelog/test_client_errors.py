"""The client raises the typed error an answer names (from the one error table) and
decides what to retry by the answer's ``retriable``, not by guessing from its status."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from lakelog.client import LakelogClientError, Producer
from lakelog.client.errors import CorruptRecordError, entry_error, error_from, raise_for
from lakelog.client.retry import Attempts, RetryPolicy, call
from log_tables import errors as e
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess


def _answer(status: int, **body: Any) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://x/"))


def test_an_answer_is_raised_as_the_class_it_names() -> None:
    err = error_from(_answer(413, error_code=41301, error="record_too_large", message="big",
                             retriable=False))
    assert isinstance(err, e.RecordTooLargeError) and isinstance(err, LakelogClientError)
    assert (err.status, err.error, err.error_code, err.message) == (
        413, "record_too_large", 41301, "big")
    assert str(err) == "413 record_too_large: big"
    # One code, two classes: the name decides.
    assert isinstance(error_from(_answer(400, error_code=40002, error="invalid_topic",
                                         message="bad name")), e.InvalidTopicError)
    assert isinstance(error_from(_answer(400, error_code=40002, error="topic_already_exists",
                                         message="taken")), e.TopicExistsError)
    out = error_from(_answer(416, error_code=41601, error="offset_out_of_range", message="m",
                             log_start_offset=3, high_watermark=9, retriable=False))
    assert isinstance(out, e.OffsetOutOfRangeError)
    assert (out.log_start_offset, out.high_watermark) == (3, 9)
    corrupt = error_from(_answer(410, error_code=41001, error="corrupt_record", message="m",
                                 topic_name="t", partition_id=0, next_offset=7))
    assert isinstance(corrupt, CorruptRecordError) and isinstance(corrupt, e.CorruptRecordError)
    assert corrupt.next_offset == 7
    entry = entry_error({"id": "1", "error_code": 42901, "error": "queue_full", "message": "m",
                         "retriable": True})
    assert isinstance(entry, e.QueueFullError) and (entry.status, entry.retriable) == (429, True)
    unknown = error_from(_answer(409, error_code=40907, error="security_disabled", message="m"))
    assert type(unknown) is LakelogClientError and unknown.error == "security_disabled"


def test_retriable_comes_from_the_body_and_from_the_status_only_without_one() -> None:
    # The server says: a storage failure may pass, a 503 it calls final does not.
    assert error_from(_answer(500, error_code=50001, error="storage_error", message="i/o",
                              retriable=True)).retriable
    assert not error_from(_answer(503, error_code=503, error="x", message="m",
                                  retriable=False)).retriable
    # A proxy's answer says nothing: its status does.
    gateway = httpx.Response(502, text="Bad Gateway", request=httpx.Request("GET", "http://x/"))
    assert error_from(gateway).retriable
    assert not error_from(_answer(500, error_code=50000, error="internal_error",
                                  message="m", retriable=False)).retriable


def test_call_retries_what_the_answer_calls_retriable() -> None:
    """A storage failure on a call that is not a produce cannot be made on demand on a real
    server here, so the answers are built in the test (the transport is not mocked: the
    send function stands for one attempt)."""
    answers = [_answer(500, error_code=50001, error="storage_error", message="i/o",
                       retriable=True),
               _answer(200, ok=True)]
    sent: list[float] = []

    def send(timeout_s: float) -> httpx.Response:
        sent.append(timeout_s)
        return answers[len(sent) - 1]

    policy = RetryPolicy(retry_backoff_ms=1, retry_backoff_max_ms=1)
    attempts = Attempts(policy, time.monotonic() + 60, "GET /x", "http://x", "deadline")
    assert call(send, attempts, idempotent=False).json() == {"ok": True}
    assert len(sent) == 2
    # Not retriable: the answer comes back at once, even with a "busy" status.
    final = [_answer(503, error_code=503, error="x", message="m", retriable=False)]
    attempts = Attempts(policy, time.monotonic() + 60, "GET /x", "http://x", "deadline")
    assert call(lambda t: final[0], attempts, idempotent=True).status_code == 503
    assert attempts.made == 0


@pytest.mark.slow
def test_a_real_refusal_is_typed(server: ServerProcess) -> None:
    make_topic(server, "t", 1, **{"max.message.bytes": "4096"})
    with Producer(server.url, linger_ms=0) as producer:
        refused = producer.send("t", "x" * 10_000).exception(timeout=60)
    assert isinstance(refused, e.RecordTooLargeError), repr(refused)
    assert isinstance(refused, LakelogClientError) and refused.retriable is False
    with server.client() as c, pytest.raises(e.UnknownTopicError) as missing:
        raise_for(c.get("/topics/nope"))
    assert missing.value.status == 404 and not missing.value.retriable
