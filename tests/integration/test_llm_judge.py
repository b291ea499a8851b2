"""The litellm judge in-process against the stub server over HTTP: what it reports per call
once litellm's per-call overhead is cut (no success-callback job, no price search for
unpriced models, no INFO log lines)."""

from __future__ import annotations

import logging

import pytest

from recallq.model_registry import ModelConfig
from worker.gate import OpenGate
from worker.judge.llm import LLMJudge
from worker.ratelimit import Unlimited
from worker.retry import RetryPolicy


def _judge(stub, model: str) -> LLMJudge:  # type: ignore[no-untyped-def]
    params = {"model": model, "api_base": stub.base_url, "api_key": "sk-test"}
    return LLMJudge(ModelConfig("judge", params), RetryPolicy(), Unlimited(), OpenGate(), 30)


def test_a_priced_model_reports_its_cost(clean_stub) -> None:  # type: ignore[no-untyped-def]
    reply = _judge(clean_stub, "openai/gpt-4o-mini").extract_claims("Ada was born in 1815.")
    assert reply.data["claims"]
    assert reply.usage.llm_calls == 1 and reply.usage.prompt_tokens > 0
    assert reply.usage.cost_usd > 0


def test_an_unpriced_model_costs_nothing_and_logs_nothing(
    clean_stub, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    judge = _judge(clean_stub, "openai/stub-judge")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger().setLevel(logging.INFO)  # as a Celery worker runs
        reply = judge.attribute(["Ada was born in 1815."], ["Ada: born 1815."])
    assert reply.data["verdicts"][0]["verdict"] == "yes"
    assert reply.usage.llm_calls == 1 and reply.usage.cost_usd == 0
    assert not [r for r in caplog.records if r.name.startswith("LiteLLM")]
