"""An LLM judge: any model of the models file, speaking judge protocol v1.

A judge call is one call (rate limiter, call gate, circuit breaker, retries, usage and spend,
metrics, and what a failure means): all of that is here, whichever transport carries the
request (recallq.judge.lanes picks it: the direct OpenAI-compatible lane, or litellm). The only
retry loop for judge calls lives in recallq.judge.backoff; the transports retry nothing. An
answer not in the schema's shape raises MalformedAnswer, and whether to send a repair request
is recallq.pipeline's decision. Importing this module imports no provider library.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from recallq.coordination.after_answer import after_answer, unreachable
from recallq.coordination.breaker import CircuitBreaker, Open, Probe
from recallq.coordination.call_gate import CallGate
from recallq.coordination.ratelimit import RateLimiter
from recallq.core.errors import (
    CoordinationUnavailable,
    JudgeError,
    MalformedAnswer,
    PermanentJudgeError,
    ProviderUnavailable,
    TransientJudgeError,
)
from recallq.core.redact import Redactor
from recallq.core.usage import Usage
from recallq.judge import lanes, protocol
from recallq.judge.backoff import Backoff, call_with_backoff
from recallq.judge.base import JudgeReply, PackedReply, Repair
from recallq.judge.models import ModelConfig
from recallq.judge.transport import (
    Answer,
    PermanentProviderError,
    ProviderError,
    RateLimitedByProvider,
    TransientProviderError,
    Transport,
)
from recallq.observability import metrics


def _estimate_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // 4 + 256


@dataclass(frozen=True)
class Completion:
    """One answered call: what the model said and what the call used."""

    content: str | None
    finish_reason: str | None
    usage: Usage
    #: the response was over the size the transport reads (Answer.oversized_bytes)
    oversized_bytes: int | None = None


class LLMJudge:
    def __init__(
        self,
        config: ModelConfig,
        policy: Backoff,
        limiter: RateLimiter,
        gate: CallGate,
        breaker: CircuitBreaker,
        timeout: float,
        redact: Redactor | None = None,
        limits: protocol.AnswerLimits = protocol.DEFAULT_LIMITS,
    ) -> None:
        """`redact` takes secrets out of provider error text and out of answers before they
        are stored or logged (the runtime builds it with every configured key; without one,
        the key of this model and the usual patterns). `limits` bound what an answer may hold.
        The transport is the model's lane's (recallq.judge.lanes)."""
        self.name = config.name
        self._gate = gate
        self._breaker = breaker
        self._policy = policy
        self._limiter = limiter
        self._timeout = timeout
        self._limits = limits
        own = [value for value in config.resolved_params().values() if isinstance(value, str)]
        self._redact = redact or Redactor([*own, *config.secret_values()])
        self._transport: Transport = lanes.build_transport(config, limits.answer_bytes)

    def extract_claims(
        self, ground_truth: str, run_id: str, repair: Repair | None = None
    ) -> JudgeReply:
        messages = protocol.extraction_messages(ground_truth)
        return self._ask(protocol.EXTRACTION, messages, run_id, repair)

    def extract_claims_packed(self, ground_truths: list[str], run_id: str) -> PackedReply:
        messages = protocol.packed_extraction_messages(ground_truths)
        answer = self._complete(protocol.EXTRACTION_PACKED, messages, run_id)
        data = self._parse(protocol.EXTRACTION_PACKED, answer)
        claims = protocol.packed_claims(data, ground_truths, self._limits)
        return PackedReply(claims, answer.usage)

    def attribute(
        self, claims: list[str], contexts: list[str], run_id: str, repair: Repair | None = None
    ) -> JudgeReply:
        messages = protocol.attribution_messages(claims, contexts)
        return self._ask(protocol.ATTRIBUTION, messages, run_id, repair)

    def judge_relevance(
        self,
        ground_truth: str,
        contexts: list[tuple[int, str]],
        run_id: str,
        repair: Repair | None = None,
    ) -> JudgeReply:
        messages = protocol.relevance_messages(ground_truth, contexts)
        return self._ask(protocol.RELEVANCE, messages, run_id, repair)

    def _ask(
        self, schema: str, messages: list[dict[str, str]], run_id: str, repair: Repair | None
    ) -> JudgeReply:
        if repair is not None:
            messages = protocol.repair_messages(messages, repair.answer, repair.problem)
        answer = self._complete(schema, messages, run_id, repair=repair is not None)
        return JudgeReply(self._parse(schema, answer), answer.usage)

    def _parse(self, schema: str, completion: Completion) -> dict[str, Any]:
        """The answer parsed within the limits, every configured secret out of it; else
        MalformedAnswer, charged with the call (an answer over the limits is not repairable,
        and is not carried)."""
        if completion.oversized_bytes is not None:
            problem = (
                f"the judge's response is {completion.oversized_bytes:,} bytes: its answer is "
                f"over the limit of {self._limits.answer_bytes:,} (RECALLQ_JUDGE_MAX_ANSWER_BYTES)"
            )
            raise MalformedAnswer(schema, None, problem, completion.usage, repairable=False)
        try:
            return protocol.parse_answer(
                schema, completion.content, completion.finish_reason, self._limits, self._redact
            )
        except protocol.AnswerTooLarge as too_large:
            raise MalformedAnswer(
                schema, None, str(too_large), completion.usage, repairable=False
            ) from None
        except protocol.ProtocolError as problem:
            raise MalformedAnswer(
                schema, completion.content, str(problem), completion.usage
            ) from None

    def _complete(
        self, schema: str, messages: list[dict[str, str]], run_id: str, repair: bool = False
    ) -> Completion:
        """`repair`: this is the repair request of a malformed answer (its metrics say so)."""
        estimate = _estimate_tokens(messages)
        stage = protocol.STAGE_OF[schema]

        def attempt() -> Answer:
            probe: Probe | None = None
            sent = 0.0
            try:
                probe = self._may_call()
                if probe is None:  # one probe goes whatever the limiter says: it must learn
                    self._limiter.acquire(self.name, estimate)
                with self._gate.call(run_id):
                    sent = time.monotonic()
                    answer = self._transport.complete(
                        messages, protocol.response_format(schema), self._timeout
                    )
            except TransientProviderError as exc:
                metrics.judge_call(self.name, stage, "transient_error", time.monotonic() - sent)
                if isinstance(exc, RateLimitedByProvider):
                    metrics.provider_rate_limited(self.name)
                    penalise = partial(self._limiter.penalise, self.name, exc.retry_after)
                    after_answer("the rate limiter's penalty", penalise)
                failure = partial(
                    self._breaker.record_failure, self.name, exc.reason, exc.retry_after, probe
                )
                after_answer("the circuit breaker's record", failure)
                raise TransientJudgeError(
                    self._said(exc), exc.reason, exc.retry_after
                ) from None  # the provider's text, unredacted, stays out of every traceback
            except (
                PermanentProviderError
            ) as exc:  # the provider answered: it is up, this call is wrong
                metrics.judge_call(self.name, stage, "permanent_error", time.monotonic() - sent)
                record = partial(self._breaker.record_success, self.name, probe)
                after_answer("the circuit breaker's record", record)
                raise PermanentJudgeError(self._said(exc)) from None
            except JudgeError:  # not sent (no rate-limit room, a cancelled run)
                if probe is not None:
                    self._breaker.release(self.name, probe)
                raise
            except Exception as exc:
                if sent or not unreachable(exc):
                    raise
                # Redis failed before the call went: nothing was sent. The item waits (its
                # earlier calls' usage is written with it) instead of losing that usage.
                if probe is not None:
                    after_answer(
                        "the probe's release", partial(self._breaker.release, self.name, probe)
                    )
                raise CoordinationUnavailable(f"{type(exc).__name__}: {exc}") from None
            answered = "repaired" if repair else "answered"
            metrics.judge_call(self.name, stage, answered, time.monotonic() - sent)
            record = partial(self._breaker.record_success, self.name, probe)
            after_answer("the circuit breaker's record", record)
            return answer

        answer, attempts = call_with_backoff(attempt, self._policy)
        prompt, completion, cost = answer.prompt_tokens, answer.completion_tokens, answer.cost
        # the answer was billed: nothing after it may drop it (recallq.coordination.after_answer)
        settle = partial(self._limiter.settle, self.name, estimate, prompt + completion)
        after_answer("the rate limiter's correction", settle)
        tokens = prompt + completion
        after_answer("the run's spend", partial(self._gate.charge, run_id, cost, tokens))
        metrics.judge_usage(self.name, stage, prompt, completion, cost)
        usage = Usage(1, prompt, completion, cost) + attempts
        return Completion(answer.content, answer.finish_reason, usage, answer.oversized_bytes)

    def _said(self, exc: ProviderError) -> str:
        """What the provider said, as users read it: its kind, then its message redacted."""
        return f"{exc.kind}: {_clean(exc.message, self._redact)}"

    def _may_call(self) -> Probe | None:
        """Whether the model's circuit breaker lets a call go: None (closed) or the probe;
        while it is open, the item waits (ProviderUnavailable) until the next probe may go,
        plus a little jitter so the queue does not return all at once."""
        decision = self._breaker.before_call(self.name)
        if isinstance(decision, Open):
            wait = max(0.0, decision.until - time.time()) + random.uniform(0.0, 2.0)
            raise ProviderUnavailable(
                f"{decision.reason}: calls to {self.name} paused by its circuit breaker",
                wait,
                reason=decision.reason,
            )
        return decision if isinstance(decision, Probe) else None


def _clean(message: str, redact: Redactor) -> str:
    """The provider's message without litellm's long hints, and without secrets: providers
    echo the request's Authorization header in their 401 messages. Redacted before it is
    cut, so a cut never leaves half a key behind."""
    return redact(message).split("\n", 1)[0][:300]
