"""The stub judge server, exercised over HTTP as a separate process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.stub_llm import StubConfig, StubServer, split_claims

DEFAULTS = StubConfig().as_dict()


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


@pytest.fixture(scope="module")
def http(stub: StubServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stub.base_url, timeout=10.0) as client:
        yield client


@pytest.fixture(autouse=True)
def clean(stub: StubServer) -> None:
    stub.configure(**DEFAULTS)
    stub.reset()


def user_message(data: dict[str, Any]) -> dict[str, str]:
    block = json.dumps(data)
    return {"role": "user", "content": f"Judge the data below.\n```json\n{block}\n```"}


def request_body(schema: str | None, data: dict[str, Any], **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "stub-judge",
        "messages": [{"role": "system", "content": "You are a judge."}, user_message(data)],
        **params,
    }
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema, "schema": {"type": "object"}, "strict": True},
        }
    return body


def extract(http: httpx.Client, ground_truth: str, **params: Any) -> httpx.Response:
    body = request_body("claim_extraction", {"ground_truth": ground_truth}, **params)
    return http.post("/chat/completions", json=body)


def attribute(
    http: httpx.Client, claims: list[str], contexts: list[str], schema: str | None = None
) -> httpx.Response:
    data = {
        "claims": [{"index": i, "text": text} for i, text in enumerate(claims)],
        "contexts": [{"index": i, "text": text} for i, text in enumerate(contexts)],
    }
    return http.post("/chat/completions", json=request_body(schema or "claim_attribution", data))


def content(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return json.loads(response.json()["choices"][0]["message"]["content"])


def test_split_claims_rule() -> None:
    text = "Einstein was born in 1879. He won the Nobel Prize!  Really?\n\nYes...\n. "
    expected = ["Einstein was born in 1879", "He won the Nobel Prize", "Really", "Yes"]
    assert split_claims(text) == expected
    assert split_claims("Version 2.5 is out") == ["Version 2.5 is out"]
    assert split_claims("  ") == []


def test_extraction_splits_ground_truth(http: httpx.Client) -> None:
    response = extract(http, "Einstein was born in 1879. He won the Nobel Prize.\nHe died in 1955")
    assert content(response) == {
        "claims": ["Einstein was born in 1879", "He won the Nobel Prize", "He died in 1955"]
    }


def test_response_shape_and_usage(http: httpx.Client) -> None:
    response = extract(http, "Water boils at 100 degrees.", max_tokens=256)
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "stub-judge"
    assert body["id"] and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == len(choice["message"]["content"]) // 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_attribution_rule(http: httpx.Client) -> None:
    claims = [
        "Einstein was born in 1879",
        "He won the Nobel Prize",
        "Marie Curie discovered radium",
    ]
    contexts = ["Albert Einstein was born on 14 March 1879.", "Einstein won a Nobel prize, 1921."]
    verdicts = content(attribute(http, claims, contexts))["verdicts"]
    assert verdicts == [
        {
            "claim_index": 0,
            "verdict": "yes",
            "context_indices": [0],
            "reason": "stub: supported by [0]",
        },
        {
            "claim_index": 1,
            "verdict": "yes",
            "context_indices": [1],
            "reason": "stub: supported by [1]",
        },
        {"claim_index": 2, "verdict": "no", "context_indices": [], "reason": "stub: unsupported"},
    ]


def test_schema_inferred_without_response_format(http: httpx.Client) -> None:
    body = request_body(None, {"ground_truth": "One fact. Two facts."})
    assert content(http.post("/chat/completions", json=body)) == {
        "claims": ["One fact", "Two facts"]
    }
    data = {"claims": [{"index": 3, "text": "Paris"}], "contexts": [{"index": 7, "text": "paris"}]}
    verdicts = content(http.post("/chat/completions", json=request_body(None, data)))["verdicts"]
    assert verdicts[0]["claim_index"] == 3 and verdicts[0]["context_indices"] == [7]


def test_rate_429_injection(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(rate_429=1.0, retry_after_s=3)
    response = extract(http, "A fact.")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_rate_500_injection(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(rate_500=1.0)
    response = extract(http, "A fact.")
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


def test_injection_is_deterministic_with_seed(stub: StubServer, http: httpx.Client) -> None:
    def run() -> list[int]:
        stub.configure(rate_429=0.5, seed=7)
        return [extract(http, "A fact.").status_code for _ in range(12)]

    first = run()
    assert first == run()
    assert set(first) == {200, 429}


def test_rpm_limit_refuses_fourth_call(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(rpm_limit=3)
    statuses = [extract(http, "A fact.").status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    refused = extract(http, "A fact.")
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    stub.reset()  # clears the sliding window
    assert extract(http, "A fact.").status_code == 200


@pytest.mark.parametrize("where", ["claim", "context"])
def test_broken_json_marker(http: httpx.Client, where: str) -> None:
    claims = ["A claim STUB_BROKEN_JSON" if where == "claim" else "A claim"]
    contexts = ["A context STUB_BROKEN_JSON" if where == "context" else "A context"]
    response = attribute(http, claims, contexts)
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])
    extraction = extract(http, "Fact one STUB_BROKEN_JSON.").json()["choices"][0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(extraction["message"]["content"])


def test_truncate_marker(http: httpx.Client) -> None:
    choice = extract(http, "Fact one. Fact two STUB_TRUNCATE.").json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])


def test_wrong_shape_marker(http: httpx.Client) -> None:
    assert content(extract(http, "STUB_WRONG_SHAPE here.")) == {"answer": 42}


def test_http_400_marker(http: httpx.Client) -> None:
    response = attribute(http, ["fine claim"], ["context STUB_HTTP_400"])
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_missing_json_block_is_400(http: httpx.Client) -> None:
    body = {"model": "stub-judge", "messages": [{"role": "user", "content": "no block"}]}
    assert http.post("/chat/completions", json=body).status_code == 400


def test_drop_verdict_first_time_only(http: httpx.Client) -> None:
    claims = ["Paris is in France", "Berlin STUB_DROP_VERDICT"]
    contexts = ["Paris is a city in France."]
    first = content(attribute(http, claims, contexts))["verdicts"]
    assert [v["claim_index"] for v in first] == [0]
    repeat = content(attribute(http, claims, contexts))["verdicts"]
    assert [v["claim_index"] for v in repeat] == [0, 1]


def test_drop_verdict_reask_of_missing_claim_is_answered(http: httpx.Client) -> None:
    contexts = ["Paris is a city in France."]
    first = attribute(http, ["Paris is in France", "Berlin STUB_DROP_VERDICT"], contexts)
    assert len(content(first)["verdicts"]) == 1
    data = {
        "claims": [{"index": 1, "text": "Berlin STUB_DROP_VERDICT"}],
        "contexts": [{"index": 0, "text": contexts[0]}],
    }
    reask = http.post("/chat/completions", json=request_body("claim_attribution", data))
    assert [v["claim_index"] for v in content(reask)["verdicts"]] == [1]


def test_always_drop(http: httpx.Client) -> None:
    claims = ["Paris is in France", "Berlin STUB_ALWAYS_DROP"]
    for _ in range(2):
        verdicts = content(attribute(http, claims, ["Paris, France"]))["verdicts"]
        assert [v["claim_index"] for v in verdicts] == [0]


def test_recording_stats_and_reset(stub: StubServer, http: httpx.Client) -> None:
    extract(http, "A fact.", max_tokens=64, temperature=0)
    stub.configure(rate_429=1.0)
    extract(http, "Another fact.")
    calls = stub.calls()
    assert [c["status"] for c in calls] == [200, 429]
    first = calls[0]
    assert first["schema"] == "claim_extraction"
    assert first["model"] == "stub-judge"
    assert first["data"] == {"ground_truth": "A fact."}
    assert first["max_tokens"] == 64 and first["params"]["temperature"] == 0
    assert first["response_format"]["json_schema"]["name"] == "claim_extraction"
    assert first["messages"][0]["role"] == "system"
    assert isinstance(first["t"], float)
    stats = stub.stats()
    assert stats["total"] == 2
    assert stats["by_status"] == {"200": 1, "429": 1}
    assert stats["by_schema"] == {"claim_extraction": 2}
    stub.configure(rate_429=0.0, record_messages=False)
    extract(http, "Third fact.")
    assert stub.calls()[-1]["messages"] is None
    stub.reset()
    assert stub.calls() == []
    assert stub.stats()["total"] == 0


def test_cli_flags_and_bad_config() -> None:
    with StubServer(rate_429=1.0, retry_after_s=5, latency_ms=1, record_messages=False) as other:
        response = httpx.post(
            f"{other.base_url}/chat/completions",
            json=request_body("claim_extraction", {"ground_truth": "A fact."}),
        )
        assert response.status_code == 429
        assert response.headers["retry-after"] == "5"
        assert other.calls()[0]["messages"] is None
        with pytest.raises(httpx.HTTPStatusError):
            other.configure(rate_429=2.0)
        with pytest.raises(httpx.HTTPStatusError):
            other.configure(no_such_key=1)


def test_litellm_compatibility(stub: StubServer) -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    litellm = pytest.importorskip("litellm")
    schema = {
        "type": "object",
        "properties": {"claims": {"type": "array", "items": {"type": "string"}}},
        "required": ["claims"],
        "additionalProperties": False,
    }
    response = litellm.completion(
        model="openai/stub-judge",
        api_base=stub.base_url,
        api_key="sk-test",
        messages=[
            {"role": "system", "content": "Extract claims."},
            user_message({"ground_truth": "Einstein was born in 1879. He won the Nobel Prize."}),
        ],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "claim_extraction", "schema": schema, "strict": True},
        },
        num_retries=0,
    )
    assert json.loads(response.choices[0].message.content) == {
        "claims": ["Einstein was born in 1879", "He won the Nobel Prize"]
    }
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.total_tokens > 0
    call = stub.calls()[-1]
    assert call["schema"] == "claim_extraction"
    assert call["model"] == "stub-judge"
