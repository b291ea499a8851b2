"""The stub judge server, exercised over HTTP as a separate process."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.stub_llm import (
    BatchJob,
    BatchLine,
    StubConfig,
    StubServer,
    packed_items,
    parse_batch_input,
    parse_multipart,
    split_claims,
)

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


# --------------------------------------------------------------------------- packed extraction


def packed_data(texts: list[str]) -> dict[str, Any]:
    return {"ground_truths": [{"index": i, "text": text} for i, text in enumerate(texts)]}


def extract_packed(http: httpx.Client, texts: list[str], schema: str | None = None) -> Any:
    body = request_body(schema, packed_data(texts))
    return http.post("/chat/completions", json=body)


def test_packed_items_rule() -> None:
    texts = [(0, "One fact. Two facts."), (4, "Dropped STUB_PACK_DROP. Gone."), (7, "  ")]
    items, dropped = packed_items(texts)
    assert items == [
        {"index": 0, "claims": ["One fact", "Two facts"]},
        {"index": 7, "claims": []},
    ]
    assert dropped == 1
    assert packed_items([]) == ([], 0)


@pytest.mark.parametrize("schema", ["claim_extraction_packed", None])
def test_packed_extraction_equals_single_extractions(
    stub: StubServer, http: httpx.Client, schema: str | None
) -> None:
    texts = ["Einstein was born in 1879. He won the Nobel Prize.", "Water boils!\nIce melts?"]
    items = content(extract_packed(http, texts, schema))["items"]
    assert [item["index"] for item in items] == [0, 1]
    for item, text in zip(items, texts, strict=True):
        assert item["claims"] == content(extract(http, text))["claims"]
    assert stub.stats()["by_schema"] == {"claim_extraction_packed": 1, "claim_extraction": 2}
    assert stub.calls()[0]["schema"] == "claim_extraction_packed"


def test_pack_drop_leaves_item_out_but_single_call_answers(
    stub: StubServer, http: httpx.Client
) -> None:
    texts = ["Kept fact.", "Lost fact STUB_PACK_DROP. Second.", "Last fact."]
    items = content(extract_packed(http, texts))["items"]
    assert [item["index"] for item in items] == [0, 2]
    assert stub.calls()[-1]["fault"] == "pack_dropped"
    assert content(extract(http, texts[1]))["claims"] == ["Lost fact STUB_PACK_DROP", "Second"]


def test_pack_broken_breaks_whole_answer_only_when_packed(http: httpx.Client) -> None:
    texts = ["Fine fact.", "Bad fact STUB_PACK_BROKEN."]
    response = extract_packed(http, texts)
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.json()["choices"][0]["message"]["content"])
    assert content(extract(http, texts[1]))["claims"] == ["Bad fact STUB_PACK_BROKEN"]


def test_single_markers_do_not_apply_to_packed_answers(http: httpx.Client) -> None:
    texts = ["A STUB_BROKEN_JSON fact.", "B STUB_WRONG_SHAPE fact.", "C STUB_TRUNCATE fact."]
    response = extract_packed(http, texts)
    assert response.json()["choices"][0]["finish_reason"] == "stop"
    assert [len(item["claims"]) for item in content(response)["items"]] == [1, 1, 1]


def test_packed_request_validation(http: httpx.Client) -> None:
    body = request_body("claim_extraction_packed", {"ground_truths": "not a list"})
    assert http.post("/chat/completions", json=body).status_code == 400
    body = request_body(None, {"ground_truths": [{"index": "0", "text": "x"}]})
    assert http.post("/chat/completions", json=body).status_code == 400
    assert extract_packed(http, ["fine", "STUB_HTTP_400 here"]).status_code == 400


# --------------------------------------------------------------------------- outages and keys


def test_outage_window(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(rpm_limit=1)
    stub.outage(1.0, retry_after="2")
    ends = time.monotonic() + 1.0
    for _ in range(3):
        response = extract(http, "A fact.")
        assert response.status_code == 503
        assert response.headers["retry-after"] == "2"
        assert response.json()["error"]["type"] == "server_error"
    assert stub.stats()["outage"] is True
    time.sleep(max(0.0, ends - time.monotonic()) + 0.05)
    # The outage's answers did not use up the rpm window of one call.
    assert extract(http, "A fact.").status_code == 200
    assert [c["fault"] for c in stub.calls()] == ["outage"] * 3 + [None]
    assert stub.stats()["by_fault"] == {"outage": 3}


def test_outage_status_without_retry_after_and_reset_ends_it(
    stub: StubServer, http: httpx.Client
) -> None:
    stub.outage(30, status=502)
    response = extract(http, "A fact.")
    assert response.status_code == 502
    assert "retry-after" not in response.headers
    assert response.json()["error"]["message"] == "Bad Gateway"
    stub.reset()
    assert extract(http, "A fact.").status_code == 200
    assert stub.stats()["outage"] is False


def test_rejected_key_echoes_header_and_only_a_suffix_is_recorded(
    stub: StubServer, http: httpx.Client
) -> None:
    bad_key = "sk-reject-me-0042"
    stub.configure(reject_keys=[bad_key])
    body = request_body("claim_extraction", {"ground_truth": "A fact."})
    refused = http.post(
        "/chat/completions", json=body, headers={"Authorization": f"Bearer {bad_key}"}
    )
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["message"].startswith(f"Incorrect API key provided: Bearer {bad_key}. ")
    good = http.post(
        "/chat/completions", json=body, headers={"Authorization": "Bearer sk-good-key-7777"}
    )
    assert good.status_code == 200
    assert http.post("/chat/completions", json=body).status_code == 200  # no key at all
    calls = stub.calls()
    assert [(c["status"], c["fault"], c["key_suffix"]) for c in calls] == [
        (401, "rejected_key", "0042"),
        (200, None, "7777"),
        (200, None, None),
    ]
    assert bad_key not in json.dumps(calls) and "sk-good-key-7777" not in json.dumps(calls)
    upload = http.post(
        "/files",
        files={"file": ("in.jsonl", b"{}\n")},
        data={"purpose": "batch"},
        headers={"Authorization": f"Bearer {bad_key}"},
    )
    assert upload.status_code == 401


def test_new_config_keys_validated_and_passed_to_the_process() -> None:
    config = StubConfig()
    for bad in (
        {"outage_status": 200},
        {"outage_s": -1},
        {"reject_keys": "sk-one-key"},
        {"batch_line_fail_rate": 1.5},
        {"batch_max_requests": 0},
    ):
        with pytest.raises(ValueError):
            config.update(bad)
    config.update({"outage_retry_after": 5.0, "reject_keys": ("sk-a",)})
    assert (config.outage_retry_after, config.reject_keys) == ("5", ["sk-a"])
    with StubServer(reject_keys=["sk-nope-1"], batch_delay_s=0.25, outage_s=30) as other:
        settings = httpx.get(f"{other.root_url}/_stub/config").json()
        assert settings["reject_keys"] == ["sk-nope-1"] and settings["batch_delay_s"] == 0.25
        body = request_body("claim_extraction", {"ground_truth": "A fact."})
        assert httpx.post(f"{other.base_url}/chat/completions", json=body).status_code == 503


# --------------------------------------------------------------------------- files and batches


def batch_line(custom_id: str, data: dict[str, Any], model: str = "stub-judge") -> dict:
    body = request_body(None, data)
    body["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(http: httpx.Client, data: bytes, purpose: str = "batch") -> dict[str, Any]:
    response = http.post("/files", files={"file": ("in.jsonl", data)}, data={"purpose": purpose})
    assert response.status_code == 200, response.text
    return response.json()


def create_batch(http: httpx.Client, file_id: str, **extra: Any) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    return http.post("/batches", json={**body, "completion_window": "24h", **extra})


def results(http: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = http.get(f"/files/{file_id}/content")
    assert response.status_code == 200
    return [json.loads(line) for line in response.content.splitlines()]


def test_parse_multipart_keeps_bytes_exact() -> None:
    payload = b'{"a": 1}\r\n{"b": "--x"}\n\xff\x00 trailing\r\n'
    request = httpx.Request(
        "POST",
        "http://stub/v1/files",
        files={"file": ("in put.jsonl", payload, "application/jsonl")},
        data={"purpose": "batch"},
    )
    fields = parse_multipart(request.headers["content-type"], request.read())
    assert fields == {"purpose": (None, b"batch"), "file": ("in put.jsonl", payload)}
    with pytest.raises(ValueError):
        parse_multipart("application/json", b"{}")
    with pytest.raises(ValueError):
        parse_multipart("multipart/form-data; boundary=abc", b"--abc\r\nno end")


def test_parse_batch_input_rules() -> None:
    def parse(content: bytes, max_requests: int = 10, max_bytes: int = 10**6) -> list:
        lines, model = parse_batch_input(content, "/v1/chat/completions", max_requests, max_bytes)
        assert model == "stub-judge"
        return [line.custom_id for line in lines]

    good = [batch_line(f"id-{i}", {"ground_truth": "x"}) for i in range(3)]
    assert parse(jsonl(good) + b"\n\n") == ["id-0", "id-1", "id-2"]
    problems = {
        "over the limit of 2": (jsonl(good), 2, 10**6),
        "bytes, over the limit": (jsonl(good), 10, 100),
        "no requests": (b"\n", 10, 10**6),
        "duplicate custom_id 'id-0'": (jsonl([*good, good[0]]), 10, 10**6),
        "line 2: not valid JSON": (jsonl(good[:1]) + b"{nope\n", 10, 10**6),
        "url must be": (jsonl([{**good[0], "url": "/v1/embeddings"}]), 10, 10**6),
        "method must be POST": (jsonl([{**good[0], "method": "GET"}]), 10, 10**6),
        "custom_id must be": (jsonl([{**good[0], "custom_id": ""}]), 10, 10**6),
        "differs from": (jsonl([good[0], batch_line("x", {}, model="other")]), 10, 10**6),
    }
    for message, (content, max_requests, max_bytes) in problems.items():
        with pytest.raises(ValueError, match=message):
            parse(content, max_requests, max_bytes)


def test_batch_job_due_grows_with_time() -> None:
    job = BatchJob(
        id="batch_x",
        input_file_id="file-x",
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=None,
        model="stub-judge",
        lines=[BatchLine(f"c{i}", {}) for i in range(10)],
        rng=random.Random(0),
        delay_s=2.0,
        started=100.0,
        created_at=0,
        key_suffix=None,
    )
    assert [job.due(now) for now in (100.0, 100.5, 101.0, 101.99, 102.0, 500.0)] == [
        0,
        2,
        5,
        9,
        10,
        10,
    ]


def test_batch_cycle_shuffled_output_failures_and_counts(
    stub: StubServer, http: httpx.Client
) -> None:
    stub.configure(batch_delay_s=0.3, batch_line_fail_rate=0.25, seed=11)
    lines = [batch_line(f"gt-{i}", {"ground_truth": f"Fact {i}. More {i}."}) for i in range(40)]
    lines.append(batch_line("packed", packed_data(["One. Two.", "Drop STUB_PACK_DROP."])))
    lines.append(batch_line("bad", {"ground_truth": "STUB_HTTP_400"}))
    source = upload(http, jsonl(lines))
    assert source["object"] == "file" and source["status"] == "processed"
    assert source["bytes"] == len(jsonl(lines)) and source["purpose"] == "batch"
    created = create_batch(http, source["id"], metadata={"run": "r1"}).json()
    assert created["status"] == "validating" and created["metadata"] == {"run": "r1"}
    assert created["request_counts"] == {"total": 42, "completed": 0, "failed": 0}
    time.sleep(0.35)
    batch = http.get(f"/batches/{created['id']}").json()
    assert batch["status"] == "completed" and batch["completed_at"] is not None
    outputs = results(http, batch["output_file_id"])
    errors = results(http, batch["error_file_id"])
    counts = batch["request_counts"]
    assert counts == {"total": 42, "completed": len(outputs), "failed": len(errors)}
    assert 0 < len(errors) < 20  # about a quarter failed, plus the STUB_HTTP_400 line
    by_id = {line["custom_id"]: line for line in outputs + errors}
    assert sorted(by_id) == sorted(line["custom_id"] for line in lines)
    in_file_order = [line["custom_id"] for line in lines]
    output_ids = [line["custom_id"] for line in outputs]
    assert output_ids != sorted(output_ids, key=in_file_order.index)  # shuffled
    assert by_id["bad"]["response"]["status_code"] == 400
    for line in outputs:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"]
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["usage"]["total_tokens"] > 0
        if line["custom_id"].startswith("gt-"):
            number = line["custom_id"].removeprefix("gt-")
            answer = json.loads(response["body"]["choices"][0]["message"]["content"])
            assert answer == {"claims": [f"Fact {number}", f"More {number}"]}
    for line in errors:
        assert line["error"] is None and line["response"]["status_code"] in (400, 500)
        assert "error" in line["response"]["body"]
    packed = by_id["packed"]["response"]["body"]["choices"][0]["message"]["content"]
    assert json.loads(packed) == {"items": [{"index": 0, "claims": ["One", "Two"]}]}
    usage = batch["usage"]
    assert usage["input_tokens"] == sum(
        line["response"]["body"]["usage"]["prompt_tokens"] for line in outputs
    )
    assert stub.calls() == []  # batch lines are not live calls
    stats = stub.stats()["batches"]
    assert stats["created"] == 1 and stats["completed"] == 1 and stats["lines_total"] == 42
    assert stats["lines_failed"] == len(errors) and stats["lines_completed"] == len(outputs)
    recorded = stub.batches()
    assert [b["id"] for b in recorded] == [batch["id"]]
    assert recorded[0]["custom_ids"] == [line["custom_id"] for line in lines]


def test_batch_results_are_deterministic_with_seed(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(batch_delay_s=0, batch_line_fail_rate=0.5, seed=5)
    content_bytes = jsonl([batch_line(f"c{i}", {"ground_truth": "x"}) for i in range(12)])

    def run() -> tuple[list[str], list[str]]:
        stub.reset()
        batch_id = create_batch(http, upload(http, content_bytes)["id"]).json()["id"]
        batch = http.get(f"/batches/{batch_id}").json()
        ids = [line["custom_id"] for line in results(http, batch["output_file_id"])]
        return ids, [line["custom_id"] for line in results(http, batch["error_file_id"])]

    first = run()
    assert first == run()
    assert first[0] and first[1]


def test_batch_creation_refusals(stub: StubServer, http: httpx.Client) -> None:
    stub.configure(batch_max_requests=2)
    three = jsonl([batch_line(f"c{i}", {"ground_truth": "x"}) for i in range(3)])
    refused = create_batch(http, upload(http, three)["id"])
    assert refused.status_code == 400
    assert "over the limit of 2" in refused.json()["error"]["message"]
    duplicate = jsonl([batch_line("same", {"ground_truth": "x"})] * 2)
    assert create_batch(http, upload(http, duplicate)["id"]).status_code == 400
    assert create_batch(http, "file-unknown").status_code == 404
    wrong_purpose = upload(http, jsonl([batch_line("a", {"ground_truth": "x"})]), "assistants")
    assert create_batch(http, wrong_purpose["id"]).status_code == 400
    good = upload(http, jsonl([batch_line("a", {"ground_truth": "x"})]))["id"]
    assert create_batch(http, good, endpoint="/v1/embeddings").status_code == 400
    assert create_batch(http, good, completion_window="1h").status_code == 400
    assert create_batch(http, good, metadata={"n": 1}).status_code == 400
    assert http.post("/files", data={"purpose": "batch"}).status_code == 400
    assert stub.batches() == [] and stub.stats()["batches"]["created"] == 0


def test_files_endpoints(http: httpx.Client) -> None:
    stored = upload(http, b'{"x": 1}\n')
    assert http.get(f"/files/{stored['id']}").json() == stored
    assert http.get(f"/files/{stored['id']}/content").content == b'{"x": 1}\n'
    deleted = http.delete(f"/files/{stored['id']}").json()
    assert deleted == {"id": stored["id"], "object": "file", "deleted": True}
    assert http.get(f"/files/{stored['id']}").status_code == 404
    assert http.get(f"/files/{stored['id']}/content").status_code == 404


def test_batch_cancel_keeps_only_lines_answered_before(
    stub: StubServer, http: httpx.Client
) -> None:
    stub.configure(batch_delay_s=1.5)
    lines = [batch_line(f"c{i}", {"ground_truth": f"Fact {i}."}) for i in range(50)]
    batch_id = create_batch(http, upload(http, jsonl(lines))["id"]).json()["id"]
    time.sleep(0.2)
    cancelling = http.post(f"/batches/{batch_id}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    done = cancelling["request_counts"]["completed"]
    assert 0 < done < 50
    time.sleep(1.4)  # past the delay: nothing more is answered after a cancel
    cancelled = http.get(f"/batches/{batch_id}").json()
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
    assert cancelled["request_counts"] == {"total": 50, "completed": done, "failed": 0}
    assert len(results(http, cancelled["output_file_id"])) == done
    assert http.post(f"/batches/{batch_id}/cancel").json()["status"] == "cancelled"
    stats = stub.stats()["batches"]
    assert (stats["cancelled"], stats["completed"], stats["lines_completed"]) == (1, 0, done)
    stub.configure(batch_delay_s=0)
    finished = create_batch(http, upload(http, jsonl(lines[:1]))["id"]).json()["id"]
    refused = http.post(f"/batches/{finished}/cancel")  # all due at once: it has completed
    assert refused.status_code == 409
    assert http.get(f"/batches/{finished}").json()["status"] == "completed"
    assert http.post("/batches/batch_unknown/cancel").status_code == 404


def test_batch_list_pagination(stub: StubServer, http: httpx.Client) -> None:
    source = upload(http, jsonl([batch_line("a", {"ground_truth": "x"})]))["id"]
    ids = [create_batch(http, source).json()["id"] for _ in range(5)]
    first = http.get("/batches", params={"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == ids[::-1][:2]  # newest first
    assert first["has_more"] is True and first["last_id"] == ids[3]
    rest = http.get("/batches", params={"limit": 10, "after": first["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == ids[::-1][2:]
    assert rest["has_more"] is False
    assert [b["id"] for b in stub.batches()] == ids
    all_ids = [cid for batch in stub.batches() for cid in batch["custom_ids"]]
    assert all_ids == ["a"] * 5
