"""recallq.runs.estimate: what a run would take, per the engine's rules and the protocol's
prompts."""

from __future__ import annotations

import pytest

from recallq.judge import prices, protocol
from recallq.judge.models import LEXICAL, ModelConfig
from recallq.runs import estimate
from recallq.state.claim_cache import ClaimCache

PRICES = prices.Price(input_per_token=0.000001, output_per_token=0.000002)
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
    assert prices.online_price(given) == prices.Price(0.5, 0.25)
    known = prices.online_price(ModelConfig("y", {"model": "openai/gpt-4o-mini"}))
    assert known is not None and known.input_per_token > 0 and known.output_per_token > 0
    assert prices.online_price(ModelConfig("z", {"model": "hosted_vllm/qwen-local"})) is None


def test_the_batch_price_is_the_listed_one_else_less_the_discount() -> None:
    own = {"model": "openai/mine", "input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6}
    assert prices.batch_price(ModelConfig("a", own)) == prices.Price(1e-6, 4e-6)  # half
    quarter_off = prices.batch_price(ModelConfig("b", own, batch_discount=0.25))
    assert quarter_off.input_per_token == pytest.approx(1.5e-6)
    assert quarter_off.output_per_token == pytest.approx(6e-6)
    mapped = ModelConfig("c", {"model": "openai/gpt-4o-mini"})
    online, batch = prices.online_price(mapped), prices.batch_price(mapped)
    assert online is not None and 0 < batch.input_per_token < online.input_per_token
    unpriced = ModelConfig("d", {"model": "hosted_vllm/qwen-local"})
    assert prices.batch_price(unpriced) == prices.Price()  # unpriced: costs 0


def test_the_claim_cache_key_version_per_model() -> None:
    assert ClaimCache.prompt_version(LEXICAL) == "lexical-1"
    assert ClaimCache.prompt_version("gpt-4o-mini") == protocol.PROMPT_VERSION


def _truths(n: int) -> list[str]:
    return [f"Item {i} was made in {1900 + i}. Item {i} weighs {i} grams." for i in range(n)]


def test_online_extraction_is_packed_as_the_engine_packs_it() -> None:
    own = {"model": "openai/mine", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    models = {"m": ModelConfig("m", own)}
    packed = estimate.estimator_for("m", models, settings_pack=8, pack_tokens=4000)
    single = estimate.estimator_for("m", models, settings_pack=1, pack_tokens=4000)
    for truth in _truths(20):
        packed.add(truth, ["c"], None)
        single.add(truth, ["c"], None)
    p, s = packed.result(), single.result()
    assert (p.extraction_calls, p.attribution_calls) == (3, 20)  # 8 + 8 + 4
    assert (s.extraction_calls, s.attribution_calls) == (20, 20)
    # one system prompt per pack instead of one per item: fewer prompt tokens, lower cost
    assert p.cost_usd is not None and s.cost_usd is not None
    assert p.prompt_tokens < s.prompt_tokens and p.cost_usd < s.cost_usd
    smaller = estimate.estimator_for("m", {"m": ModelConfig("m", own, extraction_pack=4)}, 8, 4000)
    for truth in _truths(20):
        smaller.add(truth, ["c"], None)
    assert smaller.result().extraction_calls == 5  # the model's own pack size, at most


def test_a_batch_run_is_priced_at_the_batch_price_and_not_packed() -> None:
    own = {"model": "openai/mine", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    models = {"m": ModelConfig("m", own, batch=True)}
    batch = estimate.estimator_for("m", models, settings_pack=8, pack_tokens=4000, mode="batch")
    online = estimate.estimator_for("m", models, settings_pack=1, pack_tokens=4000)
    for truth in _truths(10):
        batch.add(truth, ["c"], None)
        online.add(truth, ["c"], None)
    b, o = batch.result(), online.result()
    assert (b.mode, b.extraction_calls, b.prompt_tokens) == ("batch", 10, o.prompt_tokens)
    assert b.cost_usd is not None and o.cost_usd is not None
    assert b.cost_usd == pytest.approx(o.cost_usd / 2)


def test_judged_precision_adds_one_relevance_call_per_attributed_item() -> None:
    cited = estimate.Estimator("m", PRICES)
    judged = estimate.Estimator("m", PRICES, precision="judged")
    passages = ["Ada Lovelace was born in 1815.", "Bananas are yellow."]
    for estimator in (cited, judged):
        estimator.add(TRUTH, passages, None)
        estimator.add(TRUTH, [], None)  # no context: no attribution, no relevance call
    plain, more = cited.result(), judged.result()
    assert (plain.calls, plain.relevance_calls) == (3, 0)
    assert (more.calls, more.relevance_calls) == (4, 1)
    relevance = protocol.relevance_messages(TRUTH, list(enumerate(passages)))
    added = sum(len(m["content"]) for m in relevance) // 4
    assert more.prompt_tokens - plain.prompt_tokens == added
    assert more.cost_usd is not None and plain.cost_usd is not None
    assert more.cost_usd > plain.cost_usd
