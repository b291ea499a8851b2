"""A run submitted through the API, scored by a real Celery worker calling the stub over HTTP
through litellm, stored in Postgres."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.services import Process, start_api, start_worker, wait_for_run

ITEMS: list[dict[str, Any]] = [
    {
        "id": "full",
        "input": "When was Einstein born and what did he win?",
        "ground_truth": "Einstein was born in 1879. Einstein won the Nobel Prize.",
        "context": ["Einstein was born in 1879 in Ulm.", "In 1921 Einstein won the Nobel Prize."],
    },
    {
        "id": "partial",
        "ground_truth": "Paris is the capital of France. Berlin is the capital of Germany. "
        "Rome is the capital of Italy.",
        "context": ["Paris is the capital of France.", "Rome is the capital of Italy."],
    },
    {"id": "no-ground-truth", "ground_truth": None, "context": ["Anything at all."]},
    {"id": "no-context", "ground_truth": "Water boils at 100 degrees.", "context": []},
    {
        "id": "static-context",
        "ground_truth": {"answer": "Mercury orbits closest"},
    },
]


@pytest.fixture(scope="module")
def services(service_env: dict[str, str]) -> Iterator[tuple[str, Process]]:
    worker = start_worker(service_env)
    api, url = start_api(service_env)
    yield url, worker
    api.stop()
    worker.stop()


def _calls_for(stub, texts: list[str]) -> list[dict]:
    """The stub's answered calls about these ground truths or contexts (the session's
    database may hold other tests' runs, which workers score too)."""

    def mentions(call: dict) -> bool:
        blob = json.dumps(call["data"])
        return any(json.dumps(text)[1:-1] in blob for text in texts)

    return [c for c in stub.calls() if c["status"] == 200 and c["data"] and mentions(c)]


def _calls_by_kind(stub, texts: list[str]) -> Counter:
    return Counter(call["schema"] for call in _calls_for(stub, texts))


def test_run_through_api_and_worker(services, clean_stub) -> None:
    url, _ = services
    body = {
        "name": "smoke",
        "model": "stub-judge",
        "context": ["The answer is that Mercury orbits closest to the Sun."],
        "items": ITEMS,
    }
    response = httpx.post(f"{url}/v1/runs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] == "queued" and run["counts"]["total"] == 5

    run = wait_for_run(url, run["id"])
    assert run["status"] == "completed"
    assert run["counts"] == {
        "total": 5,
        "pending": 0,
        "running": 0,
        "succeeded": 5,
        "failed": 0,
        "cancelled": 0,
    }
    items = {i["id"]: i for i in httpx.get(f"{url}/v1/runs/{run['id']}/items").json()["items"]}

    full = items["full"]
    assert full["score"] == 1.0 and full["claims_total"] == 2 and full["claims_attributed"] == 2
    assert [(c["index"], c["verdict"], c["context_indices"]) for c in full["claims"]] == [
        (0, "yes", [0]),
        (1, "yes", [1]),
    ]
    assert full["reason"].startswith("The score is 1 because 2 of 2 claims are supported")

    partial = items["partial"]
    assert partial["score"] == 0.67
    assert (partial["claims_total"], partial["claims_attributed"]) == (3, 2)
    assert [c["verdict"] for c in partial["claims"]] == ["yes", "no", "yes"]
    assert 'missing: "Berlin is the capital of Germany"' in partial["reason"]

    no_gt = items["no-ground-truth"]
    assert no_gt["score"] == 0 and no_gt["claims"] == [] and "no ground truth" in no_gt["reason"]

    no_ctx = items["no-context"]
    assert no_ctx["score"] == 0 and "no context was retrieved" in no_ctx["reason"]
    assert [c["verdict"] for c in no_ctx["claims"]] == ["no"]

    static = items["static-context"]  # JSON ground truth, judged against the run's context
    assert static["claims_total"] == 1 and static["score"] == 1.0

    # the 4 ground truths in one packed extraction call, then one attribution per item with
    # context; no call for the item without a ground truth
    texts = [ITEMS[i]["ground_truth"] for i in (0, 1, 3)] + ["Mercury orbits closest"]
    texts += ITEMS[0]["context"] + ITEMS[1]["context"]
    assert _calls_by_kind(clean_stub, texts) == Counter(
        {"claim_extraction_packed": 1, "claim_attribution": 3}
    )
    (packed,) = [c["data"] for c in clean_stub.calls() if c["schema"] == "claim_extraction_packed"]
    packed_texts = [entry["text"] for entry in packed["ground_truths"]]
    assert '{"answer": "Mercury orbits closest"}' in packed_texts and len(packed_texts) == 4
    assert run["usage"]["llm_calls"] == 4
    assert run["usage"]["prompt_tokens"] > 0 and run["usage"]["completion_tokens"] > 0
    assert run["summary"] == {
        "mean_score": round((1 + 0.67 + 0 + 0 + 1) / 5, 4),
        # mean ± 1.96 sd/√5, with sd over the five scores (dividing by n): 0.534 ± 0.3965
        "mean_ci95": [0.1375, 0.9305],
        "scored_items": 5,
        "claims_total": 2 + 3 + 0 + 1 + 1,
        "claims_attributed": 2 + 2 + 0 + 0 + 1,
        "no_ground_truth": 1,  # scored 0 without a call, and counted apart
        "no_context": 1,  # likewise: its context is empty
        "histogram": {"edges": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "counts": [2, 0, 0, 1, 2]},
        # cited: full [rel, rel], partial [rel, rel], static [rel]; none for no context /
        # no ground truth
        "mean_context_precision": 1.0,
        "context_precision_ci95": [1.0, 1.0],
        "precision_items": 3,
        "precision_histogram": {
            "edges": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            "counts": [0, 0, 0, 0, 3],
        },
        "first_relevant_rank": {"1": 3, "2": 0, "3": 0, "4": 0, "5+": 0, "none": 0},
    }
    assert run["failures"] == []


def test_protocol_v1_on_the_wire(services, clean_stub) -> None:
    """One item alone: its extraction goes as the single-item form."""
    url, _ = services
    item: dict[str, Any] = {
        "id": "wire",
        "ground_truth": "Curie was born in Warsaw. Curie won two Nobel Prizes.",
        "context": ["Curie was born in Warsaw in 1867.", "Curie won two Nobel Prizes."],
    }
    body = {"model": "stub-judge", "scale": 10, "items": [item]}
    run = httpx.post(f"{url}/v1/runs", json=body).json()
    run = wait_for_run(url, run["id"])
    scored = httpx.get(f"{url}/v1/runs/{run['id']}/items/wire").json()
    assert scored["score"] == 10.0

    calls = _calls_for(clean_stub, [item["ground_truth"], *item["context"]])
    assert [c["schema"] for c in calls] == ["claim_extraction", "claim_attribution"]
    for call in calls:
        assert call["model"] == "stub-judge"
        fmt = call["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        assert fmt["json_schema"]["name"] == call["schema"]
        last_user = [m for m in call["messages"] if m["role"] == "user"][-1]["content"]
        assert last_user.count("```json") == 1
    assert calls[0]["data"] == {"ground_truth": item["ground_truth"]}
    assert calls[1]["data"] == {
        "claims": [
            {"index": 0, "text": "Curie was born in Warsaw"},
            {"index": 1, "text": "Curie won two Nobel Prizes"},
        ],
        "contexts": [{"index": i, "text": t} for i, t in enumerate(item["context"])],
    }


def test_agent_shaped_items_use_the_context_extractor(services, clean_stub) -> None:
    url, _ = services
    message = {
        "id": "m1",
        "role": "assistant",
        "createdAt": "2026-11-01T10:00:00Z",
        "content": {
            "format": 2,
            "parts": [
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "result",
                        "toolCallId": "c1",
                        "toolName": "search",
                        "args": {"q": "tea"},
                        "result": [{"text": "Green tea contains caffeine."}],
                    },
                }
            ],
        },
    }
    body = {
        "model": "stub-judge",
        "context_extractor": {"type": "tool_results"},
        "context": ["Static passages mention nothing relevant."],
        "items": [
            {
                "id": "agent",
                "input": {"inputMessages": []},
                "output": [message],
                "ground_truth": "Green tea contains caffeine.",
            },
            {"id": "plain", "input": "q", "ground_truth": "Green tea contains caffeine."},
        ],
    }
    run = wait_for_run(url, httpx.post(f"{url}/v1/runs", json=body).json()["id"])
    items = {i["id"]: i for i in httpx.get(f"{url}/v1/runs/{run['id']}/items").json()["items"]}
    assert items["agent"]["score"] == 1.0  # judged against the tool result
    assert items["plain"]["score"] == 0.0  # not agent-shaped: the static context
    contexts = [
        c["data"]["contexts"] for c in clean_stub.calls() if c["schema"] == "claim_attribution"
    ]
    assert [{"index": 0, "text": "Green tea contains caffeine."}] in contexts
