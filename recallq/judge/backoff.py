"""The one backoff loop for judge calls: exponential backoff with full jitter, Retry-After
honoured. (A run's `retry` re-queues its failed items; its `retry_deadline_s` bounds how long an
item waits out a provider incident: neither is this.)

Retries sleep in the calling thread (bounded by max_delay and max_attempts), so they never sit in
a worker's memory as countdown tasks. Anything longer is the engine's: a long rate-limit wait
(RateLimited), an open circuit breaker or a pass whose attempts all failed (ProviderUnavailable)
puts the item back in the queue until the call can succeed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from recallq.core.errors import (
    JudgeError,
    PermanentJudgeError,
    ProviderUnavailable,
    TransientJudgeError,
)
from recallq.core.usage import Usage

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        backoff = random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))
        if retry_after is not None:
            backoff = max(backoff, retry_after + random.uniform(0, self.base_delay))
        return min(backoff, self.max_delay)


def call_with_backoff(
    attempt: Callable[[], T],
    policy: Backoff,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[T, Usage]:
    """The answer of the first attempt that succeeds, and the requests it took.

    When every attempt of this pass fails transiently the item is not failed: it waits and
    tries again later (ProviderUnavailable), for as long as its run's retry deadline allows.
    An error raised before anything was sent (a cancelled run, no rate-limit capacity, an
    open circuit breaker) passes through, charged with the attempts made before it.
    """
    failed = 0
    for number in range(1, policy.max_attempts + 1):
        try:
            answer = attempt()
        except TransientJudgeError as exc:
            failed += 1
            if number == policy.max_attempts:
                raise ProviderUnavailable(
                    f"{exc.reason}: {number} attempts failed, the last with {exc}",
                    policy.max_delay,
                    Usage(call_attempts=failed, failed_calls=failed),
                    reason=exc.reason,
                ) from exc
            sleep(policy.delay(number, exc.retry_after))
            continue
        except PermanentJudgeError as exc:  # the provider answered with an error
            exc.after(Usage(call_attempts=failed + 1, failed_calls=failed + 1))
            raise
        except JudgeError as exc:  # nothing was sent
            exc.after(Usage(call_attempts=failed, failed_calls=failed))
            raise
        return answer, Usage(call_attempts=failed + 1, failed_calls=failed)
    raise AssertionError("unreachable: max_attempts is at least 1")
