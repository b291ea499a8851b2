"""Which judge serves a model name, built once per worker process, with the shared pieces it
needs: the Redis rate limiter and the cancel gate (in local mode, neither needs Redis)."""

from __future__ import annotations

import threading
from functools import lru_cache

import redis

from recallq.model_registry import LEXICAL, ModelRegistryError, load_models
from recallq.settings import get_settings
from worker.judge.base import Judge, PermanentJudgeError
from worker.judge.lexical import LexicalJudge

_lock = threading.Lock()
_judges: dict[str, Judge] = {}
_local_mode = threading.Event()


def use_local_mode() -> None:
    """One process, no Redis: no shared limiter state, nothing to cancel from."""
    _local_mode.set()


def is_local_mode() -> bool:
    return _local_mode.is_set()


@lru_cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(
        get_settings().redis_url, socket_timeout=10, health_check_interval=30
    )


def _build(name: str) -> Judge:
    if name == LEXICAL:
        return LexicalJudge()
    settings = get_settings()
    config = load_models(settings.models_file).get(name)
    if config is None:
        raise PermanentJudgeError(f"model {name!r} is not in this worker's models file")
    from worker.gate import OpenGate, RedisCallGate
    from worker.judge.llm import LLMJudge  # imports litellm: only where a model is called
    from worker.ratelimit import RedisRateLimiter, Unlimited
    from worker.retry import RetryPolicy

    limited = (config.rpm or config.tpm) and not is_local_mode()
    limiter = (
        RedisRateLimiter(redis_client(), config.rpm, config.tpm, settings.rate_limit_max_wait)
        if limited
        else Unlimited()
    )
    gate = (
        OpenGate() if is_local_mode() else RedisCallGate(redis_client(), settings.request_timeout)
    )
    policy = RetryPolicy(settings.max_attempts, settings.retry_base_delay, settings.retry_max_delay)
    try:
        return LLMJudge(config, policy, limiter, gate, settings.request_timeout)
    except ModelRegistryError as exc:  # a missing key fails each item at once, not after retries
        raise PermanentJudgeError(str(exc)) from exc


def get_judge(name: str) -> Judge:
    with _lock:
        if name not in _judges:
            _judges[name] = _build(name)
        return _judges[name]
