"""Judge models from RECALLQ_MODELS_FILE: names that runs refer to, and their litellm params.

Read by the API (to reject unknown models) and by workers (to call them). Server-side only:
endpoints and keys never leave this module's callers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LEXICAL = "local/lexical"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    litellm_params: dict[str, Any] = field(default_factory=dict)
    rpm: int | None = None
    tpm: int | None = None

    def resolved_params(self) -> dict[str, Any]:
        """litellm params with `os.environ/NAME` values replaced by the variable's value; an
        unset variable is an error that names it (a set but empty one is kept)."""
        return {key: self._resolve(key, value) for key, value in self.litellm_params.items()}

    def _resolve(self, key: str, value: Any) -> Any:
        if not (isinstance(value, str) and value.startswith("os.environ/")):
            return value
        variable = value.removeprefix("os.environ/")
        if variable not in os.environ:
            raise ModelRegistryError(
                f"model {self.name!r}: {variable} (for litellm_params.{key}) is not set in "
                "this process's environment"
            )
        return os.environ[variable]

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
            except ModelRegistryError:
                continue
            if isinstance(resolved, str):
                found.append(resolved)
        return found


_SECRET_PARAM = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)


class ModelRegistryError(ValueError):
    pass


def load_models(path: Path | None) -> dict[str, ModelConfig]:
    models = {LEXICAL: ModelConfig(LEXICAL)}
    if path is None:
        return models
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ModelRegistryError(f"cannot read models file {path}: {exc}") from exc
    for entry in raw.get("models") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ModelRegistryError(f"models file {path}: every model needs a name")
        params = entry.get("litellm_params") or {}
        if not isinstance(params, dict) or "model" not in params:
            raise ModelRegistryError(f"model {entry['name']}: litellm_params.model is required")
        models[entry["name"]] = ModelConfig(
            name=entry["name"], litellm_params=params, rpm=entry.get("rpm"), tpm=entry.get("tpm")
        )
    return models
