"""The litellm adapter: any provider in the models file, speaking judge protocol v1.

Importing this module imports litellm (about 6 s of CPU): only code that calls a model does.
The only retry loop for judge calls lives in recallq.judge.backoff; litellm's and the OpenAI SDK's
own retries are switched off here so attempts never multiply. A judge call is one call (limits,
call gate, circuit breaker, retries); an answer not in the schema's shape raises
MalformedAnswer, and whether to send a repair request is recallq.pipeline's decision.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from recallq import patches
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
from recallq.judge import protocol
from recallq.judge.backoff import Backoff, call_with_backoff
from recallq.judge.base import JudgeReply, PackedReply, Repair
from recallq.judge.models import ModelConfig
from recallq.observability import metrics

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import httpx
import litellm  # after the variable above
import openai

_TRANSIENT = (
    litellm.RateLimitError,
    litellm.Timeout,
    litellm.APIConnectionError,
    litellm.InternalServerError,
    litellm.ServiceUnavailableError,
    litellm.BadGatewayError,
)
_PERMANENT = (
    litellm.ContextWindowExceededError,
    litellm.BadRequestError,
    litellm.AuthenticationError,
    litellm.PermissionDeniedError,
    litellm.NotFoundError,
    litellm.UnprocessableEntityError,
)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "headers", None) or {}
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def _reason(exc: Exception) -> str:
    """What a transient failure means, in the words the run shows while it waits."""
    if isinstance(exc, litellm.RateLimitError):
        return "rate limited (429)"
    if isinstance(exc, litellm.Timeout):
        return "timeouts"
    causes = _causes(exc)
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        # litellm reports a refused connection as a 500: it is nothing listening at api_base
        return "connection refused (is the model's api_base right?)"
    if isinstance(exc, litellm.APIConnectionError) or any(
        isinstance(cause, httpx.ConnectError | openai.APIConnectionError) for cause in causes
    ):
        return "connection errors"
    status = getattr(exc, "status_code", None)
    return f"provider unavailable ({status})" if status else "provider unavailable"


def _causes(exc: BaseException, depth: int = 10) -> list[BaseException]:
    """What `exc` was raised from (litellm wraps the HTTP client's error in its own)."""
    found: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(found) < depth:
        found.append(cause)
        cause = cause.__cause__ or cause.__context__
    return found


#: litellm params that price a model litellm's own price map does not know
PRICE_PARAMS = ("input_cost_per_token", "output_cost_per_token")


def _estimate_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // 4 + 256


@dataclass(frozen=True)
class Completion:
    """One answered call: what the model said and what the call used."""

    content: str | None
    finish_reason: str | None
    usage: Usage


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
        the key of this model and the usual patterns). `limits` bound what an answer may hold."""
        patches.prepare_litellm()
        self.name = config.name
        self._gate = gate
        self._breaker = breaker
        self._params = config.resolved_params()
        self._policy = policy
        self._limiter = limiter
        self._timeout = timeout
        self._limits = limits
        self._redact = redact or Redactor(
            value for value in self._params.values() if isinstance(value, str)
        )
        model = self._params["model"]
        # priced by litellm's map, or by prices the models file gives (litellm uses them)
        self._priced = (
            model in litellm.model_cost
            or model.split("/", 1)[-1] in litellm.model_cost
            or any(self._params.get(name) is not None for name in PRICE_PARAMS)
        )
        names = (model, model.split("/", 1)[-1])
        if self._priced:
            patches.mark_priced(*names)
        else:
            patches.mark_unpriced(*names)
        self._warm_up()

    def _warm_up(self) -> None:
        """litellm initialises lazily on its first call (hundreds of ms). Do it now, offline:
        otherwise first calls that waited for it leave together, bunching the rate limit's
        evenly spaced slots into a burst."""
        litellm.completion(
            **self._params,
            messages=[{"role": "user", "content": "warm-up"}],
            mock_response='{"claims": []}',
        )

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

        def attempt() -> Any:
            probe: Probe | None = None
            sent = 0.0
            try:
                probe = self._may_call()
                if probe is None:  # one probe goes whatever the limiter says: it must learn
                    self._limiter.acquire(self.name, estimate)
                with self._gate.call(run_id), patches.without_litellm_callbacks():
                    sent = time.monotonic()
                    response = litellm.completion(
                        **self._params,
                        messages=messages,
                        response_format=protocol.response_format(schema),
                        temperature=0,
                        timeout=self._timeout,
                        num_retries=0,
                        max_retries=0,
                    )
            except _TRANSIENT as exc:
                metrics.judge_call(self.name, stage, "transient_error", time.monotonic() - sent)
                reason, retry_after = _reason(exc), _retry_after(exc)
                if isinstance(exc, litellm.RateLimitError):
                    metrics.provider_rate_limited(self.name)
                    penalise = partial(self._limiter.penalise, self.name, retry_after)
                    after_answer("the rate limiter's penalty", penalise)
                failure = partial(
                    self._breaker.record_failure, self.name, reason, retry_after, probe
                )
                after_answer("the circuit breaker's record", failure)
                raise TransientJudgeError(
                    f"{type(exc).__name__}: {_clean(exc, self._redact)}", reason, retry_after
                ) from None  # the provider's text, unredacted, stays out of every traceback
            except _PERMANENT as exc:  # the provider answered: it is up, this call is wrong
                metrics.judge_call(self.name, stage, "permanent_error", time.monotonic() - sent)
                record = partial(self._breaker.record_success, self.name, probe)
                after_answer("the circuit breaker's record", record)
                message = f"{type(exc).__name__}: {_clean(exc, self._redact)}"
                raise PermanentJudgeError(message) from None
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
            return response

        response, attempts = call_with_backoff(attempt, self._policy)
        reported = getattr(response, "usage", None)
        prompt = getattr(reported, "prompt_tokens", 0) or 0
        completion = getattr(reported, "completion_tokens", 0) or 0
        # the answer was billed: nothing after it may drop it (recallq.coordination.after_answer)
        settle = partial(self._limiter.settle, self.name, estimate, prompt + completion)
        after_answer("the rate limiter's correction", settle)
        cost = float(response._hidden_params.get("response_cost") or 0.0) if self._priced else 0.0
        tokens = prompt + completion
        after_answer("the run's spend", partial(self._gate.charge, run_id, cost, tokens))
        metrics.judge_usage(self.name, stage, prompt, completion, cost)
        choice = response.choices[0]
        usage = Usage(1, prompt, completion, cost) + attempts
        return Completion(choice.message.content, choice.finish_reason, usage)

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


def _clean(exc: Exception, redact: Redactor) -> str:
    """The provider's message without litellm's long hints, and without secrets: providers
    echo the request's Authorization header in their 401 messages. Redacted before it is
    cut, so a cut never leaves half a key behind."""
    message = redact(str(getattr(exc, "message", None) or exc))
    return message.split("\n", 1)[0][:300]
