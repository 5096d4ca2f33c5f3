"""What ``lakelog produce`` and ``lakelog consume`` read and print, with Kafka's console
properties (``--property NAME=VALUE``): for produce ``parse.key`` and ``key.separator``;
for consume ``print.key``, ``print.value``, ``print.timestamp``, ``print.partition``,
``print.offset`` and ``key.separator``, printed as kafka-console-consumer prints them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_tables.errors import LakelogError

PRODUCE_PROPERTIES = {"parse.key": "false", "key.separator": "\t"}
CONSUME_PROPERTIES = {"print.key": "false", "print.value": "true", "print.timestamp": "false",
                      "print.partition": "false", "print.offset": "false", "key.separator": "\t"}


def parse_properties(items: Iterable[str], known: dict[str, str]) -> dict[str, str]:
    """``NAME=VALUE`` items over the defaults in ``known``; an unknown name is an error."""
    props = dict(known)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LakelogError(f"--property {item!r}: expected NAME=VALUE, e.g. print.key=true")
        if name not in known:
            raise LakelogError(f"--property {name}: not supported here; use "
                               + ", ".join(sorted(known)))
        if name.startswith(("print.", "parse.")) and value.lower() not in ("true", "false"):
            raise LakelogError(f"--property {item!r}: {name} is true or false")
        props[name] = value.lower() if name.startswith(("print.", "parse.")) else value
    return props


@dataclass(frozen=True, slots=True)
class LineParser:
    """Lines of stdin to (key, value): with ``parse.key`` each line must hold the separator
    (as in kafka-console-producer); without it the line is the value."""

    separator: str | None

    @classmethod
    def of(cls, properties: dict[str, str], separator: str | None) -> LineParser:
        if separator is not None:  # lakelog's --separator: parse.key with this separator
            return cls(separator)
        return cls(properties["key.separator"] if properties["parse.key"] == "true" else None)

    def parse(self, line: str, number: int) -> tuple[str | None, str]:
        if self.separator is None:
            return None, line
        key, sep, value = line.partition(self.separator)
        if not sep:
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise LakelogError(f"line {number} has no key separator {self.separator!r}: "
                               f"{shown!r} (each line is KEY{self.separator}VALUE)")
        return key, value

    def parse_many(self, lines: list[str], first_number: int
                   ) -> tuple[list[tuple[str | None, str]], LakelogError | None]:
        """``parse`` of many lines (numbered from ``first_number``) without a call per
        line: the records of the lines before the first bad one, and its error."""
        if self.separator is None:
            return [(None, line) for line in lines], None
        split = [line.partition(self.separator) for line in lines]
        bad = next((i for i, (_, sep, _) in enumerate(split) if not sep), None)
        error = None
        if bad is not None:
            try:
                self.parse(lines[bad], first_number + bad)
            except LakelogError as exc:
                error = exc
            split = split[:bad]
        return [(key, value) for key, _, value in split], error


class ConsoleRecord(NamedTuple):
    partition: int
    offset: int
    timestamp_ms: int
    key: Any
    value: Any


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """One line per record: [CreateTime:ts] [Partition:p] [Offset:o] [key] [value], joined
    by ``key.separator``; a null key or value prints as ``null`` (Kafka's output)."""

    key: bool
    value: bool
    timestamp: bool
    partition: bool
    offset: bool
    separator: str
    timestamp_type: str = "CreateTime"

    @classmethod
    def of(cls, properties: dict[str, str], print_key: bool) -> RecordFormat:
        def on(name: str) -> bool:
            return properties[name] == "true"
        return cls(print_key or on("print.key"), on("print.value"), on("print.timestamp"),
                   on("print.partition"), on("print.offset"), properties["key.separator"])

    def lines(self, batch: pa.RecordBatch) -> bytes | None:
        """``line`` of every record of ``batch`` (Kafka's columns, as ``poll_batch`` gives
        them), each ending in a newline, as one bytes object made by pyarrow in bulk.
        None when a key or value printed is not UTF-8: the caller then prints those
        records one by one (as ``line`` shows them)."""
        cells: list[pa.Array] = []
        if self.timestamp:
            ms = pc.divide(pc.cast(batch.column("timestamp"), pa.int64()), 1000)
            cells.append(_prefixed(f"{self.timestamp_type}:", ms))
        if self.partition:
            cells.append(_prefixed("Partition:", batch.column("partition")))
        if self.offset:
            cells.append(_prefixed("Offset:", batch.column("offset")))
        for on, name in ((self.key, "key"), (self.value, "value")):
            if on:
                try:
                    text = pc.cast(batch.column(name), pa.string())
                except pa.ArrowInvalid:
                    return None
                cells.append(pc.fill_null(text, "null"))
        rows: int = batch.num_rows
        if not cells:
            return b"\n" * rows
        joined = pc.binary_join_element_wise(*cells, self.separator)
        return _concatenated(pc.binary_join_element_wise(joined, "\n", ""))

    def line(self, r: ConsoleRecord) -> str:
        cells = []
        if self.timestamp:
            cells.append(f"{self.timestamp_type}:{r.timestamp_ms}")
        if self.partition:
            cells.append(f"Partition:{r.partition}")
        if self.offset:
            cells.append(f"Offset:{r.offset}")
        if self.key:
            cells.append("null" if r.key is None else str(r.key))
        if self.value:
            cells.append("null" if r.value is None else str(r.value))
        return self.separator.join(cells)


def _prefixed(prefix: str, numbers: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(numbers, pa.string()), "")


def _concatenated(strings: pa.Array) -> bytes:
    """The values of a string array without nulls, back to back: its data buffer's span."""
    if not len(strings):
        return b""
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)
    first, last = offsets[strings.offset], offsets[strings.offset + len(strings)]
    data: bytes = strings.buffers()[2][first:last].to_pybytes()
    return data


def failure_summary(errors: Iterable[tuple[int, str, str]]) -> list[str]:
    """Per error code: how many records failed with it and one example message.
    ``errors`` holds (error_code, error name, message) per failed record."""
    errors = list(errors)
    counts = Counter((code, name) for code, name, _ in errors)
    example: dict[tuple[int, str], str] = {}
    for code, name, message in errors:
        example.setdefault((code, name), message)
    return [f"  {n:,} x {name}" + (f" ({code})" if code else "") + f": {example[(code, name)]}"
            for (code, name), n in counts.most_common()]
