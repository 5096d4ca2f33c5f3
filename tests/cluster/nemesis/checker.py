"""What a nemesis run counts, from the clients' histories and the logs at the end.

Each figure is a number, and each must be 0 (but ``acknowledged``, ``failed`` and the
longest stretch without an acknowledgement, which describe the run):

- ``lost``: acknowledged records the final logs do not hold;
- ``duplicated``: copies of a value beyond its first in the final logs (every value is
  sent once, by an idempotent producer);
- ``misplaced``: acknowledged records the final log holds at another partition or
  offset than their acknowledgement said, and offsets where a consumer saw another
  value than the log holds (two values at one offset);
- ``out_of_order``: offsets a consumer saw at or below the one it saw before, of the
  same partition while it owned it;
- ``unseen``: acknowledged records no consumer saw once the faults stopped;
- ``commits_backwards``: committed offsets read lower than one read before;
- ``replicas_differ``: partitions whose replicas are not byte-identical below the high
  watermark;
- of the transactional producer, read ``read_committed`` at the end: ``txn_lost``
  (records of a transaction whose commit returned, missing), ``txn_duplicated``,
  ``txn_aborted_seen`` (records of one whose abort returned, seen), ``txn_partial``
  (transactions whose end failed, seen in part: all of one or none must show);
- of the consume-transform-produce process, killed and paused mid-transaction: for each
  record of its input read ``read_committed`` at the end, its outputs read
  ``read_committed``: ``ctp_lost`` (none), ``ctp_duplicated`` (more than one),
  ``ctp_bogus`` (outputs of no committed input: an aborted record read, or a changed
  value), ``ctp_out_of_order`` (an input partition's outputs not in its offsets' order);
- of the Delta tables after tiering (``tables.py``): ``delta_differs`` (records where a
  transactional topic's table and its read_committed log differ: so every figure above
  holds of the tables too) and ``delta_torn`` (a committed transaction's records of one
  topic in part in some version of its table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.harness import stored_batches
from tests.cluster.nemesis.workload import Stretch

FinalLog = dict[int, list[tuple[int, bytes]]]
"""Per partition, (offset, value) from log start to the high watermark."""


@dataclass
class Verdict:
    seed: int
    seconds: float
    acknowledged: int = 0
    failed: int = 0
    unanswered: int = 0
    lost: int = 0
    duplicated: int = 0
    misplaced: int = 0
    out_of_order: int = 0
    unseen: int = 0
    commits_backwards: int = 0
    replicas_differ: int = 0
    transactions: int = 0
    """Transactions that committed (and ``txn_*`` below: what a read_committed reader got
    wrong of them)."""
    txn_lost: int = 0
    txn_duplicated: int = 0
    txn_aborted_seen: int = 0
    txn_partial: int = 0
    txn_offsets_wrong: int = 0
    """Groups whose committed offset is not a transaction that committed (or may have),
    or is below the last that surely did."""
    zombie_commits: int = 0
    """Commits of a producer fenced by a newer instance that were not refused."""
    ctp_transactions: int = 0
    """Transactions the consume-transform-produce process saw committed."""
    ctp_kills_mid_commit: int = 0
    """Its kills that struck between asking for a commit and the answer."""
    ctp_lost: int = 0
    ctp_duplicated: int = 0
    ctp_bogus: int = 0
    ctp_out_of_order: int = 0
    delta_differs: int = 0
    delta_torn: int = 0
    schemas_registered: int = 0
    """Schema versions the registry answered an id for (``schemas``)."""
    schemas_lost: int = 0
    schema_ids_reused: int = 0
    longest_gap_s: float = 0.0
    scheduled: int = 0
    """Faults the seed's schedule drew."""
    dealt: int = 0
    """Faults begun (one drawn for a broker in another fault may be skipped)."""
    faults: list[str] = field(default_factory=list)
    examples: dict[str, list[Any]] = field(default_factory=dict)

    COUNTED = ("lost", "duplicated", "misplaced", "out_of_order", "unseen",
               "commits_backwards", "replicas_differ", "txn_lost", "txn_duplicated",
               "txn_aborted_seen", "txn_partial", "txn_offsets_wrong", "zombie_commits",
               "ctp_lost", "ctp_duplicated", "ctp_bogus", "ctp_out_of_order",
               "delta_differs", "delta_torn", "schemas_lost", "schema_ids_reused")

    @property
    def ok(self) -> bool:
        return all(getattr(self, name) == 0 for name in self.COUNTED)

    def summary(self) -> str:
        counted = ", ".join(f"{name} {getattr(self, name)}" for name in self.COUNTED)
        return (f"seed {self.seed} ({self.seconds:g}s, {self.dealt} of {self.scheduled} "
                f"faults dealt): "
                f"{self.acknowledged} acknowledged, {self.transactions} transactions "
                f"committed, {self.ctp_transactions} consume-transform-produce "
                f"transactions ({self.ctp_kills_mid_commit} kills mid-commit), "
                f"{self.schemas_registered} schemas registered, "
                f"{counted}; {self.failed} failed, "
                f"{self.unanswered} unanswered, longest stretch without an "
                f"acknowledgement {self.longest_gap_s:.1f}s")

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def _example(verdict: Verdict, what: str, text: str) -> None:
    found = verdict.examples.setdefault(what, [])
    if len(found) < 10:
        found.append(text)


def check_records(verdict: Verdict, acked: Mapping[bytes, tuple[int, int]],
                  final: FinalLog, stretches: Sequence[tuple[int, Stretch]]) -> None:
    """Lost, duplicated, misplaced, out of order and unseen, into ``verdict``."""
    where: dict[bytes, list[tuple[int, int]]] = {}
    at: dict[tuple[int, int], bytes] = {}
    for p, records in final.items():
        for offset, value in records:
            where.setdefault(value, []).append((p, offset))
            at[(p, offset)] = value
    verdict.acknowledged = len(acked)
    for value, locations in where.items():
        if len(locations) > 1:
            verdict.duplicated += len(locations) - 1
            _example(verdict, "duplicated", f"{value!r} at {locations}")
    seen: set[bytes] = set()
    for p, stretch in stretches:
        previous = -1
        for offset, value in zip(stretch.offsets, stretch.values, strict=True):
            seen.add(value)
            if offset <= previous:
                verdict.out_of_order += 1
                _example(verdict, "out_of_order", f"partition {p}: {offset} after {previous}")
            previous = offset
            held = at.get((p, offset))
            if held is not None and held != value:
                verdict.misplaced += 1
                _example(verdict, "misplaced", f"a consumer saw {value!r} at {p}/{offset}, "
                                               f"the log holds {held!r}")
    for value, (p, offset) in acked.items():
        locations = where.get(value, [])
        if not locations:
            verdict.lost += 1
            _example(verdict, "lost", f"{value!r} acknowledged at {p}/{offset}, held there: "
                                      f"{at.get((p, offset))!r}")
        elif (p, offset) not in locations:
            verdict.misplaced += 1
            _example(verdict, "misplaced", f"{value!r} acknowledged at {p}/{offset}, held at "
                                           f"{locations}")
        if value not in seen:
            verdict.unseen += 1
            _example(verdict, "unseen", f"{value!r} at {p}/{offset}")


def check_transactions(verdict: Verdict, outcomes: Mapping[str, Mapping[int, str]],
                       per_txn: int, committed_log: FinalLog) -> None:
    """The ``txn_*`` figures: ``outcomes`` per producer label (transaction number ->
    committed | aborted | unknown); ``committed_log``: what read_committed read."""
    seen: dict[tuple[str, int], list[int]] = {}
    for records in committed_log.values():
        for _, value in records:
            name, number, i = value.decode().rsplit("-", 2)
            seen.setdefault((name, int(number)), []).append(int(i))
    for label, by_txn in outcomes.items():
        for n, outcome in by_txn.items():
            got = sorted(seen.pop((label, n), []))
            whole = got == list(range(per_txn))
            if outcome == "committed":
                verdict.transactions += 1
                missing = len(set(range(per_txn)) - set(got))
                verdict.txn_lost += missing
                verdict.txn_duplicated += len(got) - len(set(got))
                if not whole:
                    _example(verdict, "txn_lost", f"{label} transaction {n}: saw {got}")
            elif outcome == "aborted" and got:
                verdict.txn_aborted_seen += len(got)
                _example(verdict, "txn_aborted_seen", f"{label} transaction {n}: saw {got}")
            elif outcome == "unknown" and got and not whole:
                verdict.txn_partial += 1
                _example(verdict, "txn_partial", f"{label} transaction {n}: saw {got}")
    for (who, txn), left in seen.items():  # a transaction the producer never began
        verdict.txn_aborted_seen += len(left)
        _example(verdict, "txn_aborted_seen", f"{who} transaction {txn} (not begun): {left}")


def check_txn_offsets(verdict: Verdict, outcomes: Mapping[str, Mapping[int, str]],
                      committed_offsets: Mapping[str, int | None]) -> None:
    """Each producer's group offset (its transaction numbers) against the outcomes."""
    for label, by_txn in outcomes.items():
        got = committed_offsets.get(label)
        sure = max((n for n, o in by_txn.items() if o == "committed"), default=None)
        maybe = {n for n, o in by_txn.items() if o in ("committed", "unknown")}
        if (got is None and sure is None) or (got in maybe and (sure is None or got >= sure)):
            continue
        verdict.txn_offsets_wrong += 1
        _example(verdict, "txn_offsets_wrong", f"{label}: offset {got}, last committed {sure}")


def check_ctp(verdict: Verdict, inputs: Mapping[tuple[str, int], Sequence[tuple[int, bytes]]],
              outputs: FinalLog) -> None:
    """The ``ctp_*`` figures: ``inputs`` per (topic, partition), its records read
    read_committed; ``outputs``: the output topic read read_committed."""
    from tests.cluster.nemesis.ctp import parse_output

    want = {(t, p, o): v for (t, p), records in inputs.items() for o, v in records}
    got: dict[tuple[str, int, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for records in outputs.values():
        for _, value in records:
            t, p, o, v = parse_output(value)
            got[(t, p, o)] = got.get((t, p, o), 0) + 1
            if want.get((t, p, o)) != v:
                verdict.ctp_bogus += 1
                _example(verdict, "ctp_bogus", f"output {value!r}: input {want.get((t, p, o))!r}")
            if o <= last.get((t, p), -1):
                verdict.ctp_out_of_order += 1
                _example(verdict, "ctp_out_of_order", f"{t}/{p}: {o} after {last[(t, p)]}")
            last[(t, p)] = max(o, last.get((t, p), -1))
    for key in want:
        n = got.get(key, 0)
        if n == 0:
            verdict.ctp_lost += 1
            _example(verdict, "ctp_lost", f"no output of input {key}")
        elif n > 1:
            verdict.ctp_duplicated += n - 1
            _example(verdict, "ctp_duplicated", f"{n} outputs of input {key}")


def check_replicas(verdict: Verdict, data_dirs: Sequence[Path], topic: str,
                   high_watermarks: Mapping[int, int]) -> None:
    """Every replica's batches that begin below the high watermark and at or above the
    log start all hold, byte for byte the same."""
    for p, hw in high_watermarks.items():
        replicas = [stored_batches(d, topic, p) for d in data_dirs]
        low = max((min(r, default=0) for r in replicas), default=0)
        trimmed = [{o: b for o, b in r.items() if low <= o < hw} for r in replicas]
        if any(t != trimmed[0] for t in trimmed[1:]):
            verdict.replicas_differ += 1
            offsets = set(trimmed[0]).union(*trimmed[1:])
            diff = sorted(o for o in offsets if len({t.get(o) for t in trimmed}) > 1)
            _example(verdict, "replicas_differ",
                     f"partition {p}: batches at {diff[:5]} not on every replica, or not equal")
