"""Prometheus metrics of this process (prometheus-client's default registry).

    events   the store, the judge, the rate limiter, the breaker and the batch lane call the
             hook functions below at one place each: counters and histograms of this process
    state    read when Prometheus scrapes: the breaker of every model (Redis), and on the API
             the work waiting across active runs and the batch lane's pending batches (one
             grouped query, kept for CACHE_SECONDS so scrapes never queue up on the database)

Labels are of low cardinality only: a model named in the models file, a stage, an outcome, a
status, a route template. Never a run, an item, a key or a project: every process's series stay
a fixed, small set however many runs it scores. Each API process and each worker serves its own
registry (`recallq worker` runs threads, so one registry per process sees every task); the
`instance` label Prometheus adds tells them apart. docs/operations.md lists every metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector
from redis.exceptions import RedisError
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from recallq.batch_store import PENDING_BATCHES
from recallq.gates import CommandError
from recallq.judge import protocol
from recallq.status import ITEM_ENDED, ITEM_IN_FLIGHT, RUN_ACTIVE, ItemStatus
from recallq.tables import Item, ProviderBatch, Run

if TYPE_CHECKING:
    from recallq.coordination.breaker import CircuitBreaker
    from recallq.coordination.liveness import Heartbeat
    from recallq.db import Database

log = logging.getLogger(__name__)

# a `_created` series beside every counter doubles what a scrape carries, for nothing we use
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: how long the API keeps the result of the work-waiting query: scrapes from several
#: Prometheus servers (or a fast scrape interval) cost one query per this many seconds
CACHE_SECONDS = 5.0

# judge calls take from ~50 ms (a small local model) to minutes (a long attribution)
_CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

ITEMS_ENDED = Counter(
    "recallq_items_ended", "Items that ended, by outcome (succeeded|failed|cancelled)", ["outcome"]
)
ITEM_TRANSITIONS = Counter(
    "recallq_item_transitions", "Item state moves made by this process, by new status", ["status"]
)
JUDGE_CALLS = Counter(
    "recallq_judge_calls",
    "Requests sent to a judge model, by outcome (answered|repaired|transient_error|"
    "permanent_error; repaired: the answered repair request of a malformed answer)",
    ["model", "stage", "outcome"],
)
JUDGE_CALL_SECONDS = Histogram(
    "recallq_judge_call_seconds",
    "Time of one request to a judge model, whatever its outcome",
    ["model", "stage"],
    buckets=_CALL_BUCKETS,
)
JUDGE_TOKENS = Counter(
    "recallq_judge_tokens",
    "Tokens of answered judge calls, by kind (prompt|completion)",
    ["model", "stage", "kind"],
)
JUDGE_COST = Counter(
    "recallq_judge_cost_usd", "Cost of answered judge calls in USD", ["model", "stage"]
)
PROVIDER_RATE_LIMITED = Counter(
    "recallq_provider_rate_limited", "Judge calls the provider refused with a 429", ["model"]
)
RATE_LIMIT_WAIT = Counter(
    "recallq_rate_limit_wait_seconds",
    "Time judge calls spent waiting for rate-limit capacity",
    ["model"],
)
RATE_LIMIT_DEFERRED = Counter(
    "recallq_rate_limit_deferred",
    "Judge calls put off because no rate-limit capacity came within the longest wait",
    ["model"],
)
BREAKER_OPENINGS = Counter(
    "recallq_breaker_openings", "Times this process's report opened a model's breaker", ["model"]
)
BATCHES_APPLIED = Counter(
    "recallq_batch_batches_applied", "Provider batches whose results were applied", ["model"]
)
HTTP_REQUEST_SECONDS = Histogram(
    "recallq_http_request_seconds",
    "API requests by method, route template and status code, until the response ended",
    ["method", "route", "status"],
)

_STAGES = {
    protocol.EXTRACTION: "extraction",
    protocol.EXTRACTION_PACKED: "extraction",
    protocol.ATTRIBUTION: "attribution",
}


# --- hooks: each called at one place ------------------------------------------------------


def items_moved(status: str, count: int) -> None:
    """recallq.store: `count` items moved into `status` (the write was made)."""
    ITEM_TRANSITIONS.labels(str(status)).inc(count)
    if status in ITEM_ENDED:
        ITEMS_ENDED.labels(str(status)).inc(count)


def judge_call(model: str, schema: str, outcome: str, seconds: float) -> None:
    """recallq.judge.llm: one request went to the model (`schema` names the protocol call)."""
    stage = _STAGES.get(schema, "other")
    JUDGE_CALLS.labels(model, stage, outcome).inc()
    JUDGE_CALL_SECONDS.labels(model, stage).observe(seconds)


def judge_usage(model: str, schema: str, prompt: int, completion: int, cost_usd: float) -> None:
    """recallq.judge.llm: what an answered call used (what the run's usage counts)."""
    stage = _STAGES.get(schema, "other")
    JUDGE_TOKENS.labels(model, stage, "prompt").inc(prompt)
    JUDGE_TOKENS.labels(model, stage, "completion").inc(completion)
    JUDGE_COST.labels(model, stage).inc(cost_usd)


def provider_rate_limited(model: str) -> None:
    PROVIDER_RATE_LIMITED.labels(model).inc()


def rate_limit_waited(model: str, seconds: float) -> None:
    RATE_LIMIT_WAIT.labels(model).inc(seconds)


def rate_limit_deferred(model: str) -> None:
    RATE_LIMIT_DEFERRED.labels(model).inc()


def breaker_recorded(model: str, what: str) -> None:
    """recallq.coordination.breaker: what breaker.lua said a report did."""
    if what in ("opened", "reopened"):
        BREAKER_OPENINGS.labels(model).inc()


def batch_applied(model: str) -> None:
    BATCHES_APPLIED.labels(model).inc()


_last_beat: float | None = None


def heartbeat_beat() -> None:
    """recallq.coordination.liveness: this worker's heartbeat reached Redis."""
    global _last_beat
    _last_beat = time.time()


# --- state, read at scrape time -----------------------------------------------------------


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


class HeartbeatCollector(Collector):
    """`recallq_worker_heartbeat_age_seconds`: since this worker's heartbeat last reached Redis
    (the reaper takes a worker silent for the heartbeat TTL for dead)."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "recallq_worker_heartbeat_age_seconds",
            "Seconds since this worker's heartbeat last reached Redis",
        )
        if _last_beat is not None:
            family.add_metric([], max(0.0, time.time() - _last_beat))
        yield family


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


# --- serving ------------------------------------------------------------------------------


_state_collectors: list[Collector] = []
_state_lock = threading.Lock()


def use_state_collectors(*collectors: Collector) -> None:
    """The collectors of state this process reports, in place of any it had (a process
    builds its runtime once; a test process builds several apps, the last one reports)."""
    with _state_lock:
        for old in _state_collectors:
            REGISTRY.unregister(old)
        _state_collectors[:] = collectors
        for collector in collectors:
            REGISTRY.register(collector)


def exposition() -> tuple[bytes, str]:
    """This process's metrics in Prometheus's text format, and its content type."""
    return prometheus_client.generate_latest(REGISTRY), prometheus_client.CONTENT_TYPE_LATEST


def serve(host: str, port: int) -> None:
    """This process's metrics at http://host:port/metrics, from a thread of its own."""
    try:
        prometheus_client.start_http_server(port, addr=host, registry=REGISTRY)
    except (OSError, OverflowError) as exc:  # in use, not an address here, out of range
        reason = getattr(exc, "strerror", None) or str(exc)
        message = f"--metrics-port: cannot serve metrics on {host}:{port}: {reason}"
        raise CommandError(message) from None
