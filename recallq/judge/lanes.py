"""Which transport a model's judge calls take: the one rule.

The direct lane (recallq.judge.openai_compatible: one POST over a pooled HTTP client, about
1 ms of CPU a call) serves a model whose `litellm_params.model` names an OpenAI-compatible
provider (`openai/`, `hosted_vllm/`: litellm sends both the same request) and whose other
params are all ones that lane understands. Every other model, and every model whose models
file entry says `transport: litellm`, takes litellm (recallq.judge.litellm_transport, 4-5 ms a
call, and seconds of CPU to import): a process whose models all take the direct lane never
imports litellm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from recallq.judge import prices
from recallq.judge.models import AUTO, LEXICAL, JudgeModelsError, ModelConfig
from recallq.judge.transport import Transport

if TYPE_CHECKING:
    from recallq.judge.openai_compatible import Endpoint

#: litellm provider prefixes that send an OpenAI chat completion as it is
DIRECT_PROVIDERS = ("openai/", "hosted_vllm/")
#: litellm params the direct lane honours (anything else, e.g. `api_version` or `max_tokens`,
#: is litellm's to translate)
DIRECT_PARAMS = frozenset(
    {
        "model",
        "api_base",
        "api_key",
        "organization",
        "extra_headers",
        *prices.PRICE_PARAMS,
    }
)
OPENAI_BASE = "https://api.openai.com/v1"


def takes_direct_lane(config: ModelConfig) -> bool:
    params = config.litellm_params
    model = params.get("model")
    return (
        config.transport == AUTO
        and isinstance(model, str)
        and model.startswith(DIRECT_PROVIDERS)
        and set(params) <= DIRECT_PARAMS
        and isinstance(params.get("extra_headers") or {}, dict)
    )


def needs_litellm(models: Iterable[ModelConfig]) -> bool:
    """Whether calling these models imports litellm (the offline judge needs nothing)."""
    return any(m.name != LEXICAL and not takes_direct_lane(m) for m in models)


def build_transport(config: ModelConfig, max_answer_bytes: int) -> Transport:
    """The model's transport; JudgeModelsError when its params cannot work (a key missing
    from the environment, no api_base where litellm would need one too)."""
    params = config.resolved_params()
    if not takes_direct_lane(config):
        from recallq.judge.litellm_transport import LitellmTransport  # imports litellm

        return LitellmTransport(params)
    from recallq.judge.openai_compatible import OpenAICompatibleTransport

    priced = dataclasses.replace(config, litellm_params=params)
    return OpenAICompatibleTransport(
        _endpoint(config, params), prices.online_price(priced), max_answer_bytes
    )


def _endpoint(config: ModelConfig, params: dict[str, Any]) -> Endpoint:
    """Where the model's calls go, with litellm's defaults for its provider."""
    from recallq.judge.openai_compatible import Endpoint

    provider, model = params["model"].split("/", 1)
    base = params.get("api_base") or config.provider_default("api_base")
    key = params.get("api_key") or config.provider_default("api_key")
    if provider == "openai":
        base = base or OPENAI_BASE
    elif not key:
        key = "fake-api-key"  # litellm's for hosted_vllm: such servers often check no key
    if not base:
        raise JudgeModelsError(
            f"model {config.name!r}: litellm_params.api_base is required (or HOSTED_VLLM_API_BASE)"
        )
    if urlsplit(str(base)).scheme not in ("http", "https"):
        raise JudgeModelsError(
            f"model {config.name!r}: litellm_params.api_base must be an http:// or https:// URL"
        )
    if not key:
        raise JudgeModelsError(
            f"model {config.name!r}: no API key (litellm_params.api_key, or OPENAI_API_KEY)"
        )
    headers = {"Authorization": f"Bearer {key}"}
    if params.get("organization"):
        headers["OpenAI-Organization"] = str(params["organization"])
    headers.update({str(k): str(v) for k, v in (params.get("extra_headers") or {}).items()})
    return Endpoint(f"{str(base).rstrip('/')}/chat/completions", model, headers)
