"""The stub's newer provider behaviours seen through litellm itself, as recallq will see them:
packed extraction, an outage, a rejected key (whose error quotes the key), and the whole
Files + Batch API cycle (create_file, create_batch, retrieve_batch, file_content,
cancel_batch)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm: no fetch

import litellm
from litellm.types.utils import LiteLLMBatch

from tests.stub_llm import StubConfig, StubServer

litellm.suppress_debug_info = True
DEFAULTS = StubConfig().as_dict()
MODEL = "stub-judge"
KEY = "sk-stub-integration-5150"


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    # A server of its own: these tests set keys to reject, which the shared session stub's
    # clean fixture would not undo.
    with StubServer() as server:
        yield server


@pytest.fixture(autouse=True)
def clean(stub: StubServer) -> None:
    stub.configure(**DEFAULTS)
    stub.reset()


def openai_params(stub: StubServer, api_key: str = KEY) -> dict[str, Any]:
    return {"custom_llm_provider": "openai", "api_base": stub.base_url, "api_key": api_key}


def user_message(data: dict[str, Any]) -> dict[str, str]:
    return {"role": "user", "content": f"Judge this.\n```json\n{json.dumps(data)}\n```"}


def complete(stub: StubServer, data: dict[str, Any], api_key: str = KEY, **params: Any) -> Any:
    return litellm.completion(
        model=f"openai/{MODEL}",
        api_base=stub.base_url,
        api_key=api_key,
        messages=[{"role": "system", "content": "You are a judge."}, user_message(data)],
        num_retries=0,
        max_retries=0,
        **params,
    )


def packed(texts: list[str]) -> dict[str, Any]:
    return {"ground_truths": [{"index": i, "text": text} for i, text in enumerate(texts)]}


def test_packed_extraction(stub: StubServer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "claims": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["index", "claims"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "claim_extraction_packed", "schema": schema, "strict": True},
    }
    texts = ["Ada was born in 1815. She wrote notes.", "Skip me STUB_PACK_DROP.", "Ice melts."]
    response = complete(stub, packed(texts), response_format=response_format)
    assert json.loads(response.choices[0].message.content) == {
        "items": [
            {"index": 0, "claims": ["Ada was born in 1815", "She wrote notes"]},
            {"index": 2, "claims": ["Ice melts"]},
        ]
    }
    assert response.usage.prompt_tokens > 0
    assert stub.stats()["by_schema"] == {"claim_extraction_packed": 1}
    assert stub.calls()[0]["fault"] == "pack_dropped"


def test_outage_is_service_unavailable_with_retry_after(stub: StubServer) -> None:
    stub.outage(30, retry_after="7")
    with pytest.raises(litellm.ServiceUnavailableError) as caught:
        complete(stub, {"ground_truth": "A fact."})
    assert caught.value.status_code == 503
    # Where recallq's worker/judge/llm.py::_retry_after looks for the header.
    assert caught.value.response.headers.get("retry-after") == "7"
    stub.outage(0)
    assert complete(stub, {"ground_truth": "A fact."}).choices[0].finish_reason == "stop"
    assert [call["fault"] for call in stub.calls()] == ["outage", None]


def test_rejected_key_error_quotes_the_key(stub: StubServer) -> None:
    bad_key = "sk-revoked-key-8812"
    stub.configure(reject_keys=[bad_key])
    with pytest.raises(litellm.AuthenticationError) as caught:
        complete(stub, {"ground_truth": "A fact."}, api_key=bad_key)
    # The point of this fault: the provider's message carries the key, so recallq has to
    # redact errors before it stores or logs them.
    assert bad_key in str(caught.value)
    assert bad_key in caught.value.message
    call = stub.calls()[0]
    assert (call["status"], call["fault"], call["key_suffix"]) == (401, "rejected_key", "8812")


def settled(result: LiteLLMBatch | Coroutine[Any, Any, LiteLLMBatch]) -> LiteLLMBatch:
    """litellm types its sync batch functions as maybe returning a coroutine; they do not."""
    assert not isinstance(result, Coroutine)
    return result


def batch_lines(data_by_id: dict[str, dict[str, Any]]) -> bytes:
    lines = []
    for custom_id, data in data_by_id.items():
        body = {"model": MODEL, "messages": [user_message(data)], "temperature": 0}
        line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
        lines.append(json.dumps({**line, "body": body}))
    return ("\n".join(lines) + "\n").encode()


def wait_for_batch(stub: StubServer, batch_id: str, timeout: float = 10.0) -> LiteLLMBatch:
    deadline = time.monotonic() + timeout
    while True:
        batch = settled(litellm.retrieve_batch(batch_id=batch_id, **openai_params(stub)))
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.1)


def file_lines(stub: StubServer, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = litellm.file_content(file_id=file_id, **openai_params(stub)).content
    return [json.loads(line) for line in content.splitlines()]


def test_batch_cycle(stub: StubServer) -> None:
    stub.configure(batch_delay_s=0.5, batch_line_fail_rate=0.2, seed=3)
    data_by_id: dict[str, dict[str, Any]] = {
        f"item-{i}": {"ground_truth": f"Fact {i}. Detail {i}."} for i in range(30)
    }
    data_by_id["packed"] = packed(["One. Two.", "Three."])
    data_by_id["broken"] = {"ground_truth": "Bad STUB_BROKEN_JSON."}
    data_by_id["refused"] = {"ground_truth": "STUB_HTTP_400"}
    source = litellm.create_file(
        file=("items.jsonl", batch_lines(data_by_id)), purpose="batch", **openai_params(stub)
    )
    assert source.purpose == "batch" and source.bytes == len(batch_lines(data_by_id))
    created = settled(
        litellm.create_batch(
            completion_window="24h",
            endpoint="/v1/chat/completions",
            input_file_id=source.id,
            metadata={"run": "run-1"},
            **openai_params(stub),
        )
    )
    assert created.status == "validating" and created.metadata == {"run": "run-1"}
    batch = wait_for_batch(stub, created.id)
    assert batch.status == "completed"
    outputs = file_lines(stub, batch.output_file_id)
    errors = file_lines(stub, batch.error_file_id)
    counts = batch.request_counts
    assert counts is not None
    assert (counts.total, counts.completed, counts.failed) == (33, len(outputs), len(errors))
    assert errors and len(outputs) > 20

    by_id = {line["custom_id"]: line for line in outputs + errors}
    assert sorted(by_id) == sorted(data_by_id)  # every line answered exactly once
    output_ids = [line["custom_id"] for line in outputs]
    assert output_ids != sorted(output_ids, key=list(data_by_id).index)  # shuffled
    for line in outputs:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["usage"]["total_tokens"] > 0
        number = line["custom_id"].removeprefix("item-")
        if number.isdigit():  # matched by custom_id, not by position
            answer = json.loads(body["choices"][0]["message"]["content"])
            assert answer == {"claims": [f"Fact {number}", f"Detail {number}"]}
    for line in errors:
        assert line["response"]["status_code"] in (400, 500) and line["error"] is None
    assert by_id["refused"]["response"]["status_code"] == 400
    # With seed 3 neither of these lines is among the injected failures.
    packed_answer = by_id["packed"]["response"]["body"]["choices"][0]["message"]["content"]
    assert json.loads(packed_answer)["items"][1] == {"index": 1, "claims": ["Three"]}
    broken = by_id["broken"]["response"]["body"]["choices"][0]["message"]["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)

    assert stub.calls() == []  # no live calls: rpm limits and outages do not apply
    stats = stub.stats()["batches"]
    assert (stats["created"], stats["completed"], stats["lines_total"]) == (1, 1, 33)
    assert stats["lines_failed"] == len(errors)
    recorded = stub.batches()
    assert recorded[0]["custom_ids"] == list(data_by_id)
    assert recorded[0]["key_suffix"] == KEY[-4:]


def test_cancel_batch(stub: StubServer) -> None:
    stub.configure(batch_delay_s=2.0)
    data_by_id = {f"item-{i}": {"ground_truth": f"Fact {i}."} for i in range(40)}
    source = litellm.create_file(
        file=("items.jsonl", batch_lines(data_by_id)), purpose="batch", **openai_params(stub)
    )
    created = settled(
        litellm.create_batch(
            completion_window="24h",
            endpoint="/v1/chat/completions",
            input_file_id=source.id,
            **openai_params(stub),
        )
    )
    time.sleep(0.5)
    cancelling = settled(litellm.cancel_batch(batch_id=created.id, **openai_params(stub)))
    assert cancelling.status == "cancelling" and cancelling.request_counts is not None
    done = cancelling.request_counts.completed
    assert 0 < done < 40
    time.sleep(2.0)  # past the delay: a cancelled batch answers nothing more
    cancelled = wait_for_batch(stub, created.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.request_counts is not None and cancelled.request_counts.completed == done
    partial = file_lines(stub, cancelled.output_file_id)
    assert len(partial) == done
    assert {line["custom_id"] for line in partial} <= set(data_by_id)
    assert stub.stats()["batches"]["cancelled"] == 1
