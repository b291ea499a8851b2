"""The state metrics recallq reports, read when Prometheus scrapes: each model's circuit
breaker (Redis), this worker's heartbeat age, and the work waiting across active runs
(Postgres, one cached read). The counters, and the hooks that move them, are recallq.metrics;
these collectors sit above the stores and coordination whose state they read, which in turn
count their events through recallq.metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from redis.exceptions import RedisError
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from recallq import metrics
from recallq.batch_store import PENDING_BATCHES
from recallq.coordination.breaker import CircuitBreaker
from recallq.coordination.liveness import Heartbeat
from recallq.db import Database
from recallq.status import ITEM_IN_FLIGHT, RUN_ACTIVE, ItemStatus
from recallq.tables import Item, ProviderBatch, Run

log = logging.getLogger(__name__)

#: how long the API keeps the result of the work-waiting query: scrapes from several
#: Prometheus servers (or a fast scrape interval) cost one query per this many seconds
CACHE_SECONDS = 5.0


class BreakerCollector(Collector):
    """`recallq_breaker_open{model}`: 1 while the model's breaker is open or half-open (its
    state is shared in Redis, so every process reports the same value)."""

    def __init__(self, breaker: CircuitBreaker, models: Callable[[], Iterable[str]]) -> None:
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


# the work-waiting read, built once (building SQLAlchemy statements per call costs CPU)
IN_FLIGHT_BY_MODEL = (
    select(Run.model, Item.status, func.count())
    .join(Run, Run.id == Item.run_id)
    .where(Item.status.in_(ITEM_IN_FLIGHT), Run.status.in_(RUN_ACTIVE))
    .group_by(Run.model, Item.status)
)
ACTIVE_RUNS_BY_MODEL = (
    select(Run.model, func.count()).where(Run.status.in_(RUN_ACTIVE)).group_by(Run.model)
)
PENDING_BATCHES_BY_MODEL = (
    select(ProviderBatch.model, func.count(), func.coalesce(func.sum(ProviderBatch.requests), 0))
    .where(ProviderBatch.state.in_(PENDING_BATCHES))
    .group_by(ProviderBatch.model)
)


class WorkCollector(Collector):
    """The work waiting across active runs (the autoscaling signal), the batch lane's pending
    batches and the live workers. Three grouped statements: the in-flight items of the active runs
    (the run-and-status index finds them; a dispatch window bounds how many a run has: 0.4 ms
    with 200k items), the active runs and the pending batches, kept for CACHE_SECONDS."""

    def __init__(
        self,
        database: Database,
        models: Callable[[], Iterable[str]],
        heartbeat: Heartbeat | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._database = database
        self._models = models
        self._heartbeat = heartbeat
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
        with self._database.single_statement() as conn:
            flight_rows = conn.execute(IN_FLIGHT_BY_MODEL).all()
            active_rows = conn.execute(ACTIVE_RUNS_BY_MODEL).all()
            batch_rows = conn.execute(PENDING_BATCHES_BY_MODEL).all()
        zero = dict.fromkeys(self._models(), 0.0)
        waiting, running, runs = dict(zero), dict(zero), dict(zero)
        for model, status, count in flight_rows:
            waiting[model] = waiting.get(model, 0.0) + count
            if status == ItemStatus.RUNNING:
                running[model] = running.get(model, 0.0) + count
        for model, count in active_rows:
            runs[model] = float(count)
        pending_batches, pending_requests = dict(zero), dict(zero)
        for model, count, requests in batch_rows:
            pending_batches[model], pending_requests[model] = float(count), float(requests)
        live = None if self._heartbeat is None else self._heartbeat.live_workers()
        return self._families_of(waiting, running, runs, pending_batches, pending_requests, live)

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
        if self._heartbeat is not None:
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
