"""Arrow answers over HTTP: the media type a request's ``Accept`` asks for them with,
and the ``Lakelog-*`` response headers that carry their paging (what a JSON answer has
in its body: ``ingest_api.broker.arrow_answer.Paging``)."""

from __future__ import annotations

from fastapi.responses import Response

from ingest_api.broker.arrow_answer import ArrowAnswer, Paging

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NEXT_OFFSET = "Lakelog-Next-Offset"
HIGH_WATERMARK = "Lakelog-High-Watermark"
LOG_START_OFFSET = "Lakelog-Log-Start-Offset"
MEMBER_EPOCH = "Lakelog-Member-Epoch"
RECORD_COUNT = "Lakelog-Record-Count"
ARROW_RESPONSE: dict[int | str, dict[str, object]] = {200: {
    "content": {ARROW_STREAM: {}},
    "description": "JSON; with Accept: application/vnd.apache.arrow.stream an Arrow IPC "
                   "stream (Spark's Kafka-source columns), the paging in Lakelog-* headers"}}
_JSON_RANGES = ("application/json", "application/*", "*/*")


def wants_arrow(accept: str | None) -> bool:
    """True when ``accept`` names the Arrow stream type with a quality at least that of
    any range JSON matches (JSON stays the answer to a missing Accept and to ``*/*``)."""
    if not accept or ARROW_STREAM not in accept:
        return False
    arrow_q = 0.0
    json_q = 0.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media == ARROW_STREAM:
            arrow_q = max(arrow_q, q)
        elif media in _JSON_RANGES:
            json_q = max(json_q, q)
    return arrow_q > 0 and arrow_q >= json_q


def paging_headers(paging: Paging) -> dict[str, str]:
    """The ``Lakelog-*`` headers of an answer's paging (the fields it has)."""
    fields = ((NEXT_OFFSET, paging.next_offset), (HIGH_WATERMARK, paging.high_watermark),
              (LOG_START_OFFSET, paging.log_start_offset), (MEMBER_EPOCH, paging.member_epoch),
              (RECORD_COUNT, paging.record_count))
    return {name: str(value) for name, value in fields if value is not None}


def arrow_response(answer: ArrowAnswer) -> Response:
    """An Arrow answer as the HTTP response: the stream, its paging in headers."""
    return Response(answer.body, media_type=ARROW_STREAM,
                    headers=paging_headers(answer.paging))
