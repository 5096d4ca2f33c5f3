"""``lakelog produce``, ``consume`` and ``delete-records``: records in and out, as
kafka-console-producer, kafka-console-consumer and kafka-delete-records."""

from __future__ import annotations

import codecs
import gc
import io
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from lakelog.cli.root import DEFAULT_URL, Server, Url, admin, app, client_error, options, server
from log_tables.errors import LakelogError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakelog.client import AdminClient
    from lakelog.console import ConsoleRecord, RecordFormat


READ_CHUNK_BYTES = 1 << 20  # stdin is read up to this much at a time
PROGRESS_AFTER_S = 1.0  # a run shorter than this shows no progress line
PROGRESS_INTERVAL_S = 0.25
GC_THRESHOLDS = (100_000, 50, 1000)
POLL_RECORDS = 10_000
"""Records a group member's poll may bring (its answers are formatted in bulk)."""
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
    """Produce lines from stdin (like kafka-console-producer); on a terminal, a progress
    line on stderr; exit 1 if any record failed, with the reasons."""
    from lakelog.client import LakelogClientError, Producer, Tally
    from lakelog.console import PRODUCE_PROPERTIES, LineParser, failure_summary, parse_properties

    name = _topic(topic_arg, topic, "produce")
    parser = LineParser.of(parse_properties(prop or (), PRODUCE_PROPERTIES), separator)
    if acks not in ("all", "1", "0"):
        raise LakelogError(f"--acks {acks!r}: use all, 1 or 0")
    to = server(url)
    bad_line: LakelogError | None = None
    tally = Tally()
    progress = Progress.on_terminal(
        lambda took: f"{tally.sent:,} records sent, {tally.acked:,} acknowledged "
                     f"({tally.acked / took:,.0f}/s)", stdout_too=True)
    wait_ms = max(options.retry_timeout_ms, 1)
    # Up to max_buffered_records records wait in the producer, a few objects each: at the
    # default thresholds the cyclic GC scans them all again and again (a third of the CPU
    # of a run, measured). Rarer collections still collect what cycles there are.
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with Producer(to.url, acks=acks, api_key=to.key.key,  # type: ignore[arg-type]
                      delivery_timeout_ms=wait_ms, max_block_ms=wait_ms) as producer:
            producer.partitions_for(name)
            for chunk in _line_chunks(sys.stdin):
                # As kafka-console-producer: a bad line ends the input (the lines before
                # it are produced).
                records, bad_line = parser.parse_many(chunk, tally.sent + 1)
                producer.send_many(name, records, tally)
                if progress is not None:
                    progress.show()
                if bad_line is not None:
                    break
            producer.flush()
    except LakelogClientError as exc:
        raise client_error(exc, to, f"{name}: ") from None
    finally:
        if progress is not None:
            progress.clear()
    failures = [(exc.error_code, exc.error, exc.message) if isinstance(exc, LakelogClientError)
                else (0, type(exc).__name__, str(exc)) for exc in tally.failures]
    typer.echo(f"{tally.acked:,} records produced to {name}"
               + (f", {tally.failed:,} failed:" if tally.failed else ""), err=True)
    for line in failure_summary(failures):
        typer.echo(line, err=True)
    if tally.failed > len(failures):
        typer.echo(f"  (the reasons of {tally.failed - len(failures):,} more are not kept)",
                   err=True)
    if bad_line is not None:
        raise bad_line
    if tally.failed:
        raise typer.Exit(1)


def _line_chunks(stream: TextIO) -> Iterator[list[str]]:
    """The lines of ``stream`` (without their newline) in lists: what one read gives, up
    to ``READ_CHUNK_BYTES`` (one split per read, not a call per line; a line typed at a
    terminal goes at once). Decoded and its newlines translated as text-mode stdin's."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None or not hasattr(buffer, "read1"):  # not a file (a test's StringIO)
        reads: Iterator[str] = iter(lambda: stream.read(READ_CHUNK_BYTES), "")
    else:
        decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder(
            stream.encoding or "utf-8")(stream.errors or "strict"), translate=True)
        reads = itertools.chain(
            (decoder.decode(data) for data in iter(lambda: buffer.read1(READ_CHUNK_BYTES), b"")),
            [decoder.decode(b"", final=True)])
    rest = ""
    for text in reads:
        lines = (rest + text).split("\n")
        rest = lines.pop()
        if lines:
            yield lines
    if rest:
        yield [rest]


class Progress:
    """One line on a terminal's stderr, rewritten in place at most every
    ``PROGRESS_INTERVAL_S`` once the run has taken ``PROGRESS_AFTER_S``."""

    def __init__(self, text: Callable[[float], str]) -> None:
        self.text = text
        """The line, given the seconds since the start."""
        self.started = time.monotonic()
        self.shown_at = self.started + PROGRESS_AFTER_S - PROGRESS_INTERVAL_S
        self.shown = False

    @classmethod
    def on_terminal(cls, text: Callable[[float], str], *, stdout_too: bool = False
                    ) -> Progress | None:
        """A progress line if stderr is a terminal (and stdout is not, unless
        ``stdout_too``: records printed there would tear the line); else None."""
        if not sys.stderr.isatty() or (not stdout_too and sys.stdout.isatty()):
            return None
        return cls(text)

    def show(self) -> None:
        now = time.monotonic()
        if now - self.shown_at < PROGRESS_INTERVAL_S:
            return
        self.shown_at = now
        self.shown = True
        sys.stderr.write(f"\r{self.text(max(now - self.started, 1e-9))}\x1b[K")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


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
    isolation_level: Annotated[str, typer.Option(
        "--isolation-level", help="read_uncommitted (the default) or read_committed: only "
                                  "records of committed transactions, as "
                                  "kafka-console-consumer's option.")] = "read_uncommitted",
    url: Url = DEFAULT_URL,
) -> None:
    """Print records as lines (like kafka-console-consumer); without --group it reads every
    partition directly and commits nothing. A topic that does not exist is an error."""
    if isolation_level not in ("read_uncommitted", "read_committed"):
        raise typer.BadParameter("read_uncommitted or read_committed",
                                 param_hint="--isolation-level")
    from lakelog.console import CONSUME_PROPERTIES, RecordFormat, parse_properties

    name = _topic(topic_arg, topic, "consume")
    fmt = RecordFormat.of(parse_properties(prop or (), CONSUME_PROPERTIES), print_key)
    to = server(url)
    with admin(to.url) as client:
        _consume(client, to, name, fmt, group, from_beginning, max_records, timeout_ms,
                 isolation_level)


def _consume(client: AdminClient, to: Server, name: str, fmt: RecordFormat, group: str | None,
             from_beginning: bool, max_records: int | None, timeout_ms: int | None,
             isolation: str = "read_uncommitted") -> None:
    from dataclasses import replace

    from lakelog.client import LakelogClientError

    partitions = int(client.describe_topic(name)["partitions_count"])
    if fmt.timestamp and any(c["name"] == "message.timestamp.type" and
                             c["value"] == "LogAppendTime" for c in client.describe_configs(name)):
        fmt = replace(fmt, timestamp_type="LogAppendTime")
    count = 0
    idle_since = time.monotonic()
    progress = Progress.on_terminal(
        lambda took: f"{count:,} records consumed ({count / took:,.0f}/s)")
    out = sys.stdout.buffer
    try:
        for polled in _polls(client, to, name, partitions, group, from_beginning, max_records,
                             isolation):
            if progress is not None:
                progress.show()
            if not polled:  # an empty poll
                if timeout_ms is not None and time.monotonic() - idle_since > timeout_ms / 1000:
                    break
                continue
            idle_since = time.monotonic()
            if max_records is not None and count + len(polled) > max_records:
                keep = max_records - count
                polled = polled[:keep] if isinstance(polled, list) else polled.slice(0, keep)
            # One write per answer: the lines are made in bulk from the Arrow batch.
            out.write(_lines(fmt, polled))
            out.flush()
            count += len(polled)
            if max_records is not None and count >= max_records:
                break
    except LakelogClientError as exc:
        raise client_error(exc, to, f"{name}: ") from None
    except KeyboardInterrupt:
        if progress is not None:
            progress.clear()
        typer.echo(f"{count:,} records consumed", err=True)
        raise typer.Exit(130) from None
    if progress is not None:
        progress.clear()
    typer.echo(f"{count:,} records consumed", err=True)


def _lines(fmt: RecordFormat, polled: pa.RecordBatch | list[ConsoleRecord]) -> bytes:
    """The lines of what one poll brought, in bulk where the keys and values are text."""
    from lakelog.client.polled import decode
    from lakelog.console import ConsoleRecord

    if isinstance(polled, list):
        return "".join(fmt.line(r) + "\n" for r in polled).encode()
    bulk = fmt.lines(polled)
    if bulk is not None:
        return bulk
    # Keys or values that are not UTF-8: each record as ``line`` prints it.
    return _lines(fmt, [ConsoleRecord(r["partition"], r["offset"],
                                      round(r["timestamp"].timestamp() * 1000),
                                      decode(r["key"], "STRING"), decode(r["value"], "STRING"))
                        for r in polled.to_pylist()])


def _polls(client: AdminClient, to: Server, topic: str, partitions: int, group: str | None,
           from_beginning: bool, limit: int | None, isolation: str = "read_uncommitted"
           ) -> Iterator[pa.RecordBatch | list[ConsoleRecord]]:
    """The topic's records, poll by poll (an empty one after each empty poll): a group
    member's as Arrow batches, a direct read's as records. Stops the group consumer
    (commit + leave) when the caller stops. A group member polls no more than ``limit``
    records, so what it commits is what was printed."""
    from datetime import datetime

    from lakelog.client import Consumer, CorruptRecordError
    from lakelog.console import ConsoleRecord

    if group is not None:
        consumer = Consumer(to.url, group, [topic], format="STRING", api_key=to.key.key,
                            auto_offset_reset="earliest" if from_beginning else "latest",
                            default_api_timeout_ms=max(options.retry_timeout_ms, 1),
                            isolation_level=isolation)  # type: ignore[arg-type]
        left = limit
        try:
            while left is None or left > 0:
                try:
                    batch = consumer.poll_batch(
                        timeout_s=0.5, max_records=min(POLL_RECORDS, left or POLL_RECORDS))
                except CorruptRecordError as exc:  # commits what was printed, then says so
                    raise LakelogError(f"{exc.message} (once this consumer has stopped: "
                                       f"lakelog groups skip-corrupt {group})") from None
                if left is not None:
                    left -= batch.num_rows
                yield batch
        finally:
            consumer.close()
        return
    spec = "earliest" if from_beginning else "latest"
    positions = {p: client.list_offsets(topic, p, spec) for p in range(partitions)}
    while True:
        got = False
        for p in range(partitions):
            body = client.request("GET", f"/topics/{topic}/partitions/{p}/records?offset="
                                  f"{positions[p]}&format=STRING&max_records=1000"
                                  f"&isolation_level={isolation}")
            records = [ConsoleRecord(
                p, rec["offset"],
                round(datetime.fromisoformat(rec["timestamp"]).timestamp() * 1000),
                (rec["key"] or {}).get("data"), (rec["value"] or {}).get("data"))
                for rec in body["records"]]
            if records:
                got = True
                yield records
            positions[p] = body["next_offset"]
        if not got:
            time.sleep(0.2)
            yield []


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

