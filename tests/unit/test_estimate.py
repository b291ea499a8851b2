"""recallq.estimate: what a run would take, per the engine's rules and the protocol's prompts."""

from __future__ import annotations

import pytest

from recallq import estimate
from recallq.judge import protocol
from recallq.model_registry import LEXICAL, ModelConfig

PRICES = estimate.Prices(input_per_token=0.000001, output_per_token=0.000002)
TRUTH = "Ada Lovelace was born in 1815. She wrote the first program."


def test_an_item_with_context_takes_an_extraction_and_an_attribution() -> None:
    estimator = estimate.Estimator("m", PRICES)
    estimator.add(TRUTH, ["Ada Lovelace was born in 1815."], None)
    result = estimator.result()
    assert (result.items, result.calls, result.extraction_calls, result.attribution_calls) == (
        1,
        2,
        1,
        1,
    )
    extraction = sum(len(m["content"]) for m in protocol.extraction_messages(TRUTH)) // 4
    claims = ["Ada Lovelace was born in 1815", "She wrote the first program"]
    attribution = protocol.attribution_messages(claims, ["Ada Lovelace was born in 1815."])
    assert result.prompt_tokens == extraction + sum(len(m["content"]) for m in attribution) // 4
    expected = result.prompt_tokens * 0.000001 + result.completion_tokens * 0.000002
    assert result.cost_usd == pytest.approx(expected, abs=1e-6)


def test_cache_hits_no_context_and_no_ground_truth_take_fewer_calls() -> None:
    estimator = estimate.Estimator("m", PRICES)
    estimator.add(TRUTH, ["c"], ["a cached claim"])  # attribution only
    estimator.add(TRUTH, [], None)  # extraction only: no context, no attribution call
    estimator.add(None, ["c"], None)  # nothing
    estimator.add(TRUTH, ["c"], [])  # cached with no claims: nothing
    result = estimator.result()
    assert (result.items, result.calls, result.cache_hits) == (4, 2, 2)
    assert (result.extraction_calls, result.attribution_calls) == (1, 1)


def test_unpriced_and_offline_models() -> None:
    unpriced = estimate.Estimator("m", None)
    unpriced.add(TRUTH, ["c"], None)
    assert unpriced.result().cost_usd is None and unpriced.result().calls == 2
    assert unpriced.result().as_dict()["priced"] is False
    offline = estimate.estimator_for(LEXICAL, {})
    offline.add(TRUTH, ["c"], None)
    assert (offline.result().calls, offline.result().cost_usd) == (0, 0.0)


def test_prices_come_from_the_models_file_or_litellms_map() -> None:
    given = ModelConfig(
        "x",
        {"model": "openai/mine", "input_cost_per_token": 0.5, "output_cost_per_token": "0.25"},
    )
    assert estimate.prices_of(given) == estimate.Prices(0.5, 0.25)
    known = estimate.prices_of(ModelConfig("y", {"model": "openai/gpt-4o-mini"}))
    assert known is not None and known.input_per_token > 0 and known.output_per_token > 0
    assert estimate.prices_of(ModelConfig("z", {"model": "hosted_vllm/qwen-local"})) is None


def test_the_claim_cache_key_version_per_model() -> None:
    assert estimate.prompt_version(LEXICAL) == "lexical-1"
    assert estimate.prompt_version("gpt-4o-mini") == protocol.PROMPT_VERSION
