"""How one judge request reaches a provider, and what comes back, without the coordination around
it (rate limiter, call gate, circuit breaker, backoff, usage: recallq.judge.llm).

A transport sends one chat completion and returns its Answer, or raises a ProviderError that
says what the failure means in provider-neutral terms: rate limited (with its Retry-After),
transient (with the reason a waiting run shows) or permanent (the provider answered: this
call is wrong). Which transport a model takes is recallq.judge.lanes's decision.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any, Protocol

#: the reasons of transient failures, in the words a waiting run shows (and the breaker keeps)
RATE_LIMITED = "rate limited (429)"
TIMEOUTS = "timeouts"
CONNECTION_REFUSED = "connection refused (is the model's api_base right?)"
CONNECTION_ERRORS = "connection errors"


def unavailable(status: int | None) -> str:
    """The reason of a provider that answered with an error status worth another try."""
    return f"provider unavailable ({status})" if status else "provider unavailable"


#: More tokens than any model's context holds: what a provider reports for one call is cut
#: to this, so a hostile or broken answer cannot make a run's usage absurd.
MAX_TOKENS_PER_CALL = 10_000_000


def reported_tokens(value: object) -> int:
    """A token count a provider reported, as usage may hold it: a whole number from 0 to
    MAX_TOKENS_PER_CALL (what a judge answers is untrusted; anything else counts as 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0
    try:
        number = int(float(value)) if not isinstance(value, int) else value
    except (ValueError, OverflowError):
        return 0
    return min(max(number, 0), MAX_TOKENS_PER_CALL)


@dataclass(frozen=True)
class Answer:
    """One answered chat completion. `oversized_bytes`: the response body was over the size
    the transport reads (it then holds no content), so the answer is over the answer limits."""

    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost: float
    oversized_bytes: int | None = None


class ProviderError(Exception):
    """A failed request. `kind` names it as litellm's exceptions do ("AuthenticationError"),
    since users and tests read that name; `message` is the provider's text, unredacted (the
    judge redacts and cuts it before it goes anywhere)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind)  # the provider's text stays out of str() and tracebacks
        self.kind = kind
        self.message = message


class TransientProviderError(ProviderError):
    """Worth another try: `reason` is what the run shows while it waits."""

    def __init__(
        self, kind: str, message: str, reason: str, retry_after: float | None = None
    ) -> None:
        super().__init__(kind, message)
        self.reason = reason
        self.retry_after = retry_after


class RateLimitedByProvider(TransientProviderError):
    """A 429: every caller of the model slows down (the rate limiter's penalty)."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__("RateLimitError", message, RATE_LIMITED, retry_after)


class PermanentProviderError(ProviderError):
    """The provider answered that this request is wrong (a bad key, a too long prompt, an
    unknown model): another try gets the same answer."""


#: litellm's exception names for error statuses: users and tests read them
_PERMANENT_KIND = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
}
_TRANSIENT_KIND = {
    408: "Timeout",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
}
_CONTEXT_WINDOW = (
    "context_length_exceeded",
    "context length",
    "maximum context",
    "too many tokens",
)


def status_error(status: int, message: str, retry_after: float | None) -> ProviderError:
    """What a provider's error status means, on either lane: a 429 slows every caller; a
    408, a 409 and a 5xx are worth another try; anything else says the request is wrong."""
    if status == 429:
        return RateLimitedByProvider(message, retry_after)
    if status in (408, 409) or status >= 500:
        reason = TIMEOUTS if status == 408 else unavailable(status)
        kind = _TRANSIENT_KIND.get(status, "InternalServerError" if status >= 500 else "APIError")
        return TransientProviderError(kind, message, reason, retry_after)
    kind = _PERMANENT_KIND.get(status, "BadRequestError")
    if status == 400 and any(words in message.lower() for words in _CONTEXT_WINDOW):
        kind = "ContextWindowExceededError"
    return PermanentProviderError(kind, message)


class Transport(Protocol):
    def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], timeout: float
    ) -> Answer: ...


def retry_after_seconds(value: Any) -> float | None:
    """A Retry-After header's wait in seconds: a number of seconds or an HTTP-date; None when
    it is neither."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def causes(exc: BaseException, depth: int = 10) -> list[BaseException]:
    """What `exc` was raised from (HTTP clients and litellm wrap the socket's error in theirs)."""
    found: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(found) < depth:
        found.append(cause)
        cause = cause.__cause__ or cause.__context__
    return found
