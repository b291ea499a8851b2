"""The one settings reader: environment variables prefixed RECALLQ_.

Each process reads them once, where it starts (the CLI, the API app, a worker), into the
runtime it passes down (see recallq.execution.runtime).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

from recallq.judge.protocol import AnswerLimits

DEFAULT_LOCAL_DATABASE_URL = "sqlite:///recallq.db"
DEFAULT_RETRY_DEADLINE = 6 * 3600.0


def read_settings(**overrides: Any) -> Settings:
    """The settings of this process: RECALLQ_* variables, then `overrides`. Called once per
    process, where it starts: the `recallq` command (recallq.cli.main), the API app factory,
    the worker's start, and the library's entry points `recallq.evaluate` and
    `recallq.Client` (tests/unit/test_settings_edges.py holds every other module to it)."""
    return Settings(**overrides)


def read_client_settings() -> ClientSettings:
    """What `recallq.Client` reads, where a notebook's process starts it: only its own two
    settings, so a malformed RECALLQ_* variable it does not use cannot break it."""
    return ClientSettings()


class ClientSettings(BaseSettings):
    """The settings of a client of the API: the CLI's client commands and recallq.Client (no
    API URL: the local database)."""

    model_config = SettingsConfigDict(env_prefix="RECALLQ_", extra="ignore")

    api_url: str | None = None
    api_key: str | None = None


class Settings(ClientSettings):
    database_url: str = DEFAULT_LOCAL_DATABASE_URL
    redis_url: str = "redis://127.0.0.1:6379/0"
    models_file: Path | None = None
    default_model: str = "local/lexical"

    # worker
    worker_concurrency: int = 32
    # items of one run in the broker at once: a worker thread attributes up to 4 in a row
    # (one attribution message), so 4x the threads of its workers keeps them all busy, and
    # 8x leaves the next items waiting in the queue
    dispatch_window: int = 512
    max_attempts: int = 5  # judge calls per stage, transient failures included
    extraction_pack: int = 8  # ground truths per extraction call (a model may set fewer)
    extraction_pack_tokens: int = 4000  # and about this many tokens of them at most
    # judge answers are untrusted: beyond these an item fails, saying which (judge.protocol)
    judge_max_answer_bytes: PositiveInt = 1024 * 1024  # one answer, checked before it is parsed
    judge_max_claims: PositiveInt = 500  # claims of one item
    judge_max_claim_chars: PositiveInt = 2000  # one claim
    judge_max_reason_chars: PositiveInt = 2000  # one verdict's reason
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    request_timeout: float = 120.0
    rate_limit_max_wait: float = 10.0  # longest a task blocks for limiter capacity
    lease_seconds: float = 600.0  # a running stage untouched this long is requeued by the reaper
    queue_lease_seconds: float = 120.0  # a message waiting longer than this is sent again
    reaper_interval: float = 10.0
    heartbeat_ttl: float = 20.0  # a worker silent this long is dead; its items are requeued
    # Postgres ends a worker's transaction left idle this long (its host vanished or was cut
    # off mid-transaction): the rows it locked, which the reaper skips, are free again
    worker_idle_transaction_timeout: float = 60.0
    cancel_wait: float = 30.0  # how long a cancel waits for calls already in flight

    # provider incidents: a model's circuit breaker, and how long an item may wait one out
    retry_deadline: float = DEFAULT_RETRY_DEADLINE  # a run's `retry_deadline_s` overrides it
    breaker_window: float = 30.0  # seconds of outcomes it looks at
    breaker_min_calls: int = 10  # outcomes in the window before the failure ratio counts
    breaker_failure_ratio: float = 0.5  # opens at this share of transient failures...
    breaker_consecutive_failures: int = 8  # ...or after this many in a row
    breaker_cool_down: float = 5.0  # first wait before a probe; doubles per failed probe
    # ...up to this: a run resumes within about this long after its provider is back
    # (docs/reliability.md), whatever the outage's length
    breaker_max_cool_down: float = 15.0

    # the provider batch lane (batch-mode runs; recallq.batch.lane)
    batch_poll_interval: float = 30.0  # how often one worker polls the providers' batches
    batch_max_requests: int = 50_000  # requests in one batch input file (OpenAI's limit)
    batch_max_bytes: int = 200 * 1024 * 1024  # size of one batch input file (OpenAI's limit)

    # api
    max_items_per_run: int = 200_000
    max_body_bytes: int = 512 * 1024 * 1024  # an NDJSON upload (spooled to disk past the next)
    spool_memory_bytes: int = 1024 * 1024  # an upload larger than this is spooled to disk
    max_spool_bytes: int = 4 * 1024**3  # every upload being received at once, together
    max_json_body_bytes: int = 32 * 1024 * 1024  # a JSON body (large runs use NDJSON)
    max_item_bytes: int = 1024 * 1024
    max_json_depth: int = 64  # nesting of arrays and objects in a body or an NDJSON line
    body_timeout: float = 900.0  # longest a request body may take to arrive
    body_min_rate: float = 16 * 1024  # bytes/s a body must keep up after the grace period
    body_grace: float = 10.0
    insert_batch_size: int = 1000
    max_result_streams_per_key: int = 8  # /results streams open at once per key (429 beyond)
    results_stall_timeout: float = 120.0  # a /results reader taking nothing this long is cut

    # security: keys and projects, limits per client, retention
    auth: Literal["required", "off"] = "required"
    submissions_per_minute: float = 60.0  # per key (429 with Retry-After beyond); 0: no limit
    submission_burst: int = 10
    max_active_runs_per_project: int = 10  # queued or running
    max_queued_items_per_project: int = 1_000_000  # items of a project not yet ended
    retention_days: float | None = None  # ended runs older than this are deleted; None: kept
    retention_interval: float = 3600.0  # how often one worker looks for them
    # signs the web pages' sign-in cookies together with the key's stored hash; set it (any
    # long random string, the same for every API process) so that a copy of the keys table
    # is not enough to forge a browser session
    session_secret: str | None = None
    # with auth off, Host names answered beside localhost and the address the API listens on
    # (comma-separated: the names this API is reached by); any other is a 421 (DNS rebinding)
    allowed_hosts: str = ""
    # who may read the API's GET /metrics: a client sending `Authorization: Bearer` this
    # token; unset, only clients on this host (loopback). Never an API key (docs/operations.md)
    metrics_token: str | None = None

    # contexts: what one item may be judged against
    max_context_bytes: int = 1024 * 1024  # resolved passages of one item (or the run's static)
    max_context_passages: int = 1000
    jmespath_timeout: float = 0.5  # one item's context_extractor evaluation
    context_extractor_budget: float = 10.0  # all items' context_extractor of one submission (422)

    def answer_limits(self) -> AnswerLimits:
        """What a judge's answer may hold (the RECALLQ_JUDGE_MAX_* settings)."""
        return AnswerLimits(
            self.judge_max_answer_bytes,
            self.judge_max_claims,
            self.judge_max_claim_chars,
            self.judge_max_reason_chars,
        )
