"""The errors of judge calls, on the ground floor: the judges raise them, the retry loop, the
rate limiter and the call gate raise or pass them on, the engine and the batch lane act on
them; every layer imports them from here, so no import runs back up to the judge package."""

from __future__ import annotations

from recallq.core.usage import NO_USAGE, Usage


class JudgeError(Exception):
    """A judge call that did not produce a usable answer. `usage` counts every call that was
    answered (and so billed) on the way, so the item is charged for them whatever happens."""

    def __init__(self, message: str, usage: Usage = NO_USAGE) -> None:
        super().__init__(message)
        self.usage = usage

    def after(self, spent: Usage) -> JudgeError:
        """This error, also charged with `spent`: what calls before the failing one used."""
        self.usage = spent + self.usage
        return self


class TransientJudgeError(JudgeError):
    """One attempt failed for a reason worth retrying: 429, timeouts, 5xx, connection errors.
    `reason` says which in words a user reads ("provider unavailable (503)")."""

    def __init__(self, message: str, reason: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class TryLater(JudgeError):
    """The call cannot succeed now: the item goes back to the queue for `delay` seconds,
    keeping its claims and usage, instead of failing."""

    #: Whether waiting for this counts towards the run's retry deadline (a provider incident
    #: does; waiting for rate-limit capacity that is sure to come does not).
    counts_towards_deadline = True

    def __init__(
        self, message: str, delay: float, usage: Usage = NO_USAGE, reason: str | None = None
    ) -> None:
        """`reason`: the problem in words that stay the same from one call to the next
        ("provider unavailable (503)"): what an item that gives up at its deadline reads, so
        that a run's failures group by it."""
        super().__init__(message, usage)
        self.delay = delay
        self.reason = reason or message


class RateLimited(TryLater):
    """No capacity within the wait a call may block."""

    counts_towards_deadline = False

    def __init__(self, model: str, delay: float) -> None:
        super().__init__(f"rate limit of {model}: next capacity in {delay:.1f}s", delay)


class ProviderUnavailable(TryLater):
    """The model's circuit breaker is open, or every attempt of this pass failed transiently."""


class CoordinationUnavailable(TryLater):
    """Redis, through which every call is coordinated (circuit breaker, rate limit, call gate),
    failed before the call was sent: nothing was sent. The item waits a moment, keeping (and
    so writing) what its earlier calls used, and goes again once Redis answers; the wait does
    not count towards the run's retry deadline."""

    counts_towards_deadline = False

    def __init__(self, problem: str, delay: float = 2.0) -> None:
        super().__init__(
            f"shared state unavailable, call not sent: {problem}", delay, reason="Redis unavailable"
        )


class PermanentJudgeError(JudgeError):
    """Retrying cannot help: bad request, auth, unknown model, context window exceeded, or a
    malformed answer (MalformedAnswer)."""


class MalformedAnswer(PermanentJudgeError):
    """The model answered (and was billed, `usage`), but not in the schema's shape. Whether
    the call goes again as a repair request is the pipeline's decision (recallq.pipeline)."""

    def __init__(
        self,
        schema: str,
        answer: str | None,
        problem: str,
        usage: Usage,
        repairable: bool = True,
    ) -> None:
        """`repairable`: False for an answer over the answer limits (a repair request would
        send it back; nothing of it is kept, `answer` is None)."""
        super().__init__(f"{schema}: malformed answer: {problem}", usage)
        self.schema = schema
        self.answer = answer
        self.problem = problem
        self.repairable = repairable


class SharedStateUnavailable(Exception):
    """Redis, which holds what every worker shares (breakers, heartbeats), cannot be reached
    now: a read that asks it says "unknown" instead of failing."""
