"""Per-model request and token limits shared by every worker process and host.

GCRA in one Lua script over a Redis hash per model: each call reserves the earliest moment both
its request and its estimated tokens fit, so calls are spaced evenly instead of bursting. After
the call, the token estimate is corrected with the actual usage. A provider 429 halts the model
for Retry-After seconds (all workers) and halves its rate, which recovers linearly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from redis import Redis

from worker.judge.base import RateLimited

# KEYS[1] model state; ARGV: rpm, tpm, tokens, max_wait, recovery_seconds
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, max_wait, recovery = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local s = redis.call('HMGET', KEYS[1], 'rtat', 'ttat', 'factor', 'fts', 'hold')
local rtat, ttat = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local factor = tonumber(s[3]) or 1
local fts, hold = tonumber(s[4]) or now, tonumber(s[5]) or 0
factor = math.min(1, factor + (now - fts) / recovery)
local at = math.max(now, hold, rtat, ttat)
if at - now > max_wait then return tostring(-(at - now)) end
if rpm > 0 then rtat = at + 60 / (rpm * factor) end
if tpm > 0 then ttat = at + tokens * 60 / (tpm * factor) end
redis.call('HSET', KEYS[1], 'rtat', rtat, 'ttat', ttat, 'factor', factor, 'fts', now)
redis.call('EXPIRE', KEYS[1], 3600)
return tostring(at - now)
"""

# KEYS[1]; ARGV: tpm, token_delta (actual - estimated)
_SETTLE = """
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'ttat', 'factor')
if not s[1] or tpm <= 0 then return 0 end
local factor = tonumber(s[2]) or 1
redis.call('HSET', KEYS[1], 'ttat', tonumber(s[1]) + delta * 60 / (tpm * factor))
return 1
"""

# KEYS[1]; ARGV: hold_seconds, min_factor
_PENALISE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local s = redis.call('HMGET', KEYS[1], 'hold', 'factor')
local hold = math.max(tonumber(s[1]) or 0, now + tonumber(ARGV[1]))
local factor = math.max(tonumber(ARGV[2]), (tonumber(s[2]) or 1) * 0.5)
redis.call('HSET', KEYS[1], 'hold', hold, 'factor', factor, 'fts', now)
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"""


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
        self._acquire = redis.register_script(_ACQUIRE)
        self._settle = redis.register_script(_SETTLE)
        self._penalise = redis.register_script(_PENALISE)

    @staticmethod
    def key(model: str) -> str:
        return f"recallq:ratelimit:{model}"

    def acquire(self, model: str, tokens: int) -> None:
        wait = float(
            self._acquire(
                keys=[self.key(model)],
                args=[self._rpm, self._tpm, tokens, self._max_wait, self._recovery],
            )
        )
        if wait < 0:
            raise RateLimited(model, -wait)
        if wait > 0:
            self._sleep(wait)

    def settle(self, model: str, estimated: int, actual: int) -> None:
        if self._tpm and actual != estimated:
            self._settle(keys=[self.key(model)], args=[self._tpm, actual - estimated])

    def penalise(self, model: str, retry_after: float | None) -> None:
        self._penalise(keys=[self.key(model)], args=[retry_after or 1.0, 0.1])
