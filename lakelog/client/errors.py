"""The client's errors, on lakelog's one root (``log_tables.errors.LakelogError``).

An error answer becomes the class its body names (its ``error``), through the table of
``log_tables.errors`` (``class_of(error, error_code)``; the client does not import the
server): a 413 ``record_too_large`` is raised as a ``RecordTooLargeError`` that is also a
``LakelogClientError`` (with the answer's status, name, message and code). The errors of
the log, the groups and a cluster (``DOMAIN_ERRORS``) are typed; those of a request's
form, security and look-ups are ``LakelogClientError`` read by their name. ``retriable``
is what the body says; an answer without one (a proxy's 502, an older server) is
retriable when its status says "busy" or "unavailable" (``RETRIABLE_STATUS``).
"""

from __future__ import annotations

from typing import Any, cast

import httpx

from lakelog.client.structs import TopicPartition
from log_tables import errors as e

RETRIABLE_STATUS = frozenset({429, 502, 503, 504})
"""Statuses that mean "try again" in an answer whose body does not say (not lakelog's)."""
_BODY_FIELDS = frozenset({"error_code", "error", "message", "retriable"})
_TYPED_BY_NAME: dict[str, type[e.LakelogError]] = {}
for _cls in e.DOMAIN_ERRORS:
    _TYPED_BY_NAME.setdefault(_cls.code, _cls)
SHARED_NAME_CODES: dict[tuple[str, int], type[e.LakelogError]] = {
    ("unknown_topic_or_partition", 40402): e.UnknownPartitionError,
    ("fenced_leader_epoch", 40901): e.IsrFencedError,
}
"""The classes of a name two classes share, by the ``error_code`` the server answers the
second with (the first is the name's own): the one thing of the server's codes the client
knows (a test holds it to the server's)."""


def class_of(error: str | None, error_code: int | None = None) -> type[e.LakelogError]:
    """The table's class an error body names; ``LakelogError`` for a name the client does
    not type (or does not know)."""
    shared = SHARED_NAME_CODES.get((error or "", error_code or 0))
    return shared or _TYPED_BY_NAME.get(error or "", e.LakelogError)


class LakelogClientError(e.LakelogError):
    """An error answer of the server: HTTP status, error name and message (and the
    body's ``error_code``, e.g. 41301). ``retriable``: trying again later can succeed
    (the server was busy or unavailable), as the answer said."""

    def __init__(self, status: int, error: str, message: str,
                 error_code: int | None = None, retriable: bool | None = None) -> None:
        # Not super(): a typed error also derives from a server error class, whose
        # __init__ takes that error's own fields.
        e.LakelogError.__init__(self, message)
        self.args = (f"{status} {error}: {message}" if status else message,)
        self.status = status
        self.error = self.code = error
        self.error_code = error_code if error_code is not None else status
        self.retriable = status in RETRIABLE_STATUS if retriable is None else retriable


class LakelogTimeoutError(LakelogClientError):
    """The deadline (``delivery_timeout_ms``, ``default_api_timeout_ms``, ``max_block_ms``)
    passed while the server could not be reached or kept answering "try again". ``status``
    is 0 (no answer counted); the message names the server, the call and what was tried."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "timeout", message, retriable=True)


class LakelogConnectionError(LakelogClientError):
    """The connection broke after a request that must not be sent twice had left, so
    whether the server acted on it is unknown (it was not retried)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_error", message, retriable=True)


class CorruptRecordError(LakelogClientError, e.CorruptRecordError):
    """The records at the position are in a batch whose bytes on the server's disk are
    damaged (410 ``corrupt_record``): they are never served, and polling again cannot
    help. ``consumer.seek(err.topic_partition, err.next_offset)`` skips them (as Kafka's
    consumer asks to seek past a corrupt record); the records before them were served."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        code = body.get("error_code")
        retriable = body.get("retriable")
        super().__init__(status, "corrupt_record", str(body.get("message", "")),
                         code if isinstance(code, int) else None,
                         retriable if isinstance(retriable, bool) else None)
        self.topic: str | None = body.get("topic_name")
        self.partition: int | None = body.get("partition_id")
        self.first_offset: int | None = body.get("first_offset")
        self.last_offset: int | None = body.get("last_offset")
        self.next_offset: int | None = body.get("next_offset")
        """Where the intact records go on: seek here to skip the damaged ones."""
        self.file: str | None = body.get("file")
        self.path = self.file or ""
        self.position = int(body.get("file_position") or 0)
        self.reason = self.message

    @property
    def topic_partition(self) -> TopicPartition:
        assert self.topic is not None and self.partition is not None
        return TopicPartition(self.topic, self.partition)


def _client_class(cls: type[e.LakelogError]) -> type[LakelogClientError]:
    if cls is e.LakelogError:
        return LakelogClientError
    if cls is e.CorruptRecordError:
        return CorruptRecordError
    return cast(type[LakelogClientError], type(
        cls.__name__, (LakelogClientError, cls),
        {"__module__": __name__, "__doc__": cls.__doc__, "__qualname__": cls.__name__}))


# Made once, at import, from the table: per server error class, the client's class that is
# both it and a LakelogClientError, so that ``except RecordTooLargeError`` and ``except
# LakelogClientError`` both catch what the client raises for a 413 record_too_large.
_TYPED = {cls: _client_class(cls) for cls in e.DOMAIN_ERRORS}


def typed(cls: type[e.LakelogError]) -> type[LakelogClientError]:
    """The client's class for a server error class of the table."""
    return _TYPED.get(cls, LakelogClientError)


def error_of(status: int, body: dict[str, Any], text: str = "") -> LakelogClientError:
    """The typed error an error body names (its extra fields become attributes)."""
    code = body.get("error_code")
    code = code if isinstance(code, int) else None
    name = str(body.get("error", "error"))
    cls = typed(class_of(name, code if code is not None else status))
    if cls is CorruptRecordError:
        return CorruptRecordError(status, body)
    retriable = body.get("retriable")
    err = cls(status, name, str(body.get("message", text)), code,
              retriable if isinstance(retriable, bool) else None)
    for field, value in body.items():  # e.g. log_start_offset, high_watermark
        if field not in _BODY_FIELDS and not hasattr(err, field):  # never overwrite
            setattr(err, field, value)
    return err


def error_from(r: httpx.Response) -> LakelogClientError:
    """The error of an answer with status >= 400."""
    try:
        body = r.json()
    except ValueError:
        return LakelogClientError(r.status_code, "error", r.text)
    if not isinstance(body, dict):
        return LakelogClientError(r.status_code, "error", r.text)
    return error_of(r.status_code, body, r.text)


def raise_for(r: httpx.Response) -> None:
    """Raise the answer's error, if it is one."""
    if r.status_code >= 400:
        raise error_from(r)


def entry_error(failure: dict[str, Any]) -> LakelogClientError:
    """The error of one failed entry of a batch answer."""
    code = failure.get("error_code")
    code = code if isinstance(code, int) else 0
    return error_of(code // 100 if code >= 1000 else code, {**failure, "error_code": code})
