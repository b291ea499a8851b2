"""The litellm judge in-process against the stub server over HTTP: what it reports per call
once litellm's per-call overhead is cut (no success-callback job, no price search for
unpriced models, no INFO log lines, no event loop per call for service callbacks)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import litellm
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


def _count_event_loops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    original = asyncio.events.new_event_loop

    def new_event_loop() -> asyncio.AbstractEventLoop:
        made.append(1)
        return original()

    monkeypatch.setattr(asyncio.events, "new_event_loop", new_event_loop)
    return made


def _in_a_worker_thread(call: Callable[[], object]) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_calls_from_a_worker_thread_build_no_event_loop(
    clean_stub, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    judge = _judge(clean_stub, "openai/stub-judge")
    made = _count_event_loops(monkeypatch)
    _in_a_worker_thread(lambda: [judge.extract_claims("Ada was born in 1815.") for _ in range(3)])
    assert clean_stub.stats()["total"] == 3
    assert made == []


def test_a_registered_service_callback_still_gets_its_events(
    clean_stub, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    judge = _judge(clean_stub, "openai/stub-judge")
    monkeypatch.setattr(litellm, "service_callback", ["a-listener"])
    made = _count_event_loops(monkeypatch)
    _in_a_worker_thread(lambda: judge.extract_claims("Ada was born in 1815."))
    assert made  # litellm's own dispatch ran (a thread without a loop gets a fresh one)


def test_a_key_missing_from_a_workers_environment_fails_items_at_once(
    clean_stub, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from recallq.settings import get_settings
    from tests.services import write_models_file
    from worker import judges
    from worker.judge.base import PermanentJudgeError

    monkeypatch.setenv("RECALLQ_MODELS_FILE", str(write_models_file(tmp_path, clean_stub.base_url)))
    monkeypatch.delenv("STUB_API_KEY", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(PermanentJudgeError, match="STUB_API_KEY .* is not set"):
            judges.get_judge("stub-judge")
    finally:
        get_settings.cache_clear()
    assert "stub-judge" not in judges._judges
    assert clean_stub.calls() == []
