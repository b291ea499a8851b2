"""The litellm transport: any provider litellm knows (recallq.judge.lanes sends every model the
direct OpenAI-compatible lane does not take here).

Importing this module imports litellm (about 6 s of CPU) and applies recallq's patches to it
(recallq.patches.prepare_litellm): only a process with a model on this lane does. litellm's
and the OpenAI SDK's own retries are switched off: the one retry loop is recallq.judge.backoff.
"""

from __future__ import annotations

import math
import os
from typing import Any

from recallq import patches
from recallq.judge.prices import PRICE_PARAMS
from recallq.judge.transport import (
    CONNECTION_ERRORS,
    CONNECTION_REFUSED,
    TIMEOUTS,
    Answer,
    PermanentProviderError,
    RateLimitedByProvider,
    TransientProviderError,
    causes,
    reported_tokens,
    retry_after_seconds,
    status_error,
    unavailable,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
patches.prepare_litellm()  # MissingExtra, saying how to install it, without litellm

import httpx  # noqa: E402
import litellm  # noqa: E402  (after the variable above)
import openai  # noqa: E402

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


class LitellmTransport:
    def __init__(self, params: dict[str, Any]) -> None:
        """`params`: the model's litellm_params, resolved (recallq.judge.models)."""
        patches.prepare_litellm()  # again: its globals, should anything have changed them
        self._params = params
        model = params["model"]
        # priced by litellm's map, or by prices the models file gives (litellm uses them)
        self._priced = (
            model in litellm.model_cost
            or model.split("/", 1)[-1] in litellm.model_cost
            or any(params.get(name) is not None for name in PRICE_PARAMS)
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

    def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], timeout: float
    ) -> Answer:
        try:
            with patches.without_litellm_callbacks():
                response = litellm.completion(
                    **self._params,
                    messages=messages,
                    response_format=response_format,
                    temperature=0,
                    timeout=timeout,
                    num_retries=0,
                    max_retries=0,
                )
        except litellm.RateLimitError as exc:
            raise RateLimitedByProvider(_message(exc), _retry_after(exc)) from None
        except _TRANSIENT as exc:
            kind = type(exc).__name__
            raise TransientProviderError(
                kind, _message(exc), _reason(exc), _retry_after(exc)
            ) from None  # the provider's text, unredacted, stays out of every traceback
        except _PERMANENT as exc:
            raise PermanentProviderError(type(exc).__name__, _message(exc)) from None
        except (litellm.APIError, openai.APIStatusError) as exc:
            # a status litellm has no exception of its own for (a 403 of some providers, a
            # 409): what it means is the status's, as on the direct lane
            status = getattr(exc, "status_code", None)
            connection = _connection_reason(exc)
            if isinstance(status, int) and 400 <= status < 600 and connection is None:
                raise status_error(status, _message(exc), _retry_after(exc)) from None
            raise TransientProviderError(
                type(exc).__name__, _message(exc), connection or unavailable(None)
            ) from None
        choices = getattr(response, "choices", None)
        choice = choices[0] if choices else None
        message = getattr(choice, "message", None)
        if message is None:
            # litellm hands back nothing for an error status it does not read (a 422): the
            # provider answered, and refused this request
            raise PermanentProviderError(
                "APIError", "the provider refused the request (litellm gave back no response)"
            )
        reported = getattr(response, "usage", None)
        prompt = reported_tokens(getattr(reported, "prompt_tokens", 0))
        completion = reported_tokens(getattr(reported, "completion_tokens", 0))
        cost = float(response._hidden_params.get("response_cost") or 0.0) if self._priced else 0.0
        cost = cost if math.isfinite(cost) and cost > 0 else 0.0
        finish = getattr(choice, "finish_reason", None)
        return Answer(message.content, finish, prompt, completion, cost)


def _message(exc: Exception) -> str:
    return str(getattr(exc, "message", None) or exc)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "headers", None) or {}
    try:
        return retry_after_seconds(headers.get("retry-after") or headers.get("Retry-After"))
    except AttributeError:
        return None


def _reason(exc: Exception) -> str:
    """What a transient failure means, in the words the run shows while it waits."""
    if isinstance(exc, litellm.Timeout):
        return TIMEOUTS
    return _connection_reason(exc) or unavailable(getattr(exc, "status_code", None))


def _connection_reason(exc: Exception) -> str | None:
    """The reason of a failure to reach the provider at all, whatever status litellm gave it
    (it reports a refused connection as a 500); None when the provider answered."""
    chain = causes(exc)
    if any(isinstance(cause, ConnectionRefusedError) for cause in chain):
        return CONNECTION_REFUSED
    if isinstance(exc, litellm.APIConnectionError) or any(
        isinstance(cause, httpx.ConnectError | openai.APIConnectionError) for cause in chain
    ):
        return CONNECTION_ERRORS
    return None
