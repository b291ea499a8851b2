"""The litellm adapter: any provider in the models file, speaking judge protocol v1.

The only retry loop for judge calls lives in worker.retry; litellm's and the OpenAI SDK's own
retries are switched off here so attempts never multiply.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from recallq.model_registry import ModelConfig
from worker.gate import CallGate
from worker.judge import protocol
from worker.judge.base import JudgeReply, PermanentJudgeError, TransientJudgeError, Usage
from worker.ratelimit import RateLimiter
from worker.retry import RetryPolicy, call_with_retries

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402  (after the env var above: no network fetch of the price map)
from litellm._internal_context import internal_sub_call  # noqa: E402
from litellm._service_logger import ServiceLogging  # noqa: E402
from litellm.litellm_core_utils import litellm_logging  # noqa: E402

litellm.suppress_debug_info = True
# litellm logs several INFO lines per call (and Celery's worker echoes its handler's output a
# second time): at this volume that is CPU spent on noise. Its warnings still come through.
for _name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
    logging.getLogger(_name).setLevel(logging.WARNING)
litellm.telemetry = False
litellm.drop_params = True  # providers without json_schema get JSON mode or prompt-only

# litellm prices every response, searching its whole price map when the model has no entry:
# about 3.5 ms of CPU per call, a quarter of its overhead. For models litellm has no price
# for (local servers, the test stub) the answer is known to be nothing, so skip the search.
_UNPRICED: set[str] = set()


def _skip_pricing_of_unpriced_models() -> None:
    logging_class = litellm_logging.Logging
    original = getattr(logging_class, "response_cost_calculator", None)
    if original is None or getattr(original, "_recallq", False):
        return

    def response_cost_calculator(self: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        name = kwargs.get("litellm_model_name") or getattr(self, "model", None)
        if name in _UNPRICED:
            return None
        return original(self, result, *args, **kwargs)

    response_cost_calculator._recallq = True  # type: ignore[attr-defined]
    logging_class.response_cost_calculator = response_cost_calculator


_skip_pricing_of_unpriced_models()


def _skip_service_events_without_listeners() -> None:
    """litellm times every provider request and hands the timing to its "service callbacks"
    (Prometheus, Datadog, OTel). It does so through an event loop, and a worker thread has
    none, so each call built and tore down a fresh loop (a socket pair, an epoll, a dozen
    syscalls) for callbacks that recallq never registers. With none registered, skip it."""
    original = ServiceLogging._dispatch_from_sync
    if getattr(original, "_recallq", False):
        return

    def dispatch_from_sync(hook: Any) -> None:
        if litellm.service_callback:
            original(hook)

    dispatch_from_sync._recallq = True  # type: ignore[attr-defined]
    ServiceLogging._dispatch_from_sync = staticmethod(dispatch_from_sync)  # type: ignore[method-assign]


_skip_service_events_without_listeners()

# After every call litellm queues a job on its own thread pool that builds a logging payload
# for success callbacks (about 0.4 ms of CPU, plus a thread hand-off). recallq registers no
# litellm callbacks and reads usage and cost off the response, so its calls run as litellm's
# "internal sub-calls", which skip that job. Pricing is unaffected: it happens in the caller.
_without_litellm_callbacks = internal_sub_call

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
        self.name = config.name
        self._gate = gate
        self._params = config.resolved_params()
        self._policy = policy
        self._limiter = limiter
        self._timeout = timeout
        model = self._params["model"]
        self._priced = model in litellm.model_cost or model.split("/", 1)[-1] in litellm.model_cost
        if not self._priced:
            _UNPRICED.update((model, model.split("/", 1)[-1]))
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

    def extract_claims(self, ground_truth: str) -> JudgeReply:
        return self._ask(protocol.EXTRACTION, protocol.extraction_messages(ground_truth))

    def attribute(self, claims: list[str], contexts: list[str]) -> JudgeReply:
        return self._ask(protocol.ATTRIBUTION, protocol.attribution_messages(claims, contexts))

    def _ask(self, schema: str, messages: list[dict[str, str]]) -> JudgeReply:
        """One call, plus one repair request when the answer is malformed."""
        usage = Usage()
        content, finish_reason = self._complete(schema, messages, usage)
        try:
            return JudgeReply(protocol.parse_answer(schema, content, finish_reason), usage)
        except protocol.ProtocolError as first:
            repair = protocol.repair_messages(messages, content, str(first))
            content, finish_reason = self._complete(schema, repair, usage)
            try:
                return JudgeReply(protocol.parse_answer(schema, content, finish_reason), usage)
            except protocol.ProtocolError as second:
                raise PermanentJudgeError(
                    f"{schema}: malformed answer after a repair request: {second}", usage=usage
                ) from second

    def _complete(
        self, schema: str, messages: list[dict[str, str]], usage: Usage
    ) -> tuple[str | None, str | None]:
        estimate = _estimate_tokens(messages)

        def attempt() -> Any:
            self._limiter.acquire(self.name, estimate)
            try:
                with self._gate.call(), _without_litellm_callbacks():
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

        response = call_with_retries(attempt, self._policy, usage)
        reported = getattr(response, "usage", None)
        prompt = getattr(reported, "prompt_tokens", 0) or 0
        completion = getattr(reported, "completion_tokens", 0) or 0
        self._limiter.settle(self.name, estimate, prompt + completion)
        usage.llm_calls += 1
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        if self._priced:
            usage.cost_usd += float(response._hidden_params.get("response_cost") or 0.0)
        choice = response.choices[0]
        return choice.message.content, choice.finish_reason


def _clean(exc: Exception) -> str:
    """The provider's message without litellm's long hints; never includes keys."""
    message = str(getattr(exc, "message", None) or exc)
    return message.split("\n", 1)[0][:300]
