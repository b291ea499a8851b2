"""Judge models from RECALLQ_MODELS_FILE: names that runs refer to, and their litellm params.

Read by the API (to reject unknown models) and by workers (to call them). Server-side only:
endpoints and keys never leave this module's callers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LEXICAL = "local/lexical"
#: a model's `transport`: the lane recallq.judge.lanes picks (AUTO), or litellm whatever it is
AUTO, LITELLM = "auto", "litellm"
TRANSPORTS = (AUTO, LITELLM)
#: where litellm finds a provider's api_base and api_key that the models file does not give
#: (the direct lane, recallq.judge.lanes, finds them there too)
PROVIDER_ENVIRONMENT: dict[str, dict[str, tuple[str, ...]]] = {
    "openai": {"api_base": ("OPENAI_BASE_URL", "OPENAI_API_BASE"), "api_key": ("OPENAI_API_KEY",)},
    "hosted_vllm": {"api_base": ("HOSTED_VLLM_API_BASE",), "api_key": ("HOSTED_VLLM_API_KEY",)},
}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    litellm_params: dict[str, Any] = field(default_factory=dict)
    rpm: int | None = None
    tpm: int | None = None
    # ground truths per extraction call, at most RECALLQ_EXTRACTION_PACK (None: that setting)
    extraction_pack: int | None = None
    #: the provider's Batch API may be used (runs with "mode": "batch"; recallq.batch.lane)
    batch: bool = False
    #: share of the online price a batch request saves (None: litellm's batch price when its
    #: price map has one, else 0.5)
    batch_discount: float | None = None
    #: "litellm" sends every call through litellm, even where the direct lane could
    #: (recallq.judge.lanes)
    transport: str = AUTO

    def resolved_params(self) -> dict[str, Any]:
        """litellm params with `os.environ/NAME` values replaced by the variable's value; an
        unset variable is an error that names it (a set but empty one is kept)."""
        return {key: self._resolve(key, value) for key, value in self.litellm_params.items()}

    def _resolve(self, key: str, value: Any) -> Any:
        if not (isinstance(value, str) and value.startswith("os.environ/")):
            return value
        variable = value.removeprefix("os.environ/")
        if variable not in os.environ:
            raise JudgeModelsError(
                f"model {self.name!r}: {variable} (for litellm_params.{key}) is not set in "
                "this process's environment"
            )
        return os.environ[variable]

    def provider_default(self, param: str) -> str | None:
        """The value litellm would take for `param` (api_base, api_key) from the environment
        when the models file gives none: PROVIDER_ENVIRONMENT, the first variable set."""
        provider = str(self.litellm_params.get("model", "")).split("/", 1)[0]
        for variable in PROVIDER_ENVIRONMENT.get(provider, {}).get(param, ()):
            if value := os.environ.get(variable):
                return value
        return None

    def secret_values(self) -> list[str]:
        """The resolved values of this model's params that may be secret: every value taken
        from the environment, and every value of a param whose name says secret (`api_key`,
        `aws_secret_access_key`, ...). Unset variables are skipped."""
        found = []
        for key, value in self.litellm_params.items():
            from_env = isinstance(value, str) and value.startswith("os.environ/")
            if not (from_env or _SECRET_PARAM.search(key)):
                continue
            try:
                resolved = self._resolve(key, value)
            except JudgeModelsError:
                continue
            if isinstance(resolved, str):
                found.append(resolved)
        default_key = self.provider_default("api_key")
        if "api_key" not in self.litellm_params and default_key:
            found.append(default_key)  # the key the call sends all the same
        return found


_SECRET_PARAM = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)


class JudgeModelsError(ValueError):
    pass


def load_models(path: Path | None) -> dict[str, ModelConfig]:
    models = {LEXICAL: ModelConfig(LEXICAL)}
    if path is None:
        return models
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise JudgeModelsError(f"cannot read models file {path}: {exc}") from exc
    for entry in raw.get("models") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise JudgeModelsError(f"models file {path}: every model needs a name")
        params = entry.get("litellm_params") or {}
        if not isinstance(params, dict) or "model" not in params:
            raise JudgeModelsError(f"model {entry['name']}: litellm_params.model is required")
        pack = entry.get("extraction_pack")
        if pack is not None and (isinstance(pack, bool) or not isinstance(pack, int) or pack < 1):
            raise JudgeModelsError(f"model {entry['name']}: extraction_pack must be 1 or more")
        models[entry["name"]] = ModelConfig(
            name=entry["name"],
            litellm_params=params,
            rpm=entry.get("rpm"),
            tpm=entry.get("tpm"),
            extraction_pack=pack,
            transport=_transport(entry),
            **_batch_fields(entry),
        )
    return models


def _transport(entry: dict[str, Any]) -> str:
    transport = entry.get("transport", AUTO)
    if transport not in TRANSPORTS:
        raise JudgeModelsError(
            f"model {entry['name']}: transport must be one of {', '.join(TRANSPORTS)}, "
            f"not {transport!r}"
        )
    return str(transport)


def _batch_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """`batch: true` and `batch_discount` (a share between 0 and 1) of a models file entry."""
    name, batch, discount = entry["name"], entry.get("batch", False), entry.get("batch_discount")
    if not isinstance(batch, bool):
        raise JudgeModelsError(f"model {name}: batch must be true or false")
    if discount is not None and (
        isinstance(discount, bool) or not isinstance(discount, int | float) or not 0 <= discount < 1
    ):
        raise JudgeModelsError(f"model {name}: batch_discount must be a number from 0 to 1")
    return {"batch": batch, "batch_discount": None if discount is None else float(discount)}


def batch_models(models: Mapping[str, ModelConfig]) -> list[str]:
    """The names of the models whose provider Batch API may be used."""
    return sorted(name for name, model in models.items() if model.batch)


def pack_size(config: ModelConfig | None, setting: int) -> int:
    """Ground truths one extraction call of a model may carry: the setting
    (RECALLQ_EXTRACTION_PACK; items travel in groups that large), or fewer when the models
    file says so for the model."""
    wanted = config.extraction_pack if config and config.extraction_pack else setting
    return max(1, min(wanted, setting))
