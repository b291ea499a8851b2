"""The stub's judge-error mode: verdicts of its rule flipped at a known rate."""

from __future__ import annotations

import json

from tests.stub_llm import ATTRIBUTION, StubConfig, StubState, attribute

CLAIMS = [{"index": i, "text": f"Gauge reading{i} shows level{i}"} for i in range(2000)]
CONTEXTS = [{"index": 0, "text": " ".join(f"reading{i} level{i}" for i in range(0, 2000, 2))}]
DATA = {"claims": CLAIMS, "contexts": CONTEXTS}


def _verdicts(state: StubState) -> list[str]:
    answer = json.loads(state.answer(ATTRIBUTION, DATA).content)
    return [v["verdict"] for v in answer["verdicts"]]


def _rule() -> list[str]:
    pairs = [(int(str(c["index"])), str(c["text"])) for c in CLAIMS]
    return [v["verdict"] for v in attribute(pairs, [(0, str(CONTEXTS[0]["text"]))])]


def test_deterministic_flips_hit_the_rate_and_repeat() -> None:
    state = StubState(StubConfig(flip_rate=0.2, flip_seed=5))
    first, again = _verdicts(state), _verdicts(state)
    assert first == again
    truth = _rule()
    rate = sum(a != b for a, b in zip(first, truth, strict=True)) / len(truth)
    assert 0.17 < rate < 0.23  # 2,000 claims: sd of the rate 0.009
    other_seed = _verdicts(StubState(StubConfig(flip_rate=0.2, flip_seed=6)))
    assert other_seed != first


def test_per_call_flips_differ_between_calls_at_two_p_one_minus_p() -> None:
    state = StubState(StubConfig(flip_rate=0.2, flip_per_call=True, seed=1))
    first, second = _verdicts(state), _verdicts(state)
    between = sum(a != b for a, b in zip(first, second, strict=True)) / len(first)
    assert 0.28 < between < 0.36  # 2p(1 - p) = 0.32, sd 0.010


def test_no_flips_is_the_rule() -> None:
    assert _verdicts(StubState(StubConfig())) == _rule()
    assert _verdicts(StubState(StubConfig(flip_rate=0.0, flip_per_call=True))) == _rule()
