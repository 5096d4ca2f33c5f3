"""The nemesis's checks on the Delta tables, once the brokers' job processes (which tiered
under the faults, killed and paused with their brokers) have tiered every record of the
transactional topics: ``delta_differs`` and ``delta_torn`` (see ``checker``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from deltalake import DeltaTable

from log_tables.cold.table import open_table, snapshot
from tests.cluster.nemesis.checker import FinalLog, Verdict, _example


class TxnWriter(NamedTuple):
    """What the table checks need of a ``workload.Transacting``."""

    label: str
    topics: Sequence[str]
    per_txn: int
    outcomes: Mapping[int, str]


def table_path(warehouse: Path, topic: str) -> Path:
    return warehouse / "topics" / topic


def tiered_ends(warehouse: Path, topic: str, partitions: int) -> list[int] | None:
    """Each partition's tiered end (None before the table exists)."""
    dt = open_table(str(table_path(warehouse, topic)))
    return None if dt is None else [s.tiered_offset for s in snapshot(dt, partitions)]


def wait_tiered(warehouse: Path, topic: str, ends: Mapping[int, int],
                wait_for: Callable[[Callable[[], bool], str], object]) -> None:
    def done() -> bool:
        if not any(ends.values()):
            return True
        tiered = tiered_ends(warehouse, topic, len(ends))
        return tiered is not None and all(tiered[p] >= end for p, end in ends.items())

    wait_for(done, f"{topic}'s table tiered to {dict(ends)}")


def table_log(table: Path, version: int | None = None) -> FinalLog:
    """The table (at ``version``) as (offset, value) per partition, in offset order."""
    data = DeltaTable(str(table), version=version).to_pyarrow_table(
        columns=["partition", "offset", "value"])
    out: FinalLog = {}
    for p, o, v in zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(),
                       data.column("value").to_pylist(), strict=True):
        out.setdefault(int(p), []).append((int(o), bytes(v)))
    return {p: sorted(records) for p, records in out.items()}


def check_table(verdict: Verdict, table: Path, log: FinalLog) -> None:
    """``delta_differs``: records in the table and not in ``log`` (read read_committed),
    or the other way."""
    held = {(p, o, v) for p, records in table_log(table).items() for o, v in records}
    want = {(p, o, v) for p, records in log.items() for o, v in records}
    for p, o, v in sorted(held ^ want)[:10]:
        where = "the table, not the log" if (p, o, v) in held else "the log, not the table"
        _example(verdict, "delta_differs", f"{table.name} {p}/{o} {v!r}: in {where}")
    verdict.delta_differs += len(held ^ want)


def check_torn(verdict: Verdict, table: Path, topic: str, writers: Sequence[TxnWriter]) -> None:
    """``delta_torn``: in every version of the table, each transaction that committed (or
    may have) shows all its records of ``topic`` or none."""
    expected = {w.label: {i for i in range(w.per_txn) if w.topics[i % len(w.topics)] == topic}
                for w in writers}
    outcomes: dict[str, Mapping[int, str]] = {w.label: w.outcomes for w in writers}
    last = DeltaTable(str(table)).version()
    for version in range(last + 1):
        seen: dict[tuple[str, int], set[int]] = {}
        for records in table_log(table, version).values():
            for _, value in records:
                who, txn, i = value.decode().rsplit("-", 2)
                seen.setdefault((who, int(txn)), set()).add(int(i))
        for (who, number), got in seen.items():
            outcome = outcomes[who].get(number) if who in outcomes else None
            if outcome != "aborted" and got != expected[who]:
                verdict.delta_torn += 1
                _example(verdict, "delta_torn", f"{topic} version {version}: {who} "
                                                f"transaction {number} shows {sorted(got)}")
