"""How packed extraction shares a call: packs of ground truths and the split of its usage."""

from __future__ import annotations

from recallq.core.outcomes import Taken
from recallq.core.usage import Usage
from recallq.execution.engine import extraction_packs
from recallq.pipeline import split_usage


def _pass(item_id: int, text: str) -> tuple[Taken, str]:
    return Taken(item_id, "o", "r", "m", 1.0, text), f"key{item_id}"


def test_packs_hold_at_most_the_size_and_about_the_token_budget() -> None:
    short = [_pass(i, "x" * 40) for i in range(10)]  # 10 tokens each
    assert [len(p) for p in extraction_packs(short, 4, 1000)] == [4, 4, 2]
    assert [len(p) for p in extraction_packs(short, 8, 25)] == [2, 2, 2, 2, 2]
    long_one = [_pass(0, "x" * 4000), *short[:2]]  # 1000 tokens: alone
    assert [len(p) for p in extraction_packs(long_one, 8, 100)] == [1, 2]
    assert extraction_packs([], 8, 100) == []


def test_usage_shares_add_up_exactly_and_count_the_call_once() -> None:
    usage = Usage(1, 1003, 502, 0.009, call_attempts=2, failed_calls=1)
    shares = split_usage(usage, 4)
    total = shares[0]
    for share in shares[1:]:
        total = total + share
    assert (total.llm_calls, total.prompt_tokens, total.completion_tokens) == (1, 1003, 502)
    assert (total.call_attempts, total.failed_calls) == (2, 1)
    assert abs(total.cost_usd - 0.009) < 1e-12
    assert [s.llm_calls for s in shares] == [1, 0, 0, 0]
    assert shares[1].prompt_tokens == 250 and shares[0].prompt_tokens == 253
