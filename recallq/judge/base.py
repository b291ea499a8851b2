"""What every judge speaks: judge protocol v1 shapes, what its calls used, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Usage:
    """What judge calls used. A value: calls add up with `+`.

    `llm_calls` and the tokens and cost count what the provider answered (what is billed);
    `call_attempts` counts every request sent, `failed_calls` those answered with an error or
    not at all (timeouts, connection errors)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    call_attempts: int = 0
    failed_calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.llm_calls + other.llm_calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost_usd + other.cost_usd,
            self.call_attempts + other.call_attempts,
            self.failed_calls + other.failed_calls,
        )


NO_USAGE = Usage()


@dataclass(frozen=True)
class JudgeReply:
    """A judge's parsed JSON answer (protocol v1 shape) and what it used."""

    data: dict[str, Any]
    usage: Usage = field(default=NO_USAGE)


@dataclass(frozen=True)
class PackedReply:
    """Claims of several ground truths extracted in one call, by their index in the call; an
    index the answer left out (or answered badly) is missing. `usage` is the whole call's."""

    claims: dict[int, list[str]]
    usage: Usage = field(default=NO_USAGE)


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

    def __init__(self, message: str, delay: float, usage: Usage = NO_USAGE) -> None:
        super().__init__(message, usage)
        self.delay = delay


class RateLimited(TryLater):
    """No capacity within the wait a call may block."""

    counts_towards_deadline = False

    def __init__(self, model: str, delay: float) -> None:
        super().__init__(f"rate limit of {model}: next capacity in {delay:.1f}s", delay)


class ProviderUnavailable(TryLater):
    """The model's circuit breaker is open, or every attempt of this pass failed transiently."""


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


@dataclass(frozen=True)
class Repair:
    """A malformed answer and what was wrong with it: the call goes again once, as the
    conversation with that answer and an instruction to repair it."""

    answer: str | None
    problem: str


class Judge(Protocol):
    """Judge protocol v1. `run_id` names the run a call is made for (a cancelled run's calls
    are refused). Each method is one call (with its retries); `repair` makes it the repair
    request of an earlier malformed answer. A judge that calls a model raises MalformedAnswer
    for an answer not in the schema's shape.

    extract_claims: data {"ground_truth": str} -> {"claims": [str, ...]}
    extract_claims_packed: data {"ground_truths": [{"index", "text"}]}
                           -> {"items": [{"index", "claims": [str, ...]}]}
    attribute: data {"claims": [{"index", "text"}], "contexts": [{"index", "text"}]}
               -> {"verdicts": [{"claim_index", "verdict", "context_indices", "reason"}]}
    """

    name: str

    def extract_claims(
        self, ground_truth: str, run_id: str, repair: Repair | None = None
    ) -> JudgeReply: ...

    def extract_claims_packed(self, ground_truths: list[str], run_id: str) -> PackedReply: ...

    def attribute(
        self, claims: list[str], contexts: list[str], run_id: str, repair: Repair | None = None
    ) -> JudgeReply: ...
