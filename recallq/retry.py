"""The one retry loop for judge calls: exponential backoff with full jitter, Retry-After honoured.

Retries sleep in the calling thread (bounded by max_delay and max_attempts), so they never sit in
a worker's memory as countdown tasks; a rate-limit wait that would be long is handed back to the
engine instead (RateLimited), which puts the item back in the queue until capacity is expected.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from recallq.judge.base import PermanentJudgeError, TransientJudgeError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        backoff = random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))
        if retry_after is not None:
            backoff = max(backoff, retry_after + random.uniform(0, self.base_delay))
        return min(backoff, self.max_delay)


def call_with_retries(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    for number in range(1, policy.max_attempts + 1):
        try:
            return attempt()
        except TransientJudgeError as exc:
            if number == policy.max_attempts:
                raise PermanentJudgeError(f"gave up after {number} attempts: {exc}") from exc
            sleep(policy.delay(number, exc.retry_after))
    raise AssertionError("unreachable")
