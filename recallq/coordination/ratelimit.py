"""Per-model request and token limits shared by every worker process and host.

GCRA in Lua (ratelimit_*.lua beside this module) over a Redis hash per model: each call
reserves the earliest moment both its request and its estimated tokens fit, so calls are spaced
evenly instead of bursting. After the call, the token estimate is corrected with the actual
usage. A provider 429 halts the model
for Retry-After seconds (all workers) and halves its rate, which recovers linearly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from recallq.coordination import keys, scripts
from recallq.core.errors import RateLimited
from recallq.observability import metrics

if TYPE_CHECKING:
    from redis import Redis


class RateLimiter(Protocol):
    def acquire(self, model: str, tokens: int) -> None: ...

    def settle(self, model: str, estimated: int, actual: int) -> None: ...

    def penalise(self, model: str, retry_after: float | None) -> None: ...


class Unlimited:
    """For models without rpm/tpm in the models file."""

    def acquire(self, model: str, tokens: int) -> None:
        pass

    def settle(self, model: str, estimated: int, actual: int) -> None:
        pass

    def penalise(self, model: str, retry_after: float | None) -> None:
        pass


class RedisRateLimiter:
    def __init__(
        self,
        redis: Redis,
        rpm: int | None,
        tpm: int | None,
        max_wait: float = 10.0,
        utilisation: float = 0.98,
        recovery_seconds: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._redis = redis
        self._rpm = (rpm or 0) * utilisation
        self._tpm = (tpm or 0) * utilisation
        self._max_wait = max_wait
        self._recovery = recovery_seconds
        self._sleep = sleep
        self._acquire = scripts.register(redis, "ratelimit_acquire")
        self._settle = scripts.register(redis, "ratelimit_settle")
        self._penalise = scripts.register(redis, "ratelimit_penalise")

    def acquire(self, model: str, tokens: int) -> None:
        wait = float(
            self._acquire(
                keys=[keys.rate_limit(model)],
                args=[self._rpm, self._tpm, tokens, self._max_wait, self._recovery],
            )
        )
        if wait < 0:
            metrics.rate_limit_deferred(model)
            raise RateLimited(model, -wait)
        if wait > 0:
            metrics.rate_limit_waited(model, wait)
            self._sleep(wait)

    def settle(self, model: str, estimated: int, actual: int) -> None:
        if self._tpm and actual != estimated:
            self._settle(keys=[keys.rate_limit(model)], args=[self._tpm, actual - estimated])

    def penalise(self, model: str, retry_after: float | None) -> None:
        self._penalise(keys=[keys.rate_limit(model)], args=[retry_after or 1.0, 0.1])
