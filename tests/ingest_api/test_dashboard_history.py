"""The dashboard's ring buffers (rates and lag) and its cached view of ``_job_runs``:
their bounds and arithmetic, without a server (a real Delta table for the job runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_groups.lag import Bounds, PartitionLag
from ingest_api.broker.metrics import Metrics
from ingest_api.http.dashboard import sampler as sampler_module
from ingest_api.http.dashboard.job_runs_view import JobRunsView
from ingest_api.http.dashboard.sampler import MAX_LAG_SERIES, MAX_POINTS, Sampler
from log_tables.cold import job_runs


class Lags:
    """What ``all_group_lag`` yields at the next sample: (group, topic, partition) -> lag."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now: dict[tuple[str, str, int], int] = {}
        monkeypatch.setattr(sampler_module, "all_group_lag", self._rows)

    def _rows(self, *_: object) -> Iterator[tuple[str, PartitionLag]]:
        for (group, topic, p), lag in sorted(self.now.items()):
            yield group, PartitionLag(topic, p, None, Bounds(0, lag), None)


def sampler(interval_ms: int, clock: list[float]) -> tuple[Sampler, Metrics]:
    metrics = Metrics()
    return Sampler(metrics, None, lambda t, p: None, interval_ms,  # type: ignore[arg-type]
                   clock=lambda: clock[0]), metrics


def test_rates_come_from_the_counters_over_time(monkeypatch: pytest.MonkeyPatch) -> None:
    Lags(monkeypatch)
    clock = [1000.0]
    s, metrics = sampler(1000, clock)
    s.sample()
    metrics.records_in.labels("t").inc(500)
    metrics.bytes_in.labels("t").inc(5000)
    metrics.records_out.labels("t").inc(250)
    clock[0] += 2.0
    s.sample()
    assert s.topic_rates() == {"t": {"records_in_per_s": 250.0, "bytes_in_per_s": 2500.0,
                                     "records_out_per_s": 125.0, "bytes_out_per_s": 0.0}}
    history = s.snapshot()
    assert history["throughput"]["records_in_per_s"] == [None, 250.0]
    assert history["times_ms"] == [1_000_000, 1_002_000]


def test_lag_history_is_bounded_and_keeps_spikes(monkeypatch: pytest.MonkeyPatch) -> None:
    lags = Lags(monkeypatch)
    clock = [0.0]
    s, _ = sampler(500, clock)
    assert s.capacity == 1200  # 10 minutes
    lags.now = {("g", "t", p): 1 for p in range(MAX_LAG_SERIES + 5)}
    s.sample()
    assert len(s.lag) == MAX_LAG_SERIES and s.snapshot()["truncated"]
    lags.now = {("g", "t", 0): 7}
    for i in range(1500):  # more than the ring holds, more points than a snapshot sends
        lags.now[("g", "t", 0)] = 1000 if i == 700 else 7
        clock[0] += 0.5
        s.sample()
    history = s.snapshot()
    assert len(s.times_ms) == 1200 and len(history["times_ms"]) <= MAX_POINTS
    series = history["lag"]["g"]
    assert [x["partition"] for x in series] == [0]  # the others left with the window
    assert 1000 in series[0]["lag"] and len(series[0]["lag"]) == len(history["times_ms"])


def test_job_runs_view_counts_runs_and_shows_the_last(tmp_path: Path) -> None:
    warehouse = str(tmp_path)
    view = JobRunsView(warehouse)
    assert view.snapshot().rows == []  # no table yet
    now = job_runs.now_ms()
    job_runs.record(warehouse, [job_runs.JobRun(
        "tier", "a", "t", p, now - 5000, now - 4000 + p, job_runs.SUCCEEDED) for p in range(3)])
    job_runs.record(warehouse, [
        job_runs.JobRun("tier", "b", "t", 0, now - 1000, now - 900, job_runs.SUCCEEDED),
        job_runs.JobRun("tier", "b", "t", 1, now - 1000, now - 500, job_runs.FAILED,
                        error="OSError: boom")])
    job_runs.record(warehouse, [job_runs.JobRun(  # two hours ago: shown, not counted
        "vacuum", "c", None, None, now - 7_200_000, now - 7_100_000, job_runs.SUCCEEDED)])
    view = JobRunsView(warehouse)
    snap = view.snapshot()
    assert snap.recent == {("tier", "succeeded"): 1, ("tier", "failed"): 1}
    assert snap.last["tier"]["status"] == "failed" and snap.last["tier"]["error"] == "OSError: boom"
    assert snap.last["tier"]["duration_ms"] == 500
    assert snap.last["vacuum"]["duration_ms"] == 100_000
    assert [r["partition"] for r in snap.rows[:2]] in ([0, 1], [1, 0])
    assert len(snap.rows) == 6
    # Cached: a new run shows only after CACHE_S.
    job_runs.record(warehouse, [job_runs.JobRun(
        "compact", "d", "t", 0, now, now + 10, job_runs.SUCCEEDED)])
    assert "compact" not in view.snapshot().last
    view._read_at -= 60
    assert view.snapshot().last["compact"]["status"] == "succeeded"
