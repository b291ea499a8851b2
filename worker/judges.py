"""Which judge serves a model name, built once per worker process."""

from __future__ import annotations

import threading
from functools import lru_cache

from recallq.model_registry import LEXICAL, load_models
from recallq.settings import get_settings
from worker.judge.base import Judge, PermanentJudgeError
from worker.judge.lexical import LexicalJudge

_lock = threading.Lock()


@lru_cache
def _redis():  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(get_settings().redis_url)


def _build(name: str) -> Judge:
    if name == LEXICAL:
        return LexicalJudge()
    settings = get_settings()
    config = load_models(settings.models_file).get(name)
    if config is None:
        raise PermanentJudgeError(f"model {name!r} is not in the models file")
    from worker.judge.llm import LLMJudge  # imports litellm: only where a model is called
    from worker.ratelimit import RedisRateLimiter, Unlimited
    from worker.retry import RetryPolicy

    limiter = (
        RedisRateLimiter(_redis(), config.rpm, config.tpm, settings.rate_limit_max_wait)
        if config.rpm or config.tpm
        else Unlimited()
    )
    policy = RetryPolicy(settings.max_attempts, settings.retry_base_delay, settings.retry_max_delay)
    return LLMJudge(config, policy, limiter, settings.request_timeout)


_judges: dict[str, Judge] = {}


def get_judge(name: str) -> Judge:
    with _lock:
        if name not in _judges:
            _judges[name] = _build(name)
        return _judges[name]
