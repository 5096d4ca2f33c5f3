"""The dashboard's history: every ``interval_ms`` the server reads the produce and fetch
counters (``ingest_api.broker.metrics``) and every consumer group's lag into ring buffers of
10 minutes, so that the page shows rates computed over time and lag plots, and a page
refresh only reads what is held here.

Everything is bounded: ``MAX_SAMPLES`` samples, ``MAX_LAG_SERIES`` (group, topic,
partition) series (later ones are left out, and ``truncated`` says so), and what a
snapshot sends is cut to ``MAX_POINTS`` points per series (the largest lag of each
bucket, so a spike is never averaged away).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple

from prometheus_client import Counter

from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.lag import BoundsOf, all_group_lag
from ingest_api.broker.metrics import Metrics

log = logging.getLogger(__name__)

HISTORY_MS = 600_000
MAX_SAMPLES = 1200
MAX_LAG_SERIES = 128
MAX_POINTS = 300
RATE_SPAN_SAMPLES = 5
"""A topic's rate is averaged over the last this many intervals."""

LagKey = tuple[str, str, int]
"""(group, topic, partition)"""


class Counts(NamedTuple):
    """Cumulative counter values (since the server started)."""

    records_in: float = 0.0
    bytes_in: float = 0.0
    records_out: float = 0.0
    bytes_out: float = 0.0

    def per_s(self, before: Counts, seconds: float) -> dict[str, float]:
        """What grew from ``before`` to this, per second."""
        span = max(seconds, 1e-3)
        return {f"{name}_per_s": round(max(0.0, now - then) / span, 3)
                for name, now, then in zip(self._fields, self, before, strict=True)}


def _by_topic(counter: Counter) -> dict[str, float]:
    return {s.labels["topic"]: s.value for family in counter.collect()
            for s in family.samples if s.name.endswith("_total")}


def read_counts(metrics: Metrics) -> dict[str, Counts]:
    """Every topic's produce and fetch counters now."""
    columns = [_by_topic(c) for c in (metrics.records_in, metrics.bytes_in,
                                      metrics.records_out, metrics.bytes_out)]
    topics = set().union(*columns)
    return {t: Counts(*(col.get(t, 0.0) for col in columns)) for t in topics}


def _thin(values: Sequence[int | None], step: int) -> list[int | None]:
    """Every ``step`` values as one: the largest (None when all are)."""
    if step <= 1:
        return list(values)
    out: list[int | None] = []
    for i in range(0, len(values), step):
        present = [v for v in values[i:i + step] if v is not None]
        out.append(max(present) if present else None)
    return out


class Sampler:
    """Ring buffers of rates and lag; ``sample`` runs in a worker thread, ``snapshot``
    in any (one lock between them)."""

    def __init__(self, metrics: Metrics, groups: GroupCoordinator, bounds_of: BoundsOf,
                 interval_ms: int, clock: Callable[[], float] = time.time,
                 refresh: Callable[[], Awaitable[None]] | None = None) -> None:
        self.metrics = metrics
        self.groups = groups
        self.bounds_of = bounds_of
        self.refresh = refresh
        """Called before each sample: brings ``bounds_of`` up to date (in a cluster, asks
        the partitions' leaders)."""
        self.interval_ms = interval_ms
        self.clock = clock
        self.capacity = max(2, min(MAX_SAMPLES, HISTORY_MS // interval_ms))
        self.times_ms: deque[int] = deque(maxlen=self.capacity)
        self.totals: deque[Counts] = deque(maxlen=self.capacity)
        self._recent: deque[tuple[float, dict[str, Counts]]] = deque(
            maxlen=RATE_SPAN_SAMPLES + 1)
        self.lag: dict[LagKey, deque[int | None]] = {}
        self.truncated = False
        self._lock = threading.Lock()

    async def run(self) -> None:
        """Sample every interval until cancelled (a failed sample is logged and skipped)."""
        while True:
            try:
                if self.refresh is not None:
                    await self.refresh()
                await asyncio.to_thread(self.sample)
            except Exception:
                log.exception("sampling rates and lag for the dashboard failed")
            await asyncio.sleep(self.interval_ms / 1000)

    def sample(self) -> None:
        now = self.clock()
        counts = read_counts(self.metrics)
        lag: dict[LagKey, int] = {}
        for group, row in all_group_lag(self.groups, self.bounds_of):
            if row.lag is not None:
                lag[(group, row.topic, row.partition)] = row.lag
        with self._lock:
            self.times_ms.append(int(now * 1000))
            self.totals.append(Counts(*map(math.fsum, zip(*counts.values(), strict=True)))
                               if counts else Counts())
            self._recent.append((now, counts))
            self._add_lag(lag)

    def _add_lag(self, lag: dict[LagKey, int]) -> None:
        for key, series in self.lag.items():
            series.append(lag.pop(key, None))
        truncated = False
        for key, value in sorted(lag.items()):
            if len(self.lag) >= MAX_LAG_SERIES:
                truncated = True
                break
            series = deque([None] * (len(self.times_ms) - 1), maxlen=self.capacity)
            series.append(value)
            self.lag[key] = series
        self.truncated = truncated
        # A group or topic gone for the whole window leaves the plot.
        for key in [k for k, s in self.lag.items() if s[-1] is None and not any(
                v is not None for v in s)]:
            del self.lag[key]

    def topic_rates(self) -> dict[str, dict[str, float]]:
        """Each topic's records and bytes in and out per second, over the last samples."""
        with self._lock:
            if len(self._recent) < 2:
                return {}
            (then, before), (now, after) = self._recent[0], self._recent[-1]
        return {t: c.per_s(before.get(t, Counts()), now - then) for t, c in sorted(after.items())}

    def snapshot(self) -> dict[str, Any]:
        """The history as the page plots it: sample times, total rates, lag series by group."""
        with self._lock:
            times = list(self.times_ms)
            totals = list(self.totals)
            lag = {key: list(series) for key, series in self.lag.items()}
            truncated = self.truncated
        step = max(1, math.ceil(len(times) / MAX_POINTS))
        rates = [totals[i].per_s(totals[i - 1], (times[i] - times[i - 1]) / 1000)
                 for i in range(1, len(times))]
        groups: dict[str, list[dict[str, Any]]] = {}
        for (group, topic, partition), series in sorted(lag.items()):
            groups.setdefault(group, []).append(
                {"topic": topic, "partition": partition, "lag": _thin(series, step)})
        return {
            "interval_ms": self.interval_ms,
            "history_ms": self.capacity * self.interval_ms,
            "times_ms": times[::step],
            "throughput": {name: _thin_rates(rates, name, step)
                           for name in ("records_in_per_s", "records_out_per_s",
                                        "bytes_in_per_s", "bytes_out_per_s")},
            "lag": groups,
            "truncated": truncated,
        }


def _thin_rates(rates: Iterable[dict[str, float]], name: str, step: int) -> list[float | None]:
    """One rate series aligned with the times (the first sample has none), thinned by
    taking the mean of each bucket."""
    values: list[float | None] = [None, *(r[name] for r in rates)]
    out: list[float | None] = []
    for i in range(0, len(values), step):
        present = [v for v in values[i:i + step] if v is not None]
        out.append(round(sum(present) / len(present), 3) if present else None)
    return out
