"""``lakelog produce``, ``consume`` and ``delete-records``: records in and out, as
kafka-console-producer, kafka-console-consumer and kafka-delete-records."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lakelog.cli.root import DEFAULT_URL, Server, Url, admin, app, client_error, options, server
from log_tables.errors import LakelogError

if TYPE_CHECKING:
    from lakelog.client import AdminClient
    from lakelog.console import ConsoleRecord, RecordFormat


PROGRESS_EVERY = 100_000
TopicArg = Annotated[str | None, typer.Argument(metavar="TOPIC",
                                                help="The topic (or --topic TOPIC).")]
TopicOpt = Annotated[str | None, typer.Option("--topic", help="The topic (Kafka's spelling).")]


def _topic(argument: str | None, option: str | None, command: str) -> str:
    if argument and option and argument != option:
        raise LakelogError(f"two topics given ({argument!r} and --topic {option!r}): give one")
    if not (argument or option):
        raise LakelogError(f"give the topic: lakelog {command} TOPIC, or --topic TOPIC")
    return str(argument or option)


@app.command()
def produce(
    topic_arg: TopicArg = None,
    topic: TopicOpt = None,
    separator: Annotated[str | None, typer.Option(
        help="Each line is KEY<separator>VALUE (e.g. --separator ':'; the same as "
             "--property parse.key=true --property key.separator=':'); a line without the "
             "separator is an error. Else the line is the value.")] = None,
    prop: Annotated[list[str] | None, typer.Option(
        "--property", help="parse.key=true|false and key.separator=SEP (default TAB), as "
                           "kafka-console-producer takes them (repeatable).")] = None,
    acks: Annotated[str, typer.Option(help="all, 1 or 0.")] = "all",
    url: Url = DEFAULT_URL,
) -> None:
    """Produce lines from stdin (like kafka-console-producer); a progress line every 100,000
    records on stderr; exit 1 if any record failed, with the reasons."""
    from lakelog.client import LakelogClientError, Producer
    from lakelog.console import PRODUCE_PROPERTIES, LineParser, failure_summary, parse_properties

    name = _topic(topic_arg, topic, "produce")
    parser = LineParser.of(parse_properties(prop or (), PRODUCE_PROPERTIES), separator)
    if acks not in ("all", "1", "0"):
        raise LakelogError(f"--acks {acks!r}: use all, 1 or 0")
    to = server(url)
    failures: list[tuple[int, str, str]] = []
    bad_line: LakelogError | None = None
    sent = 0
    started = time.monotonic()

    def settle(futures: list[Any]) -> None:
        for f in futures:
            exc = f.exception()
            if isinstance(exc, LakelogClientError):
                failures.append((exc.error_code, exc.error, exc.message))
            elif exc is not None:
                failures.append((0, type(exc).__name__, str(exc)))

    wait_ms = max(options.retry_timeout_ms, 1)
    try:
        with Producer(to.url, acks=acks, api_key=to.key.key,  # type: ignore[arg-type]
                      delivery_timeout_ms=wait_ms, max_block_ms=wait_ms) as producer:
            producer.partitions_for(name)
            futures: list[Any] = []
            for number, line in enumerate(sys.stdin, 1):
                try:
                    key, value = parser.parse(line.rstrip("\n"), number)
                except LakelogError as exc:
                    bad_line = exc  # as kafka-console-producer: stop at the line
                    break
                futures.append(producer.send(name, value, key=key))
                sent += 1
                if sent % PROGRESS_EVERY == 0:
                    typer.echo(f"{sent:,} records sent ({sent / (time.monotonic() - started):,.0f}"
                               "/s)", err=True)
                if len(futures) >= 10_000:
                    settle(futures)
                    futures = []
            settle(futures)
    except LakelogClientError as exc:
        raise client_error(exc, to, f"{name}: ") from None
    typer.echo(f"{sent - len(failures):,} records produced to {name}"
               + (f", {len(failures):,} failed:" if failures else ""), err=True)
    for line in failure_summary(failures):
        typer.echo(line, err=True)
    if bad_line is not None:
        raise bad_line
    if failures:
        raise typer.Exit(1)


@app.command()
def consume(
    topic_arg: TopicArg = None,
    topic: TopicOpt = None,
    group: Annotated[str | None, typer.Option(
        help="Read as a member of this consumer group (commits its offsets).")] = None,
    from_beginning: Annotated[bool, typer.Option(
        "--from-beginning", help="Start at the log start (else at the end), when there "
                                 "is no committed offset.")] = False,
    max_records: Annotated[int | None, typer.Option(
        "--max", "--max-messages", min=1, help="Stop after N records.")] = None,
    timeout_ms: Annotated[int | None, typer.Option(
        help="Stop after this long without a record.")] = None,
    print_key: Annotated[bool, typer.Option(
        "--print-key", help="Print KEY<TAB>VALUE (the same as --property print.key=true).")
    ] = False,
    prop: Annotated[list[str] | None, typer.Option(
        "--property", help="print.key, print.value, print.timestamp, print.partition, "
                           "print.offset (true|false) and key.separator=SEP (default TAB), "
                           "as kafka-console-consumer takes them (repeatable).")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Print records as lines (like kafka-console-consumer); without --group it reads every
    partition directly and commits nothing. A topic that does not exist is an error."""
    from lakelog.console import CONSUME_PROPERTIES, RecordFormat, parse_properties

    name = _topic(topic_arg, topic, "consume")
    fmt = RecordFormat.of(parse_properties(prop or (), CONSUME_PROPERTIES), print_key)
    to = server(url)
    with admin(to.url) as client:
        _consume(client, to, name, fmt, group, from_beginning, max_records, timeout_ms)


def _consume(client: AdminClient, to: Server, name: str, fmt: RecordFormat, group: str | None,
             from_beginning: bool, max_records: int | None, timeout_ms: int | None) -> None:
    from dataclasses import replace

    from lakelog.client import LakelogClientError

    partitions = int(client.describe_topic(name)["partitions_count"])
    if fmt.timestamp and any(c["name"] == "message.timestamp.type" and
                             c["value"] == "LogAppendTime" for c in client.describe_configs(name)):
        fmt = replace(fmt, timestamp_type="LogAppendTime")
    count = 0
    idle_since = time.monotonic()
    try:
        for r in _records(client, to, name, partitions, group, from_beginning, max_records):
            if r is None:  # an empty poll
                if timeout_ms is not None and time.monotonic() - idle_since > timeout_ms / 1000:
                    break
                continue
            idle_since = time.monotonic()
            typer.echo(fmt.line(r))
            count += 1
            if max_records is not None and count >= max_records:
                break
    except LakelogClientError as exc:
        raise client_error(exc, to, f"{name}: ") from None
    except KeyboardInterrupt:
        typer.echo(f"{count:,} records consumed", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"{count:,} records consumed", err=True)


def _records(client: AdminClient, to: Server, topic: str, partitions: int, group: str | None,
             from_beginning: bool, limit: int | None) -> Iterator[ConsoleRecord | None]:
    """The topic's records, with None after each empty poll; stops the group consumer
    (commit + leave) when the caller stops. A group member polls no more than ``limit``
    records, so what it commits is what was printed."""
    from datetime import datetime

    from lakelog.client import Consumer, CorruptRecordError
    from lakelog.console import ConsoleRecord

    if group is not None:
        consumer = Consumer(to.url, group, [topic], format="STRING", api_key=to.key.key,
                            auto_offset_reset="earliest" if from_beginning else "latest",
                            default_api_timeout_ms=max(options.retry_timeout_ms, 1))
        left = limit
        try:
            while left is None or left > 0:
                try:
                    records = consumer.poll(timeout_s=0.5, max_records=min(500, left or 500))
                except CorruptRecordError as exc:  # commits what was printed, then says so
                    raise LakelogError(f"{exc.message} (once this consumer has stopped: "
                                       f"lakelog groups skip-corrupt {group})") from None
                for r in records:
                    yield ConsoleRecord(r.partition, r.offset,
                                        round(r.timestamp.timestamp() * 1000), r.key, r.value)
                if left is not None:
                    left -= len(records)
                if not records:
                    yield None
        finally:
            consumer.close()
        return
    spec = "earliest" if from_beginning else "latest"
    positions = {p: client.list_offsets(topic, p, spec) for p in range(partitions)}
    while True:
        got = False
        for p in range(partitions):
            body = client.request("GET", f"/topics/{topic}/partitions/{p}/records?offset="
                                  f"{positions[p]}&format=STRING&max_records=1000")
            for rec in body["records"]:
                got = True
                yield ConsoleRecord(
                    p, rec["offset"],
                    round(datetime.fromisoformat(rec["timestamp"]).timestamp() * 1000),
                    (rec["key"] or {}).get("data"), (rec["value"] or {}).get("data"))
            positions[p] = body["next_offset"]
        if not got:
            time.sleep(0.2)
            yield None


@app.command("delete-records")
def delete_records(
    topic: Annotated[str, typer.Argument(help="The topic.")],
    before: Annotated[list[str], typer.Option(
        help="PARTITION=OFFSET: delete the partition's records below OFFSET (-1: all); "
             "repeatable.")],
    url: Url = DEFAULT_URL,
) -> None:
    """Kafka's DeleteRecords through the server: move log starts forward."""
    partitions = []
    for item in before:
        p, sep, offset = item.partition("=")
        if not sep or not p.strip().isdigit() or not offset.strip().lstrip("-").isdigit():
            raise LakelogError(f"--before {item!r}: expected PARTITION=OFFSET, e.g. 0=1500")
        partitions.append((int(p), int(offset)))
    with admin(url) as client:
        deleted = client.delete_records(topic, partitions)
    for part in deleted:
        typer.echo(f"{topic}-{part['partition_id']}: log start offset {part['low_watermark']}")

