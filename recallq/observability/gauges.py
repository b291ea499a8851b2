"""The state metrics recallq reports, read when Prometheus scrapes: each model's circuit
breaker (Redis), this worker's heartbeat age, and the work waiting across active runs
(Postgres, one cached read). The counters, and the hooks that move them, are
recallq.observability.metrics. These collectors are handed what they read (the breaker, the
work-waiting read of recallq.execution.work, the live workers' count) by the process that
serves them, so observability sits below the stores and coordination that count through it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from recallq.observability import metrics

log = logging.getLogger(__name__)

#: how long the API keeps the result of the work-waiting query: scrapes from several
#: Prometheus servers (or a fast scrape interval) cost one query per this many seconds
CACHE_SECONDS = 5.0


class Breakers(Protocol):
    """What the breaker gauge reads: a model's incident, None while calls go through
    (recallq.coordination.breaker.CircuitBreaker)."""

    def state(self, model: str) -> object | None:
        """The model's incident, None while its calls go through."""
        ...


class BreakerCollector(Collector):
    """`recallq_breaker_open{model}`: 1 while the model's breaker is open or half-open (its
    state is shared in Redis, so every process reports the same value)."""

    def __init__(self, breaker: Breakers, models: Callable[[], Iterable[str]]) -> None:
        self._breaker = breaker
        self._models = models

    def describe(self) -> Iterator[Metric]:
        yield self._family()  # the registry asks this, not collect(), when it is registered

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        try:
            for model in sorted(self._models()):
                family.add_metric([model], 0.0 if self._breaker.state(model) is None else 1.0)
        except RedisError as exc:  # the scrape goes on without it: the gauge's absence shows
            log.warning("recallq_breaker_open left out of this scrape: %s", type(exc).__name__)
            return
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "recallq_breaker_open",
            "1 while the model's circuit breaker is open or half-open (calls paused)",
            labels=["model"],
        )


class WorkerProcessesCollector(Collector):
    """What the processes of one `recallq worker` command counted, summed from their files
    (prometheus-client's multiprocess mode; those of a process that ended stay counted, so a
    counter never goes back), and `recallq_worker_heartbeat_age_seconds`: since the heartbeat
    of the stalest live process last reached Redis (the reaper takes a worker silent for the
    heartbeat TTL for dead)."""

    def __init__(self, directory: str) -> None:
        self._files = MultiProcessCollector(None, directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        for family in self._files.collect():  # type: ignore[no-untyped-call]
            if family.name != metrics.LAST_BEAT:
                yield family
                continue
            age = GaugeMetricFamily(
                "recallq_worker_heartbeat_age_seconds",
                "Seconds since the heartbeat of this worker's stalest process reached Redis",
            )
            if family.samples:
                stalest = min(sample.value for sample in family.samples)
                age.add_metric([], max(0.0, time.time() - stalest))
            yield age


@dataclass(frozen=True)
class WorkCounts:
    """What waits across active runs, by model (recallq.execution.work reads it)."""

    waiting: Mapping[str, float]  # items queued or running
    running: Mapping[str, float]
    runs: Mapping[str, float]  # runs queued or running
    pending_batches: Mapping[str, float]
    pending_requests: Mapping[str, float]


class WorkCollector(Collector):
    """The work waiting across active runs (the autoscaling signal), the batch lane's pending
    batches and the live workers. Three grouped statements: the in-flight items of the active runs
    (the run-and-status index finds them; a dispatch window bounds how many a run has: 0.4 ms
    with 200k items), the active runs and the pending batches, kept for CACHE_SECONDS."""

    def __init__(
        self,
        read: Callable[[], WorkCounts],
        models: Callable[[], Iterable[str]],
        live_workers: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_counts = read
        self._models = models
        self._live_workers = live_workers
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at = -CACHE_SECONDS
        self._families: list[Metric] = []

    def describe(self) -> Iterator[Metric]:
        """The names, without reading anything (asked when the collector is registered)."""
        zero = dict.fromkeys(self._models(), 0.0)
        yield from self._families_of(zero, zero, zero, zero, zero, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._clock() - self._read_at >= CACHE_SECONDS:
                try:
                    self._families = self._read()
                except (SQLAlchemyError, RedisError) as exc:
                    # the rest of the scrape goes on; these gauges are absent until it answers
                    log.warning("work-waiting gauges left out: %s", type(exc).__name__)
                    self._families = []
                self._read_at = self._clock()
            families = list(self._families)
        yield from families

    def _read(self) -> list[Metric]:
        counts = self._read_counts()
        zero = dict.fromkeys(self._models(), 0.0)
        live = None if self._live_workers is None else self._live_workers()
        return self._families_of(
            {**zero, **counts.waiting},
            {**zero, **counts.running},
            {**zero, **counts.runs},
            {**zero, **counts.pending_batches},
            {**zero, **counts.pending_requests},
            live,
        )

    def _families_of(
        self,
        waiting: Mapping[str, float],
        running: Mapping[str, float],
        runs: Mapping[str, float],
        pending_batches: Mapping[str, float],
        pending_requests: Mapping[str, float],
        live: int | None,
    ) -> list[Metric]:
        families: list[Metric] = [
            _by_model(
                "recallq_items_waiting",
                "Items queued or running, of active runs (the autoscaling signal)",
                waiting,
            ),
            _by_model("recallq_items_running", "Items running, of active runs", running),
            _by_model("recallq_runs_active", "Runs queued or running", runs),
            _by_model(
                "recallq_batch_batches_pending",
                "Provider batches not yet applied (building, uploaded, submitted)",
                pending_batches,
            ),
            _by_model(
                "recallq_batch_requests_pending",
                "Requests in provider batches not yet applied",
                pending_requests,
            ),
        ]
        if self._live_workers is not None:
            workers = GaugeMetricFamily(
                "recallq_workers_live", "Workers whose heartbeat is within its TTL"
            )
            if live is not None:
                workers.add_metric([], float(live))
            families.append(workers)
        return families


def _by_model(name: str, documentation: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["model"])
    for model, value in sorted(values.items()):
        family.add_metric([model], float(value))
    return family
