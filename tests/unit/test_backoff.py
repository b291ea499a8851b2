"""The one retry loop: what it counts, when it gives up for now, and what it never retries."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from recallq.coordination.call_gate import RunCancelled
from recallq.core.errors import (
    PermanentJudgeError,
    ProviderUnavailable,
    RateLimited,
    TransientJudgeError,
)
from recallq.core.usage import Usage
from recallq.judge.backoff import Backoff, call_with_backoff

POLICY = Backoff(max_attempts=4, base_delay=0.5, max_delay=30.0)


def scripted(*outcomes: object) -> tuple[Callable[[], str], list[int]]:
    """An attempt that raises or returns the outcomes in turn; counts its calls."""
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    return attempt, calls


def unavailable(retry_after: float | None = None) -> TransientJudgeError:
    return TransientJudgeError(
        "ServiceUnavailableError: down", "provider unavailable (503)", retry_after
    )


def test_success_after_transient_failures_counts_every_request() -> None:
    slept: list[float] = []
    attempt, calls = scripted(unavailable(), unavailable(), "answer")
    answer, usage = call_with_backoff(attempt, POLICY, sleep=slept.append)
    assert answer == "answer" and len(calls) == 3 and len(slept) == 2
    assert usage == Usage(call_attempts=3, failed_calls=2)


def test_retry_after_is_waited_at_least() -> None:
    slept: list[float] = []
    attempt, _ = scripted(unavailable(retry_after=7.0), "answer")
    call_with_backoff(attempt, POLICY, sleep=slept.append)
    assert 7.0 <= slept[0] <= 7.5


def test_a_pass_whose_attempts_all_fail_waits_instead_of_failing() -> None:
    attempt, calls = scripted(*[unavailable()] * 4)
    with pytest.raises(ProviderUnavailable) as waited:
        call_with_backoff(attempt, POLICY, sleep=lambda _: None)
    assert len(calls) == 4
    assert waited.value.delay == POLICY.max_delay and waited.value.counts_towards_deadline
    assert waited.value.usage == Usage(call_attempts=4, failed_calls=4)
    assert "provider unavailable (503): 4 attempts failed" in str(waited.value)


def test_a_permanent_error_is_not_retried_and_is_counted_as_sent() -> None:
    attempt, calls = scripted(unavailable(), PermanentJudgeError("AuthenticationError: no"))
    with pytest.raises(PermanentJudgeError) as failed:
        call_with_backoff(attempt, POLICY, sleep=lambda _: None)
    assert len(calls) == 2
    assert failed.value.usage == Usage(call_attempts=2, failed_calls=2)


@pytest.mark.parametrize(
    "unsent",
    [RateLimited("m", 12.0), ProviderUnavailable("breaker open", 40.0), RunCancelled("gone")],
    ids=["rate-limited", "breaker-open", "cancelled"],
)
def test_what_stops_a_call_before_it_is_sent_passes_through(unsent: Exception) -> None:
    attempt, calls = scripted(unavailable(), unsent)
    with pytest.raises(type(unsent)) as raised:
        call_with_backoff(attempt, POLICY, sleep=lambda _: None)
    assert len(calls) == 2  # no further attempt: nothing could be sent
    assert getattr(raised.value, "usage", None) == Usage(call_attempts=1, failed_calls=1)
