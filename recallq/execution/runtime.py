"""Everything a process shares, built once where it starts and passed down.

    settings ─► database ─► item and run stores ─┐
    models file ─► judges (rate limiter, gate) ──┼─► engine (the stages of an item)
    Redis (distributed) or nothing (local) ──────┤
    work queue: Celery or the local runner ──────┘

`distributed()` is for the API and the workers (Postgres, Redis, Celery); `local()` is for
`recallq run` (SQLite, one process, a thread pool). Those two builders are the one place that
tells the modes apart. Tests build their own runtime with their own settings and judges.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from recallq.batch.lane import BatchLane
from recallq.batch.store import LaneStore
from recallq.coordination.breaker import (
    BreakerSettings,
    CircuitBreaker,
    LocalCircuitBreaker,
    RedisCircuitBreaker,
)
from recallq.coordination.call_gate import CallGate, OpenGate, RedisCallGate
from recallq.coordination.liveness import Heartbeat, new_owner_token, this_process_id
from recallq.coordination.ratelimit import RateLimiter, RedisRateLimiter, Unlimited
from recallq.core.errors import SharedStateUnavailable
from recallq.core.redact import Redactor, redact_url
from recallq.execution.breaker_wakes import BreakerWakes
from recallq.execution.engine import Engine, WorkQueue
from recallq.execution.reaper import Reaper
from recallq.execution.retention import Retention
from recallq.judge.backoff import Backoff
from recallq.judge.base import Judge
from recallq.judge.by_model import JudgeRegistry
from recallq.judge.models import ModelConfig, load_models
from recallq.settings import Settings
from recallq.state.batched_items import BatchedItemStore
from recallq.state.db import Database
from recallq.state.items import ItemStore
from recallq.state.runs import RunStore, run_budget, run_spent, stores_for
from recallq.state.usage_spool import UsageSpool

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)


class LocalOwners:
    """One process: nobody else can hold an item, so a message for a held item is lost work."""

    def new_token(self) -> str:
        return new_owner_token(this_process_id())

    def holder_alive(self, owner: str) -> bool:
        return False


class WorkerOwners:
    """Owner tokens name this worker; other holders are alive while they heart-beat."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        self._heartbeat = heartbeat

    def new_token(self) -> str:
        return new_owner_token(self._heartbeat.worker_id)

    def holder_alive(self, owner: str) -> bool:
        return self._heartbeat.holder_alive(owner)


@dataclass
class Runtime:
    settings: Settings
    database: Database
    models: Mapping[str, ModelConfig]
    queue: WorkQueue
    gate: CallGate
    redis: Redis | None = None
    heartbeat: Heartbeat | None = None
    judges_given: Mapping[str, Judge] = field(default_factory=dict)
    #: what a process does when a run completes (keep its view): recallq.runs sets it
    on_completed: Callable[[Database, str], None] | None = None

    @classmethod
    def distributed(
        cls,
        settings: Settings,
        queue: WorkQueue,
        *,
        worker_id: str | None = None,
        judges: Mapping[str, Judge] | None = None,
        worker: bool = False,
    ) -> Runtime:
        """Postgres and Redis, shared with every other process. A `worker`'s database has no
        pre-ping and ends its idle transactions (see recallq.state.db.make_engine)."""
        redis = redis_client(settings.redis_url)
        database = Database(
            settings.database_url,
            pre_ping=not worker,
            idle_transaction_timeout=settings.worker_idle_transaction_timeout if worker else 0,
        )
        return cls(
            settings=settings,
            database=database,
            models=load_models(settings.models_file),
            queue=queue,
            gate=RedisCallGate(
                redis,
                settings.request_timeout,
                budget_of=partial(run_budget, database),
                spent_of=partial(run_spent, database),
            ),
            redis=redis,
            heartbeat=Heartbeat(redis, settings.heartbeat_ttl, worker_id or this_process_id()),
            judges_given=judges or {},
        )

    @classmethod
    def local(
        cls, settings: Settings, queue: WorkQueue, judges: Mapping[str, Judge] | None = None
    ) -> Runtime:
        """One process on its own database: no Redis, no shared limits, nothing to reap."""
        database = Database(settings.database_url)
        return cls(
            settings=settings,
            database=database,
            models=load_models(settings.models_file),
            queue=queue,
            gate=OpenGate(
                budget_of=partial(run_budget, database),
                spent_of=partial(run_spent, database),
            ),
            judges_given=judges or {},
        )

    @cached_property
    def _stores(self) -> tuple[ItemStore, RunStore]:
        return stores_for(self.database, self.settings, UsageSpool(self.redis))

    @property
    def items(self) -> ItemStore:
        return self._stores[0]

    @property
    def runs(self) -> RunStore:
        return self._stores[1]

    @cached_property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker of every model: in Redis, shared by all workers; in local mode,
        this process's own."""
        settings = self.settings
        options = BreakerSettings(
            window_s=settings.breaker_window,
            min_calls=settings.breaker_min_calls,
            failure_ratio=settings.breaker_failure_ratio,
            consecutive_failures=settings.breaker_consecutive_failures,
            base_cool_down=settings.breaker_cool_down,
            # a first wait set above the cap (15 s by default) is kept, and not doubled
            max_cool_down=max(settings.breaker_max_cool_down, settings.breaker_cool_down),
            # a probe is dead only once its call could no longer be running
            probe_timeout=settings.request_timeout + 5.0,
        )
        if self.redis is None:
            return LocalCircuitBreaker(options)
        return RedisCircuitBreaker(self.redis, options)

    @cached_property
    def judges(self) -> JudgeRegistry:
        settings = self.settings
        policy = Backoff(settings.max_attempts, settings.retry_base_delay, settings.retry_max_delay)
        return JudgeRegistry(
            self.models,
            self._limiter_for,
            self.gate,
            self.breaker,
            policy,
            settings.request_timeout,
            settings.extraction_pack,
            self.judges_given,
            self.redactor,
            settings.answer_limits(),
        )

    @cached_property
    def redactor(self) -> Redactor:
        """Takes secrets out of provider error text before it is stored or logged: the
        resolved value of every configured key of every model, the passwords of the database
        and Redis URLs, and anything shaped like a credential (see recallq.core.redact)."""
        secrets = [value for model in self.models.values() for value in model.secret_values()]
        for url in (self.settings.database_url, self.settings.redis_url):
            secrets.extend(_url_password(url))
        return Redactor(secrets)

    @cached_property
    def engine(self) -> Engine:
        owners = LocalOwners() if self.heartbeat is None else WorkerOwners(self.heartbeat)
        return Engine(
            self.items,
            self.runs,
            self.judges,
            self.queue,
            owners,
            self.settings.retry_deadline,
            self.settings.extraction_pack_tokens,
            completed=self.keep_views,
        )

    def keep_views(self, run_id: str) -> None:
        """A run has just completed: `on_completed` (recallq.runs.run_views.keep_view, set where
        the process starts) computes its run object now and keeps it, so the first page or
        poll that reads it does not pay for a scan of all its items. Only an optimisation: a
        failure here is logged, and the view is computed when first read."""
        if self.on_completed is None:
            return
        try:
            self.on_completed(self.database, run_id)
        except Exception:  # the run has completed; this must not undo a task
            log.warning("could not keep the view of completed run %s", run_id, exc_info=True)

    def _limiter_for(self, model: ModelConfig) -> RateLimiter:
        if self.redis is None or not (model.rpm or model.tpm):
            return Unlimited()
        return RedisRateLimiter(self.redis, model.rpm, model.tpm, self.settings.rate_limit_max_wait)

    def waiting(self, model: str) -> dict[str, Any] | None:
        """Why runs of this model cannot make progress now: its provider is having an
        incident (its circuit breaker is open), or no worker is alive to score them. Raises
        SharedStateUnavailable when Redis cannot say."""
        if self.redis is None:  # local mode: the breakers are this process's
            return self._waiting(model)
        from redis.exceptions import RedisError

        try:
            return self._waiting(model)
        except RedisError as exc:
            raise SharedStateUnavailable(str(exc)) from exc

    def _waiting(self, model: str) -> dict[str, Any] | None:
        incident = self.breaker.state(model)
        if incident is not None:
            return {
                "model": model,
                "reason": incident.reason,
                "since": _iso(incident.since),
                "next_probe_at": _iso(incident.next_probe_at),
            }
        if self.heartbeat is not None and self.heartbeat.live_workers() == 0:
            last = self.heartbeat.last_beat()
            return {
                "model": None,
                "reason": "no live worker (start one with `recallq worker`)",
                "since": None if last is None else _iso(last),
                "next_probe_at": None,
            }
        return None

    def reaper(self) -> Reaper:
        """The sweeper of lost work (distributed mode: it needs Redis and heartbeats)."""
        if self.redis is None or self.heartbeat is None:
            raise RuntimeError("local mode has no reaper: one process loses nothing to others")
        return Reaper(
            self.redis,
            self.database,
            self.items,
            self.heartbeat,
            self.queue,
            self.settings.reaper_interval,
        )

    def breaker_wakes(self) -> BreakerWakes:
        """Sends the items that wait for a breaker when it closes or its probe is due
        (distributed mode: the wakes are in Redis)."""
        breaker = self.breaker
        if not isinstance(breaker, RedisCircuitBreaker) or self.redis is None:
            raise RuntimeError("local mode's runner sends each waiting item at its time")
        assert self.heartbeat is not None  # distributed
        return BreakerWakes(self.redis, breaker, self.items, self.queue, self.heartbeat.worker_id)

    def batch_lane(self) -> BatchLane:
        """The provider batch lane's poller (distributed mode: a worker polls it)."""
        return BatchLane(
            LaneStore(self.database),
            BatchedItemStore(),
            self.runs,
            self.models,
            self.settings,
            completed=self.keep_views,
            redact=self.redactor,
        )

    def retention(self) -> Retention:
        """Deletes runs past the retention setting (distributed mode: one worker at a time)."""
        if self.redis is None or self.heartbeat is None:
            raise RuntimeError("local mode applies no retention: its database is the user's")
        return Retention(
            self.redis,
            self.runs,
            self.gate,
            self.settings.retention_days,
            self.settings.retention_interval,
            self.heartbeat.worker_id,
        )

    def close(self) -> None:
        self.database.dispose()
        if self.redis is not None:
            self.redis.close()


def _iso(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat()


def redis_client(url: str) -> Redis:
    from redis import Redis  # here: local mode has no Redis (nor, without [service], redis)

    return Redis.from_url(url, socket_timeout=10, health_check_interval=30)


def _url_password(url: str) -> list[str]:
    """The password in a URL's user:password@, if it has one."""
    masked = redact_url(url)
    if masked == url:
        return []
    head, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    userinfo = authority.rpartition("@")[0]
    return [userinfo.partition(":")[2]] if ":" in userinfo else []
