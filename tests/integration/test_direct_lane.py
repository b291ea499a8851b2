"""The direct OpenAI-compatible lane (recallq.judge.openai_compatible) in-process against the
stub server over real HTTP: what each provider failure means (retried, waited out or failed at
once, with the reasons and error names users read), the key kept out of every message, huge
answers bounded, usage and cost as the stub counted them, and the same scores, verdicts and
usage as the litellm lane gives for the same items."""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from recallq.coordination.breaker import LocalCircuitBreaker
from recallq.coordination.call_gate import OpenGate
from recallq.coordination.ratelimit import Unlimited
from recallq.core.errors import MalformedAnswer, PermanentJudgeError, ProviderUnavailable
from recallq.judge import lanes, protocol
from recallq.judge.backoff import Backoff
from recallq.judge.llm import LLMJudge
from recallq.judge.models import JudgeModelsError, ModelConfig, load_models
from recallq.judge.openai_compatible import OpenAICompatibleTransport
from recallq.judge.transport import (
    CONNECTION_REFUSED,
    MAX_TOKENS_PER_CALL,
    RATE_LIMITED,
    TIMEOUTS,
)
from tests.services import free_port

KEY = "sk-direct-lane-secret-0123456789"
GROUND_TRUTH = "Ada Lovelace was born in 1815. She wrote the first program."
FAST_RETRIES = Backoff(max_attempts=2, base_delay=0.01, max_delay=0.05)


def _judge(
    api_base: str,
    policy: Backoff = FAST_RETRIES,
    timeout: float = 30,
    limits: protocol.AnswerLimits = protocol.DEFAULT_LIMITS,
    **params: Any,
) -> LLMJudge:
    config = ModelConfig(
        "direct", {"model": "openai/stub-judge", "api_base": api_base, "api_key": KEY, **params}
    )
    assert lanes.takes_direct_lane(config)
    judge = LLMJudge(
        config, policy, Unlimited(), OpenGate(), LocalCircuitBreaker(), timeout, limits=limits
    )
    assert isinstance(judge._transport, OpenAICompatibleTransport)
    return judge


def test_a_429_with_retry_after_in_seconds_is_waited_out_retried_and_counted(clean_stub) -> None:
    clean_stub.outage(1.5, status=429, retry_after="1")
    judge = _judge(clean_stub.base_url, Backoff(max_attempts=5, base_delay=0.01, max_delay=5))
    reply = judge.extract_claims(GROUND_TRUTH, "r")
    calls = clean_stub.calls()
    refused = [c for c in calls if c["status"] == 429]
    assert refused and calls[-1]["status"] == 200
    assert reply.usage.failed_calls == len(refused)
    assert reply.usage.call_attempts == len(calls) and reply.usage.llm_calls == 1
    gaps = [b["t"] - a["t"] for a, b in zip(calls, calls[1:], strict=False)]
    assert min(gaps) >= 0.95  # each retry waited the Retry-After


def test_a_429_with_retry_after_as_an_http_date_is_waited_out(clean_stub) -> None:
    judge = _judge(clean_stub.base_url, Backoff(max_attempts=3, base_delay=0.01, max_delay=5))
    until = int(time.time()) + 3  # an HTTP-date counts whole seconds
    clean_stub.outage(2.0, status=429, retry_after=email.utils.formatdate(until, usegmt=True))
    judge.extract_claims(GROUND_TRUTH, "r")
    first, second = clean_stub.calls()[:2]
    assert first["status"] == 429 and second["status"] == 200
    assert second["t"] >= until - 0.05  # not before the date it was told


def test_a_429_that_lasts_makes_the_item_wait_rate_limited(clean_stub) -> None:
    clean_stub.outage(30, status=429, retry_after="0")
    with pytest.raises(ProviderUnavailable) as waits:
        _judge(clean_stub.base_url).extract_claims(GROUND_TRUTH, "r")
    assert waits.value.reason == RATE_LIMITED
    assert "RateLimitError: Error code: 429" in str(waits.value)
    assert waits.value.usage.failed_calls == 2 == len(clean_stub.calls())


@pytest.mark.parametrize(
    ("status", "kind"), [(500, "InternalServerError"), (503, "ServiceUnavailableError")]
)
def test_a_5xx_is_transient_with_todays_reason(clean_stub, status: int, kind: str) -> None:
    clean_stub.outage(30, status=status)
    with pytest.raises(ProviderUnavailable) as waits:
        _judge(clean_stub.base_url).attribute(["Ada was born in 1815."], ["Ada: 1815."], "r")
    assert waits.value.reason == f"provider unavailable ({status})"
    assert f"{kind}: Error code: {status}" in str(waits.value)
    assert len(clean_stub.calls()) == 2  # retried, then the item waits


def test_a_rejected_key_fails_at_once_with_the_key_redacted(clean_stub) -> None:
    clean_stub.configure(reject_keys=[KEY])
    with pytest.raises(PermanentJudgeError) as failed:
        _judge(clean_stub.base_url).extract_claims(GROUND_TRUTH, "r")
    message = str(failed.value)
    assert message.startswith("AuthenticationError: Error code: 401 - Incorrect API key")
    assert KEY not in message and "[redacted]" in message
    assert failed.value.usage.call_attempts == 1 == len(clean_stub.calls())
    assert KEY not in repr(failed.value.__cause__) + repr(failed.value.__context__)


def test_a_bad_request_fails_at_once(clean_stub) -> None:
    with pytest.raises(PermanentJudgeError, match=r"^BadRequestError: Error code: 400 - "):
        _judge(clean_stub.base_url).extract_claims("Ada. STUB_HTTP_400", "r")
    assert len(clean_stub.calls()) == 1


def test_nothing_listening_at_api_base_is_connection_refused() -> None:
    judge = _judge(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(ProviderUnavailable) as waits:
        judge.extract_claims(GROUND_TRUTH, "r")
    assert waits.value.reason == CONNECTION_REFUSED
    assert "APIConnectionError" in str(waits.value)


def test_a_slow_provider_times_out(clean_stub) -> None:
    clean_stub.configure(latency_ms=3000)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable) as waits:
        _judge(clean_stub.base_url, timeout=0.5).extract_claims(GROUND_TRUTH, "r")
    assert waits.value.reason == TIMEOUTS
    assert time.monotonic() - started < 2.5  # two attempts of 0.5 s, not the stub's 3 s


def test_a_huge_answer_is_over_the_limit_as_on_the_litellm_lane(clean_stub) -> None:
    """4.3 MB of claims: read (it is within what the lane reads for a 1 MiB answer limit) and
    refused by the protocol's limit, with its usage."""
    with pytest.raises(MalformedAnswer) as malformed:
        _judge(clean_stub.base_url).extract_claims("Ada was born in 1815. STUB_HUGE_CLAIMS", "r")
    assert not malformed.value.repairable and malformed.value.answer is None
    assert "over the limit of 1,048,576 (RECALLQ_JUDGE_MAX_ANSWER_BYTES)" in malformed.value.problem
    counted = clean_stub.stats()["usage_by_schema"]["claim_extraction"]
    assert malformed.value.usage.completion_tokens == counted["completion_tokens"] > 0


def test_a_body_over_what_the_lane_reads_is_not_kept_and_still_billed(clean_stub) -> None:
    """With a 10 kB answer limit the lane keeps at most about 124 kB of a body: the 4.3 MB
    answer is dropped as it arrives (its usage read from its end) and fails as over the limit."""
    limits = protocol.AnswerLimits(answer_bytes=10_000)
    judge = _judge(clean_stub.base_url, limits=limits)
    with pytest.raises(MalformedAnswer) as malformed:
        judge.extract_claims("Ada was born in 1815. STUB_HUGE_CLAIMS", "r")
    assert not malformed.value.repairable and malformed.value.answer is None
    assert malformed.value.problem.startswith("the judge's response is ")
    assert "over the limit of 10,000 (RECALLQ_JUDGE_MAX_ANSWER_BYTES)" in malformed.value.problem
    counted = clean_stub.stats()["usage_by_schema"]["claim_extraction"]
    assert malformed.value.usage.prompt_tokens == counted["prompt_tokens"] > 0
    assert malformed.value.usage.completion_tokens == counted["completion_tokens"] > 0


def _models_file(directory: Path, base_url: str) -> Path:
    path = directory / "models.yaml"
    entry = (
        "    litellm_params:\n"
        "      model: openai/stub-judge\n"
        f"      api_base: {base_url}\n"
        f"      api_key: {KEY}\n"
        "      input_cost_per_token: 0.000002\n"
        "      output_cost_per_token: 0.000008\n"
    )
    path.write_text(
        f"models:\n  - name: direct\n{entry}  - name: via-litellm\n{entry}    transport: litellm\n"
    )
    return path


def test_usage_and_cost_are_what_the_stub_counted(clean_stub, tmp_path: Path) -> None:
    models = load_models(_models_file(tmp_path, clean_stub.base_url))
    judge = LLMJudge(
        models["direct"], FAST_RETRIES, Unlimited(), OpenGate(), LocalCircuitBreaker(), 30
    )
    extracted = judge.extract_claims(GROUND_TRUTH, "r")
    attributed = judge.attribute(extracted.data["claims"], [GROUND_TRUTH], "r")
    counted = clean_stub.stats()["usage_by_schema"]
    for reply, schema in ((extracted, "claim_extraction"), (attributed, "claim_attribution")):
        usage = reply.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            counted[schema]["prompt_tokens"],
            counted[schema]["completion_tokens"],
        )
        expected = usage.prompt_tokens * 2e-6 + usage.completion_tokens * 8e-6
        assert usage.cost_usd == pytest.approx(expected, rel=1e-9) and usage.cost_usd > 0


def test_the_models_file_chooses_the_lane(tmp_path: Path) -> None:
    models = load_models(_models_file(tmp_path, "http://127.0.0.1:1/v1"))
    assert lanes.takes_direct_lane(models["direct"])
    assert not lanes.takes_direct_lane(models["via-litellm"])
    assert lanes.needs_litellm([models["via-litellm"]])
    assert not lanes.needs_litellm([models["direct"]])
    vllm = ModelConfig("v", {"model": "hosted_vllm/m", "api_base": "http://127.0.0.1:1/v1"})
    assert lanes.takes_direct_lane(vllm)
    for other in (
        {"model": "anthropic/claude-3-5-haiku-latest"},
        {"model": "azure/gpt-4o", "api_version": "2024-10-21"},
        {"model": "openai/gpt-4o-mini", "max_tokens": 100},  # a param only litellm knows
    ):
        assert not lanes.takes_direct_lane(ModelConfig("o", other))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "models:\n  - name: m\n    litellm_params: {model: openai/x}\n    transport: http\n"
    )
    with pytest.raises(JudgeModelsError, match="transport must be one of auto, litellm"):
        load_models(bad)


def test_a_direct_model_without_a_key_fails_its_items_at_once(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = ModelConfig("nokey", {"model": "openai/gpt-4o-mini"})
    with pytest.raises(JudgeModelsError, match="no API key"):
        lanes.build_transport(config, protocol.DEFAULT_LIMITS.answer_bytes)


ITEMS = [
    {
        "id": f"p{n}",
        "ground_truth": f"Depot {n} opened in {1990 + n}. Depot {n} has {n + 3} docks.",
        "context": [f"Depot {n} opened in {1990 + n}.", f"Depot {n} is painted blue."],
    }
    for n in range(4)
]


def _evaluate(model: str, database: Path) -> Any:
    import recallq

    return recallq.evaluate(
        ITEMS, model, progress=False, database_url=f"sqlite:///{database}", fresh=True
    )


def test_both_lanes_give_the_same_scores_verdicts_and_usage(
    clean_stub, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("RECALLQ_MODELS_FILE", str(_models_file(tmp_path, clean_stub.base_url)))
    direct = _evaluate("direct", tmp_path / "direct.db")
    via_litellm = _evaluate("via-litellm", tmp_path / "litellm.db")

    def scored(result: Any) -> list[tuple[Any, ...]]:
        return [
            (
                item["id"],
                item["score"],
                [(c["text"], c["verdict"], c.get("context_indices")) for c in item["claims"]],
            )
            for item in sorted(result.items, key=lambda item: item["id"])
        ]

    assert direct.counts["succeeded"] == len(ITEMS) == via_litellm.counts["succeeded"]
    assert scored(direct) == scored(via_litellm)
    assert direct.summary == via_litellm.summary
    for field in ("llm_calls", "prompt_tokens", "completion_tokens", "cost_usd"):
        assert direct.usage[field] == pytest.approx(via_litellm.usage[field]), field
    assert direct.usage["prompt_tokens"] > 0 and direct.usage["cost_usd"] > 0


def test_a_200_that_is_not_a_chat_completion_makes_the_item_wait() -> None:
    """A web page (a captive portal, a proxy's login page) where a chat completion belongs."""
    server = _answering(b"<html><body>Please sign in</body></html>", "text/html")
    try:
        judge = _judge(f"http://127.0.0.1:{server.server_port}/v1")
        with pytest.raises(ProviderUnavailable) as waits:
            judge.extract_claims(GROUND_TRUTH, "r")
    finally:
        server.shutdown()
    assert waits.value.reason == "provider unavailable"
    assert "200 without a chat completion: <html>" in str(waits.value)


def test_api_base_and_key_default_from_the_environment_as_litellms_do(
    clean_stub, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", clean_stub.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    config = ModelConfig("env", {"model": "openai/stub-judge"})
    judge = LLMJudge(config, FAST_RETRIES, Unlimited(), OpenGate(), LocalCircuitBreaker(), 30)
    assert judge.extract_claims(GROUND_TRUTH, "r").data["claims"]
    assert clean_stub.calls()[-1]["key_suffix"] == KEY[-4:]
    assert KEY in config.secret_values()  # redacted wherever the provider echoes it


@pytest.mark.parametrize("transport", ["auto", "litellm"])
def test_a_worker_on_the_direct_lane_scores_a_run_without_importing_litellm(
    service_env: dict[str, str], stub, tmp_path: Path, monkeypatch, transport: str
) -> None:
    """A real worker and API, each a new interpreter (not a fork of the tests' launcher, which
    holds litellm already), with a litellm on the path that fails when imported: on the
    direct lane the run scores every item; a worker with a model on the litellm lane does not
    even start."""
    from tests import launcher
    from tests.integration.faults import make_items, submit
    from tests.services import start_api, start_worker, wait_for_run, write_models_file

    broken = tmp_path / "site" / "litellm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("litellm was imported")\n')
    monkeypatch.setattr(launcher, "SPAWN", True)
    path = os.pathsep.join(filter(None, [str(broken.parent), service_env.get("PYTHONPATH")]))
    models = write_models_file(tmp_path, stub.base_url, transport=transport)
    env = {**service_env, "RECALLQ_MODELS_FILE": str(models), "PYTHONPATH": path}
    if transport == "litellm":  # the probe can tell: a worker with a model on litellm's lane
        with pytest.raises(RuntimeError, match="litellm was imported"):  # imports it as it starts
            start_worker(env, concurrency=4).stop()
        return
    worker = start_worker(env, concurrency=4)
    api, url = start_api(env)
    try:
        run = wait_for_run(url, submit(url, make_items("nolitellm", 3)), timeout=120)
    finally:
        api.stop()
        worker.stop()
    assert run["counts"]["succeeded"] == 3, worker.output()[-3000:]
    assert "litellm was imported" not in worker.output()
    assert "HTTP Request:" not in worker.output()  # no log line per judge call


def _answering(
    body: bytes, content_type: str = "application/json", status: int = 200
) -> ThreadingHTTPServer:
    """A provider that answers every request `status` with `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            requests.append((self.path, [name.lower() for name in self.headers]))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("location", "http://elsewhere.invalid/v1/chat/completions")
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    requests: list[tuple[str, list[str]]] = []  # each request's target and header names
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.requests = requests  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _completion(usage: dict[str, Any]) -> bytes:
    answer = json.dumps({"claims": ["Ada Lovelace was born in 1815."]})
    choice = {"index": 0, "message": {"role": "assistant", "content": answer}}
    return json.dumps({"choices": [{**choice, "finish_reason": "stop"}], "usage": usage}).encode()


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": -5000, "completion_tokens": -1}, (0, 0)),
        ({"prompt_tokens": 10**30, "completion_tokens": 1e300}, (MAX_TOKENS_PER_CALL,) * 2),
        ({"prompt_tokens": "12", "completion_tokens": [3]}, (12, 0)),
        ({"prompt_tokens": True, "completion_tokens": None}, (0, 0)),
    ],
)
def test_the_usage_a_provider_reports_is_bounded(
    usage: dict[str, Any], expected: tuple[int, int]
) -> None:
    """Negative, absurd or mistyped token counts (a hostile or broken provider) never make a
    run's usage or cost negative or absurd: counts are whole numbers within a call's bound."""
    server = _answering(_completion(usage))
    try:
        judge = _judge(
            f"http://127.0.0.1:{server.server_port}/v1",
            input_cost_per_token=1e-6,
            output_cost_per_token=2e-6,
        )
        reply = judge.extract_claims(GROUND_TRUTH, "r")
    finally:
        server.shutdown()
    prompt, completion = expected
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == expected
    assert reply.usage.cost_usd == pytest.approx(prompt * 1e-6 + completion * 2e-6)


def test_a_body_nested_too_deep_to_parse_makes_the_item_wait() -> None:
    """JSON nested deeper than the parser goes (a hostile provider) is an answer that is not
    a chat completion, not a crash of the worker's task."""
    server = _answering(b"[" * 100_000 + b"]" * 100_000)
    try:
        judge = _judge(f"http://127.0.0.1:{server.server_port}/v1")
        with pytest.raises(ProviderUnavailable) as waits:
            judge.extract_claims(GROUND_TRUTH, "r")
    finally:
        server.shutdown()
    assert waits.value.reason == "provider unavailable"


ERROR_BODY = json.dumps({"error": {"message": "the provider says no", "type": "x"}}).encode()
WAITS, FAILS = "waits", "fails"


@pytest.mark.parametrize(
    ("status", "direct", "through_litellm"),
    [
        (403, (FAILS, "PermissionDeniedError"), (FAILS, "PermissionDeniedError")),
        (404, (FAILS, "NotFoundError"), (FAILS, "NotFoundError")),
        (409, (WAITS, "provider unavailable (409)"), (WAITS, "provider unavailable (409)")),
        (418, (FAILS, "BadRequestError"), (FAILS, "BadRequestError")),
        # litellm hands back no response for a 422 (the name is lost), and follows no
        # redirect (the item waits: is api_base right?)
        (422, (FAILS, "UnprocessableEntityError"), (FAILS, "the provider refused the request")),
        (302, (FAILS, "is api_base right?"), (WAITS, "connection errors")),
    ],
)
def test_each_error_status_is_a_judge_error_on_either_lane(
    status: int, direct: tuple[str, str], through_litellm: tuple[str, str]
) -> None:
    """A provider's answer with this status fails the item at once (the call is wrong) or makes
    it wait (the provider is in trouble), on either lane; never an error the engine does not
    know (a 403, a 409 or a 422 through litellm were: the item was retried by the reaper, with
    a traceback each time)."""
    server = _answering(ERROR_BODY, status=status)
    api_base = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        for lane, (outcome, said) in (("auto", direct), ("litellm", through_litellm)):
            params = {"model": "openai/stub-judge", "api_base": api_base, "api_key": KEY}
            config = ModelConfig("m", params, transport=lane)
            judge = LLMJudge(
                config, FAST_RETRIES, Unlimited(), OpenGate(), LocalCircuitBreaker(), 30
            )
            expected = PermanentJudgeError if outcome == FAILS else ProviderUnavailable
            with pytest.raises(expected) as raised:
                judge.extract_claims(GROUND_TRUTH, "r")
            message = str(raised.value)
            assert said in message, (lane, message)
            assert KEY not in message
            if outcome == WAITS:
                assert isinstance(raised.value, ProviderUnavailable)
                assert raised.value.reason == said, (lane, raised.value.reason)
    finally:
        server.shutdown()


def test_the_environment_s_proxy_is_used_and_no_header_goes_twice(monkeypatch) -> None:
    """As httpx.Client and the OpenAI SDK do: HTTP_PROXY carries the call (the server below is
    the proxy: it sees the absolute URL), NO_PROXY exempts a host; a header the models file
    gives replaces httpx's default of that name, whatever its case."""
    proxy = _answering(_completion({"prompt_tokens": 3, "completion_tokens": 2}))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        for variable in (name, name.lower()):
            monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    try:
        headers = {"User-Agent": "eval-team/1", "X-Team": "a"}
        judge = _judge("http://judge.example.invalid/v1", extra_headers=headers)
        assert judge.extract_claims(GROUND_TRUTH, "r").data["claims"]
        target, names = proxy.requests[-1]  # type: ignore[attr-defined]
        assert target == "http://judge.example.invalid/v1/chat/completions"
        assert names.count("user-agent") == 1 and names.count("content-type") == 1
        assert "x-team" in names

        monkeypatch.setenv("NO_PROXY", "judge.example.invalid")
        with pytest.raises(ProviderUnavailable):  # straight to a host that does not exist
            _judge("http://judge.example.invalid/v1").extract_claims(GROUND_TRUTH, "r")
        assert len(proxy.requests) == 1  # type: ignore[attr-defined]
    finally:
        proxy.shutdown()
