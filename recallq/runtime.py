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

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from redis import Redis

from recallq.coordination.gate import CallGate, OpenGate, RedisCallGate
from recallq.coordination.liveness import WORKER_ID, Heartbeat, new_owner_token
from recallq.coordination.ratelimit import RateLimiter, RedisRateLimiter, Unlimited
from recallq.db import Database
from recallq.engine import Engine, WorkQueue
from recallq.judge.base import Judge
from recallq.judge.registry import JudgeRegistry
from recallq.model_registry import ModelConfig, load_models
from recallq.reaper import Reaper
from recallq.retry import RetryPolicy
from recallq.settings import Settings
from recallq.store import ItemStore, RunStore


class LocalOwners:
    """One process: nobody else can hold an item, so a message for a held item is lost work."""

    def new_token(self) -> str:
        return new_owner_token(WORKER_ID)

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

    @classmethod
    def distributed(
        cls,
        settings: Settings,
        queue: WorkQueue,
        *,
        pre_ping: bool = True,
        worker_id: str = WORKER_ID,
        judges: Mapping[str, Judge] | None = None,
    ) -> Runtime:
        """Postgres and Redis, shared with every other process. Workers pass pre_ping=False
        (see recallq.db.make_engine)."""
        redis = redis_client(settings.redis_url)
        return cls(
            settings=settings,
            database=Database(settings.database_url, pre_ping=pre_ping),
            models=load_models(settings.models_file),
            queue=queue,
            gate=RedisCallGate(redis, settings.request_timeout),
            redis=redis,
            heartbeat=Heartbeat(redis, settings.heartbeat_ttl, worker_id),
            judges_given=judges or {},
        )

    @classmethod
    def local(
        cls, settings: Settings, queue: WorkQueue, judges: Mapping[str, Judge] | None = None
    ) -> Runtime:
        """One process on its own database: no Redis, no shared limits, nothing to reap."""
        return cls(
            settings=settings,
            database=Database(settings.database_url),
            models=load_models(settings.models_file),
            queue=queue,
            gate=OpenGate(),
            judges_given=judges or {},
        )

    @cached_property
    def items(self) -> ItemStore:
        return ItemStore(
            self.database, self.settings.lease_seconds, self.settings.queue_lease_seconds
        )

    @cached_property
    def runs(self) -> RunStore:
        return RunStore(self.database, self.items, self.settings.insert_batch_size)

    @cached_property
    def judges(self) -> JudgeRegistry:
        settings = self.settings
        policy = RetryPolicy(
            settings.max_attempts, settings.retry_base_delay, settings.retry_max_delay
        )
        return JudgeRegistry(
            self.models,
            self._limiter_for,
            self.gate,
            policy,
            settings.request_timeout,
            self.judges_given,
        )

    @cached_property
    def engine(self) -> Engine:
        owners = LocalOwners() if self.heartbeat is None else WorkerOwners(self.heartbeat)
        return Engine(
            self.items,
            self.runs,
            self.judges,
            self.queue,
            owners,
            self.settings.dispatch_window,
        )

    def _limiter_for(self, model: ModelConfig) -> RateLimiter:
        if self.redis is None or not (model.rpm or model.tpm):
            return Unlimited()
        return RedisRateLimiter(self.redis, model.rpm, model.tpm, self.settings.rate_limit_max_wait)

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

    def close(self) -> None:
        self.database.dispose()
        if self.redis is not None:
            self.redis.close()


def redis_client(url: str) -> Redis:
    return Redis.from_url(url, socket_timeout=10, health_check_interval=30)
