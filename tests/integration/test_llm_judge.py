"""The judge on its litellm lane (`transport: litellm`) in-process against the stub server over
HTTP: what it reports per call once litellm's per-call overhead is cut (no success-callback
job, no price search for unpriced models, no INFO log lines, no event loop per call for
service callbacks). The direct lane's own tests: tests/integration/test_direct_lane.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import litellm
import pytest

from recallq import pipeline
from recallq.coordination.breaker import LocalCircuitBreaker
from recallq.coordination.call_gate import OpenGate
from recallq.coordination.ratelimit import Unlimited
from recallq.core.errors import MalformedAnswer
from recallq.judge import protocol
from recallq.judge.backoff import Backoff
from recallq.judge.base import Repair
from recallq.judge.llm import LLMJudge
from recallq.judge.models import LITELLM, ModelConfig


def _judge(stub, model: str) -> LLMJudge:
    params = {"model": model, "api_base": stub.base_url, "api_key": "sk-test"}
    config = ModelConfig("judge", params, transport=LITELLM)
    return LLMJudge(config, Backoff(), Unlimited(), OpenGate(), LocalCircuitBreaker(), 30)


def _count_pricing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of litellm's price calculation (a search of its whole price map)."""
    priced: list[int] = []
    original = litellm.response_cost_calculator

    def counted(*args: object, **kwargs: object) -> object:
        priced.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(litellm, "response_cost_calculator", counted)
    return priced


def test_a_priced_model_reports_its_cost(clean_stub, monkeypatch) -> None:
    priced = _count_pricing(monkeypatch)
    reply = _judge(clean_stub, "openai/gpt-4o-mini").extract_claims("Ada was born in 1815.", "r")
    assert reply.data["claims"]
    assert reply.usage.llm_calls == 1 and reply.usage.prompt_tokens > 0
    assert reply.usage.cost_usd > 0
    assert priced


def test_an_unpriced_model_is_not_priced(clean_stub, monkeypatch) -> None:
    judge = _judge(clean_stub, "openai/stub-judge")
    priced = _count_pricing(monkeypatch)
    assert judge.extract_claims("Ada was born in 1815.", "r").usage.llm_calls == 1
    assert priced == []  # recallq.patches: no price-map search for a model litellm cannot price


def test_a_model_priced_by_a_later_models_file_is_priced(clean_stub) -> None:
    """A name one judge found unpriced and a later judge of the same name gives prices for (a
    models file read again; the tests' models files) costs what the prices say: the first
    judge's mark does not stick to the name."""
    assert _judge(clean_stub, "openai/stub-judge").extract_claims("Ada.", "r").usage.cost_usd == 0
    params = {
        "model": "openai/stub-judge",
        "api_base": clean_stub.base_url,
        "api_key": "sk-test",
        "input_cost_per_token": 2e-6,
        "output_cost_per_token": 8e-6,
    }
    priced = LLMJudge(
        ModelConfig("judge", params, transport=LITELLM), Backoff(), Unlimited(), OpenGate(),
        LocalCircuitBreaker(), 30,
    )  # fmt: skip
    usage = priced.extract_claims("Ada was born in 1815.", "r").usage
    expected = usage.prompt_tokens * 2e-6 + usage.completion_tokens * 8e-6
    assert usage.cost_usd == pytest.approx(expected, rel=1e-6) and usage.cost_usd > 0


def test_an_unpriced_model_costs_nothing_and_logs_nothing(
    clean_stub, caplog: pytest.LogCaptureFixture
) -> None:
    judge = _judge(clean_stub, "openai/stub-judge")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger().setLevel(logging.INFO)  # as a Celery worker runs
        reply = judge.attribute(["Ada was born in 1815."], ["Ada: born 1815."], "r")
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
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_calls_from_a_worker_thread_build_no_event_loop(
    clean_stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = _judge(clean_stub, "openai/stub-judge")
    made = _count_event_loops(monkeypatch)
    _in_a_worker_thread(
        lambda: [judge.extract_claims("Ada was born in 1815.", "r") for _ in range(3)]
    )
    assert clean_stub.stats()["total"] == 3
    assert made == []


def test_a_registered_service_callback_still_gets_its_events(
    clean_stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = _judge(clean_stub, "openai/stub-judge")
    monkeypatch.setattr(litellm, "service_callback", ["a-listener"])
    made = _count_event_loops(monkeypatch)
    _in_a_worker_thread(lambda: judge.extract_claims("Ada was born in 1815.", "r"))
    assert made  # litellm's own dispatch ran (a thread without a loop gets a fresh one)


def test_a_key_missing_from_a_workers_environment_fails_items_at_once(
    clean_stub, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recallq.core.errors import PermanentJudgeError
    from recallq.judge.by_model import JudgeRegistry
    from recallq.judge.models import load_models
    from tests.services import write_models_file

    models = load_models(write_models_file(tmp_path, clean_stub.base_url))
    breaker = LocalCircuitBreaker()
    registry = JudgeRegistry(models, lambda _: Unlimited(), OpenGate(), breaker, Backoff(), 30, 8)
    monkeypatch.delenv("STUB_API_KEY", raising=False)
    with pytest.raises(PermanentJudgeError, match="STUB_API_KEY .* is not set"):
        registry.get("stub-judge")
    assert clean_stub.calls() == []
    monkeypatch.setenv("STUB_API_KEY", "sk-now-set")  # the failure was not kept as the judge
    assert registry.get("stub-judge").name == "stub-judge"


def test_prices_from_the_models_file_are_billed_and_noticed(clean_stub) -> None:
    """litellm bills with litellm_params' per-token prices; the judge must not mark such a
    model unpriced (its budget would never be reached)."""
    params = {
        "model": "openai/stub-house-model",
        "api_base": clean_stub.base_url,
        "api_key": "sk-test",
        "input_cost_per_token": 0.000001,
        "output_cost_per_token": 0.000002,
    }
    judge = LLMJudge(
        ModelConfig("house", params, transport=LITELLM),
        Backoff(),
        Unlimited(),
        OpenGate(),
        LocalCircuitBreaker(),
        30,
    )
    usage = judge.extract_claims("Ada was born in 1815. She wrote a program.", "r").usage
    expected = usage.prompt_tokens * 0.000001 + usage.completion_tokens * 0.000002
    assert usage.cost_usd == pytest.approx(expected)


def test_a_malformed_answer_is_one_call_and_its_repair_is_the_callers(clean_stub) -> None:
    """The judge makes one call and says the answer is malformed (billed); the repair request
    goes only when its caller (the pipeline) asks for it, as the conversation with that answer."""
    ground_truth = "Ada was born in 1815. STUB_BROKEN_JSON"
    clean_stub.configure(record_messages=True)
    try:
        judge = _judge(clean_stub, "openai/stub-judge")
        with pytest.raises(MalformedAnswer) as first:
            judge.extract_claims(ground_truth, "r")
        assert first.value.schema == protocol.EXTRACTION and first.value.usage.llm_calls == 1
        assert len(clean_stub.calls()) == 1  # no repair request of its own
        repair = pipeline.malformed_answer(first.value, repaired=False)
        assert isinstance(repair, Repair)
        with pytest.raises(MalformedAnswer):
            judge.extract_claims(ground_truth, "r", repair=repair)
        calls = clean_stub.calls()
    finally:
        clean_stub.configure(record_messages=False)
    assert len(calls) == 2
    expected = protocol.repair_messages(
        protocol.extraction_messages(ground_truth), first.value.answer, first.value.problem
    )
    assert [m["content"] for m in calls[1]["messages"]] == [m["content"] for m in expected]


def _judge_on_redis(stub, redis_url: str) -> LLMJudge:
    """The stub model's judge with its breaker and call gate in Redis at `redis_url`."""
    from redis import Redis

    from recallq.coordination.breaker import RedisCircuitBreaker
    from recallq.coordination.call_gate import RedisCallGate

    redis = Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    params = {"model": "openai/stub-judge", "api_base": stub.base_url, "api_key": "sk-test"}
    config = ModelConfig("judge", params, transport=LITELLM)
    return LLMJudge(
        config, Backoff(max_attempts=2, base_delay=0.01), Unlimited(),
        RedisCallGate(redis, 30), RedisCircuitBreaker(redis), 30,
    )  # fmt: skip


def test_redis_failing_after_an_answer_keeps_the_answer(clean_stub) -> None:
    """The call was answered (and billed): Redis going away meanwhile (the call gate's release,
    the breaker's record) does not drop the answer, nor its usage."""
    from tests.services import RedisServer

    server = RedisServer().start()
    try:
        judge = _judge_on_redis(clean_stub, server.url())
        clean_stub.configure(latency_ms=1500)
        answers: list[object] = []
        thread = threading.Thread(
            target=lambda: answers.append(judge.extract_claims("Ada was born in 1815.", "r"))
        )
        thread.start()
        _wait(lambda: clean_stub.stats()["in_flight"] == 1)
        server.stop()  # while the call is in flight
        thread.join(30)
    finally:
        server.stop()
    [reply] = answers
    assert reply.usage.llm_calls == 1 and reply.data["claims"]  # type: ignore[attr-defined]


def test_redis_unreachable_before_a_call_sends_nothing_and_the_item_waits(clean_stub) -> None:
    """Nothing is sent; the item waits (with what its earlier calls used, written as it
    waits) instead of the task failing with Redis's error and losing that usage."""
    from recallq.core.errors import CoordinationUnavailable
    from tests.services import free_port

    judge = _judge_on_redis(clean_stub, f"redis://127.0.0.1:{free_port()}/0")  # nobody there
    with pytest.raises(CoordinationUnavailable) as raised:
        judge.attribute(["Ada was born in 1815."], ["Ada: 1815."], "r")
    assert clean_stub.calls() == []
    waits = pipeline.after_error(raised.value, None, 0.0, deadline_s=60.0)
    assert isinstance(waits, pipeline.Wait)


def _wait(condition: Callable[[], bool], timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)
