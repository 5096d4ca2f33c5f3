"""Cutting a request's records into runs: one partition, one producer identity and
consecutive sequences each, within the partition's batch bound."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pyarrow as pa

from ingest_api.broker.produce.request import ProducerColumns
from ingest_api.broker.produce.runs import Run
from log_tables.hot.producer_state import SEQUENCE_SPACE, seq_add


def cut_runs(batch: pa.RecordBatch, order: np.ndarray, sorted_parts: np.ndarray,
          sizes: np.ndarray, producers: ProducerColumns | None, limit: int) -> list[Run]:
    """The runs of ``batch`` (the valid records in partition order, ``order``): cut where
    the partition or the producer changes or a sequence is not the next, all found over
    the columns at once; a stretch over ``limit`` bytes is cut again by size."""
    breaks = sorted_parts[1:] != sorted_parts[:-1]
    if producers is not None:
        breaks |= ~_joined(producers, order)
    cuts = np.flatnonzero(breaks) + 1
    ends = np.cumsum(sizes[order])
    bounds = [0, *cuts.tolist(), len(order)]
    totals = np.diff(ends[np.array(bounds[1:]) - 1], prepend=0).tolist()
    runs: list[Run] = []
    for (lo, hi), total in zip(pairwise(bounds), totals, strict=True):
        part = int(sorted_parts[lo])
        producer = producers.at(int(order[lo])) if producers is not None else None
        if total <= limit:
            runs.append(Run(part, batch.slice(lo, hi - lo), order[lo:hi], int(total), producer))
            continue
        k = 0  # records of this producer's run before the cut
        for run in split_by_size(part, batch, order[lo:hi], sizes, lo, hi, limit):
            if producer is not None:
                run.producer = (producer[0], producer[1], seq_add(producer[2], k))
            k += len(run.indices)
            runs.append(run)
    return runs


def _joined(producers: ProducerColumns, order: np.ndarray) -> np.ndarray:
    """Whether each record of ``order`` but the first goes in one run with the one before
    it: both without producer fields, or one producer's (id, epoch) and the next sequence."""
    seqs = producers.sequences[order]
    follows = seqs[1:] == (seqs[:-1] + 1) % SEQUENCE_SPACE
    ids, epochs = producers.ids, producers.epochs
    if int(ids.min()) == int(ids.max()) >= 0 and int(epochs.min()) == int(epochs.max()):
        return follows  # type: ignore[no-any-return]  # the usual: one producer's records
    ids, epochs = ids[order], epochs[order]
    has = ids >= 0
    follows &= (ids[1:] == ids[:-1]) & (epochs[1:] == epochs[:-1])
    return np.where(has[1:] & has[:-1], follows, ~has[1:] & ~has[:-1])


def split_by_size(part: int, batch: pa.RecordBatch, idx: np.ndarray, sizes: np.ndarray,
                  lo: int, hi: int, limit: int) -> list[Run]:
    """Cut one partition's records ``batch[lo:hi]`` into runs of at most ``limit`` bytes."""
    run_sizes = sizes[idx]
    total = int(run_sizes.sum())
    if total <= limit:
        return [Run(part, batch.slice(lo, hi - lo), idx, total)]
    runs = []
    cum = np.cumsum(run_sizes)
    start = 0
    while start < len(idx):
        base = cum[start - 1] if start else 0
        stop = int(np.searchsorted(cum, base + limit, side="right"))
        stop = max(stop, start + 1)
        runs.append(Run(part, batch.slice(lo + start, stop - start), idx[start:stop],
                        int(cum[stop - 1] - base)))
        start = stop
    return runs


def _idempotent_runs(part: int, batch: pa.RecordBatch, idx: np.ndarray, sizes: np.ndarray,
                     lo: int, producers: ProducerColumns | Sequence[tuple[int, int, int] | None],
                     limit: int) -> list[Run]:
    """One partition's records ``batch[lo:lo + len(idx)]`` (request positions ``idx``) cut
    into runs as ``plan`` cuts them; ``producers`` of the whole request."""
    if not isinstance(producers, ProducerColumns):
        producers = ProducerColumns.of(producers)
    return cut_runs(batch.slice(lo, len(idx)), idx, np.full(len(idx), part), sizes, producers,
                 limit)


def _next_in_run(run: Run, producer: tuple[int, int, int] | None) -> bool:
    if run.producer is None or producer is None:
        return run.producer is None and producer is None
    next_seq = seq_add(run.producer[2], len(run.indices))
    return run.producer[:2] == producer[:2] and producer[2] == next_seq
