"""The litellm adapter: any provider in the models file, speaking judge protocol v1.

Importing this module imports litellm (about 6 s of CPU): only code that calls a model does.
The only retry loop for judge calls lives in recallq.retry; litellm's and the OpenAI SDK's own
retries are switched off here so attempts never multiply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from recallq import patches
from recallq.coordination.gate import CallGate
from recallq.coordination.ratelimit import RateLimiter
from recallq.judge import protocol
from recallq.judge.base import (
    JudgeError,
    JudgeReply,
    PermanentJudgeError,
    TransientJudgeError,
    Usage,
)
from recallq.model_registry import ModelConfig
from recallq.retry import RetryPolicy, call_with_retries

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import litellm  # noqa: E402  (after the variable above)

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


def _estimate_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // 4 + 256


@dataclass(frozen=True)
class Completion:
    """One answered call: what the model said and what the call used."""

    content: str | None
    finish_reason: str | None
    usage: Usage


class LLMJudge:
    prompt_version = protocol.PROMPT_VERSION

    def __init__(
        self,
        config: ModelConfig,
        policy: RetryPolicy,
        limiter: RateLimiter,
        gate: CallGate,
        timeout: float,
    ) -> None:
        patches.prepare_litellm()
        self.name = config.name
        self._gate = gate
        self._params = config.resolved_params()
        self._policy = policy
        self._limiter = limiter
        self._timeout = timeout
        model = self._params["model"]
        self._priced = model in litellm.model_cost or model.split("/", 1)[-1] in litellm.model_cost
        if not self._priced:
            patches.mark_unpriced(model, model.split("/", 1)[-1])
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

    def extract_claims(self, ground_truth: str, run_id: str) -> JudgeReply:
        messages = protocol.extraction_messages(ground_truth)
        return self._ask(protocol.EXTRACTION, messages, run_id)

    def attribute(self, claims: list[str], contexts: list[str], run_id: str) -> JudgeReply:
        messages = protocol.attribution_messages(claims, contexts)
        return self._ask(protocol.ATTRIBUTION, messages, run_id)

    def _ask(self, schema: str, messages: list[dict[str, str]], run_id: str) -> JudgeReply:
        """One call, plus one repair request when the answer is malformed. Whatever the repair
        request does, the first call was answered and is charged."""
        first = self._complete(schema, messages, run_id)
        try:
            return JudgeReply(
                protocol.parse_answer(schema, first.content, first.finish_reason), first.usage
            )
        except protocol.ProtocolError as problem:
            repair = protocol.repair_messages(messages, first.content, str(problem))
        try:
            second = self._complete(schema, repair, run_id)
        except JudgeError as exc:
            raise exc.after(first.usage) from exc
        usage = first.usage + second.usage
        try:
            return JudgeReply(
                protocol.parse_answer(schema, second.content, second.finish_reason), usage
            )
        except protocol.ProtocolError as still:
            raise PermanentJudgeError(
                f"{schema}: malformed answer after a repair request: {still}", usage
            ) from still

    def _complete(self, schema: str, messages: list[dict[str, str]], run_id: str) -> Completion:
        estimate = _estimate_tokens(messages)

        def attempt() -> Any:
            self._limiter.acquire(self.name, estimate)
            try:
                with self._gate.call(run_id), patches.without_litellm_callbacks():
                    return litellm.completion(
                        **self._params,
                        messages=messages,
                        response_format=protocol.response_format(schema),
                        temperature=0,
                        timeout=self._timeout,
                        num_retries=0,
                        max_retries=0,
                    )
            except _TRANSIENT as exc:
                retry_after = _retry_after(exc)
                if isinstance(exc, litellm.RateLimitError):
                    self._limiter.penalise(self.name, retry_after)
                raise TransientJudgeError(
                    f"{type(exc).__name__}: {_clean(exc)}", retry_after
                ) from exc
            except _PERMANENT as exc:
                raise PermanentJudgeError(f"{type(exc).__name__}: {_clean(exc)}") from exc

        response = call_with_retries(attempt, self._policy)
        reported = getattr(response, "usage", None)
        prompt = getattr(reported, "prompt_tokens", 0) or 0
        completion = getattr(reported, "completion_tokens", 0) or 0
        self._limiter.settle(self.name, estimate, prompt + completion)
        cost = float(response._hidden_params.get("response_cost") or 0.0) if self._priced else 0.0
        choice = response.choices[0]
        return Completion(
            choice.message.content, choice.finish_reason, Usage(1, prompt, completion, cost)
        )


def _parse(schema: str, completion: Completion) -> dict[str, Any]:
    return protocol.parse_answer(schema, completion.content, completion.finish_reason)


def _clean(exc: Exception) -> str:
    """The provider's message without litellm's long hints."""
    message = str(getattr(exc, "message", None) or exc)
    return message.split("\n", 1)[0][:300]
