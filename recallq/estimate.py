"""What a run would cost before it runs: items, judge calls, tokens and dollars.

Pure but for one read of litellm's bundled price map (a JSON file, read without importing
litellm, which costs seconds of CPU). Used by `POST /v1/runs?dry_run=true` and `recallq
estimate FILE --model M`.

Per item, as the engine does it (judge protocol v1):
- no ground truth: no call;
- extraction: one call, unless the project's claim cache holds the claims (then none, and
  the cached claims are what attribution is asked about);
- attribution: one call when the item has context passages, none otherwise.

Prompt tokens are the characters of the messages the protocol would send, divided by four
(providers' tokenisers give about that for English; the answer is an estimate, not a bill).
Claims not yet extracted are guessed with the offline judge's sentence splitter; answers are
sized from them (the claims as JSON; a verdict with a one-sentence reason per claim).

Kept open for more call shapes: packing several extractions into one call, or a batch
discount, change `Estimator.add` and `Prices`, and nothing else.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from recallq.judge import protocol
from recallq.judge.lexical import split_claims
from recallq.model_registry import LEXICAL, ModelConfig

CHARS_PER_TOKEN = 4
# a verdict's JSON is about this long: some 70 characters of keys and values, and a reason of
# one short sentence
VERDICT_CHARS = 120
PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True)
class Prices:
    """USD per prompt token and per completion token."""

    input_per_token: float
    output_per_token: float


@dataclass
class Estimate:
    model: str
    items: int = 0
    calls: int = 0
    extraction_calls: int = 0
    attribution_calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: the model has no known price

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "priced": self.cost_usd is not None}


def tokens_of(characters: int) -> int:
    return characters // CHARS_PER_TOKEN


def _message_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(message["content"]) for message in messages)


class Estimator:
    """Adds up what a run's items would take, one item at a time (memory stays flat)."""

    def __init__(self, model: str, prices: Prices | None, calls_a_model: bool = True) -> None:
        """`calls_a_model`: False for the offline judge, which makes no billed calls."""
        self._estimate = Estimate(model, cost_usd=0.0 if prices or not calls_a_model else None)
        self._prices = prices
        self._calls_a_model = calls_a_model

    def add(
        self, ground_truth: str | None, contexts: list[str], cached_claims: list[str] | None
    ) -> None:
        """One item: its ground truth, its resolved context passages, and the claims the
        claim cache holds for it (None: not cached)."""
        estimate = self._estimate
        estimate.items += 1
        if ground_truth is None or not self._calls_a_model:
            return
        if cached_claims is None:
            claims = split_claims(ground_truth) or [ground_truth]
            prompt = _message_chars(protocol.extraction_messages(ground_truth))
            answer = len(json.dumps({"claims": claims}, ensure_ascii=False))
            self._call("extraction", prompt, answer)
        else:
            estimate.cache_hits += 1
            claims = cached_claims
        if contexts and claims:
            prompt = _message_chars(protocol.attribution_messages(claims, contexts))
            self._call("attribution", prompt, len('{"verdicts": []}') + VERDICT_CHARS * len(claims))

    def _call(self, kind: str, prompt_chars: int, answer_chars: int) -> None:
        estimate = self._estimate
        estimate.calls += 1
        if kind == "extraction":
            estimate.extraction_calls += 1
        else:
            estimate.attribution_calls += 1
        prompt, completion = tokens_of(prompt_chars), tokens_of(answer_chars)
        estimate.prompt_tokens += prompt
        estimate.completion_tokens += completion
        if self._prices is not None and estimate.cost_usd is not None:
            estimate.cost_usd += (
                prompt * self._prices.input_per_token + completion * self._prices.output_per_token
            )

    def result(self) -> Estimate:
        estimate = Estimate(**asdict(self._estimate))
        if estimate.cost_usd is not None:
            estimate.cost_usd = round(estimate.cost_usd, 6)
        return estimate


@cache
def _price_map() -> Mapping[str, Any]:
    """litellm's bundled price map, read as the file it is (litellm reads the same file when
    LITELLM_LOCAL_MODEL_COST_MAP is set, as recallq sets it); {} when litellm is missing."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / PRICE_MAP_FILE
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def prices_of(config: ModelConfig) -> Prices | None:
    """A model's prices: from its models-file entry (litellm_params.input_cost_per_token and
    output_cost_per_token, which litellm also bills with), else from litellm's price map by
    its litellm model name; None when neither knows it."""
    params = config.litellm_params
    given_in = _number(params.get("input_cost_per_token"))
    given_out = _number(params.get("output_cost_per_token"))
    if given_in is not None or given_out is not None:
        return Prices(given_in or 0.0, given_out or 0.0)
    model = params.get("model")
    if not isinstance(model, str):
        return None
    price_map = _price_map()
    entry = price_map.get(model) or price_map.get(model.split("/", 1)[-1])
    if not isinstance(entry, dict):
        return None
    input_price = _number(entry.get("input_cost_per_token"))
    output_price = _number(entry.get("output_cost_per_token"))
    if input_price is None and output_price is None:
        return None
    return Prices(input_price or 0.0, output_price or 0.0)


def estimator_for(model: str, models: Mapping[str, ModelConfig]) -> Estimator:
    """An estimator for a model of the models file (or the offline judge)."""
    if model == LEXICAL:
        return Estimator(model, None, calls_a_model=False)
    config = models.get(model)
    return Estimator(model, prices_of(config) if config is not None else None)


def prompt_version(model: str) -> str:
    """The prompt version the claim cache is keyed by for this model's judge."""
    from recallq.judge.lexical import LexicalJudge

    return LexicalJudge.prompt_version if model == LEXICAL else protocol.PROMPT_VERSION
