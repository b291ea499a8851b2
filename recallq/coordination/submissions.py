"""How often one API key may submit runs, across every API process (GCRA in Redis, like the
model rate limiter beside it; submission_rate.lua)."""

from __future__ import annotations

import math

from redis import Redis

from recallq.coordination import keys, scripts


class SubmissionLimiter:
    def __init__(self, redis: Redis, per_minute: float, burst: int) -> None:
        """`per_minute` submissions on average, up to `burst` at once."""
        self._redis = redis
        self._interval = 60.0 / per_minute if per_minute > 0 else 0.0
        self._burst = max(1, burst)
        self._script = scripts.register(redis, "submission_rate")

    def admit(self, key_id: str) -> float | None:
        """None when the key may submit now (and it counts), else the seconds to wait."""
        if self._interval <= 0:
            return None
        wait = float(
            self._script(keys=[keys.submissions(key_id)], args=[self._interval, self._burst])
        )
        return None if wait <= 0 else max(1.0, math.ceil(wait))
