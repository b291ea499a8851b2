"""What a model's calls cost: the one place prices are looked up.

A model's online price comes from its models-file entry (`litellm_params.input_cost_per_token`
and `output_cost_per_token`, which litellm bills with too), else from litellm's price map by
its litellm model name. A batch request's price is the map's batch price
(`*_cost_per_token_batches`) when it lists one and the models file sets neither a price nor a
`batch_discount`, else the online price less the discount (providers' usual 50% by default).

litellm's price map is read as the JSON file it ships (litellm reads the same file when
LITELLM_LOCAL_MODEL_COST_MAP is set, as recallq sets it), so looking up a price never imports
litellm (seconds of CPU): the API and `recallq estimate` stay light.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from recallq.judge.models import ModelConfig

PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"
#: litellm params that price a model (litellm bills with them too)
PRICE_PARAMS = ("input_cost_per_token", "output_cost_per_token")
#: Share of the online price a provider's Batch API saves when nothing says otherwise.
DEFAULT_BATCH_DISCOUNT = 0.5


@dataclass(frozen=True)
class Price:
    """USD per prompt token and per completion token."""

    input_per_token: float = 0.0
    output_per_token: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.input_per_token + completion_tokens * self.output_per_token


def online_price(config: ModelConfig) -> Price | None:
    """The price of the model's online calls; None when neither the models file nor litellm's
    price map knows it."""
    params = config.litellm_params
    given = _price(params.get("input_cost_per_token"), params.get("output_cost_per_token"))
    if given is not None:
        return given
    entry = _map_entry(config)
    return _price(entry.get("input_cost_per_token"), entry.get("output_cost_per_token"))


def batch_price(config: ModelConfig) -> Price:
    """The price of the model's batch requests (nothing known: free, as an unpriced model's
    online calls are)."""
    params = config.litellm_params
    own_price = "input_cost_per_token" in params or "output_cost_per_token" in params
    if config.batch_discount is None and not own_price:
        entry = _map_entry(config)
        listed = _price(
            entry.get("input_cost_per_token_batches"), entry.get("output_cost_per_token_batches")
        )
        if listed is not None:
            return listed
    online = online_price(config)
    if online is None:
        return Price()
    keep = 1.0 - (
        DEFAULT_BATCH_DISCOUNT if config.batch_discount is None else config.batch_discount
    )
    return Price(online.input_per_token * keep, online.output_per_token * keep)


def _map_entry(config: ModelConfig) -> Mapping[str, Any]:
    model = config.litellm_params.get("model")
    if not isinstance(model, str):
        return {}
    price_map = _price_map()
    entry = price_map.get(model) or price_map.get(model.split("/", 1)[-1])
    return entry if isinstance(entry, dict) else {}


def _price(input_per_token: Any, output_per_token: Any) -> Price | None:
    given_in, given_out = _number(input_per_token), _number(output_per_token)
    if given_in is None and given_out is None:
        return None
    return Price(given_in or 0.0, given_out or 0.0)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


@cache
def _price_map() -> Mapping[str, Any]:
    """litellm's bundled price map; {} when litellm is missing."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / PRICE_MAP_FILE
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}
