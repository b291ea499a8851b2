"""The HTTP API against real Postgres and Redis: validation, NDJSON, idempotency, paging,
results streaming, cancel. No worker runs here, so runs stay where the API leaves them."""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.services import start_api


@pytest.fixture(scope="module")
def api(service_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(service_env)
    yield url
    process.stop()


def _items(n: int) -> list[dict]:
    return [
        {"id": f"q{i}", "ground_truth": f"Fact number {i}.", "context": [f"Fact number {i}."]}
        for i in range(n)
    ]


def _error(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return response.status_code, body["error"]["code"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"items": _items(1), "model": "no-such-model"}, (422, "unknown_model")),
        ({"items": _items(1), "scale": 0}, (422, "invalid_request")),
        ({"items": _items(1), "scale": "big"}, (422, "invalid_request")),
        ({"items": []}, (422, "empty_run")),
        ({"items": "nope"}, (422, "invalid_request")),
        ({"items": [{"id": "a", "ground_truth": "x"}]}, (422, "no_context")),
        (
            {"items": [{"id": "a", "context": ["x"]}, {"id": "a", "context": ["y"]}]},
            (422, "duplicate_id"),
        ),
        ({"items": [{"id": "a", "context": ["x"], "ground_thruth": 1}]}, (422, "invalid_request")),
        ({"items": [{"id": "a", "context": [{"doc": 1}]}]}, (422, "invalid_request")),
        (
            {"items": [{"id": "a", "context": ["x"], "retrieved_contexts": ["y"]}]},
            (422, "invalid_request"),
        ),
        ({"items": [7]}, (422, "invalid_request")),
        ({"items": _items(1), "context_extractor": {"type": "magic"}}, (422, "invalid_request")),
        ({"items": _items(1), "api_base": "http://evil"}, (422, "invalid_request")),
    ],
)
def test_bad_submissions_are_4xx_and_store_nothing(api: str, body: dict, expected) -> None:
    response = httpx.post(f"{api}/v1/runs", json=body)
    assert _error(response) == expected


def test_a_duplicate_id_is_named(api: str) -> None:
    items = [*_items(3), {"id": "q1", "context": ["again"]}]
    response = httpx.post(f"{api}/v1/runs", json={"items": items})
    assert _error(response) == (422, "duplicate_id")
    assert "'q1' appears twice" in response.json()["error"]["message"]


def test_malformed_json_and_wrong_media_type(api: str) -> None:
    response = httpx.post(
        f"{api}/v1/runs", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert _error(response) == (400, "invalid_json")
    response = httpx.post(f"{api}/v1/runs", content=b"x", headers={"content-type": "text/plain"})
    assert _error(response) == (415, "unsupported_media_type")


def test_unknown_run_and_item_are_404(api: str) -> None:
    assert _error(httpx.get(f"{api}/v1/runs/nope")) == (404, "not_found")
    run = httpx.post(f"{api}/v1/runs", json={"items": _items(1)}).json()
    assert _error(httpx.get(f"{api}/v1/runs/{run['id']}/items/zzz")) == (404, "not_found")
    assert _error(httpx.get(f"{api}/v1/runs/{run['id']}/items?cursor=%%%")) == (
        422,
        "invalid_cursor",
    )
    assert _error(httpx.get(f"{api}/v1/runs/{run['id']}/items?limit=0"))[0] == 422
    minus_one = base64.urlsafe_b64encode(b"-1").decode()
    assert _error(httpx.get(f"{api}/v1/runs/{run['id']}/items?cursor={minus_one}")) == (
        422,
        "invalid_cursor",
    )


def test_the_item_size_limit_holds_for_json_bodies_too(api: str) -> None:
    items = _items(2)
    items[1]["context"] = ["x" * (1024 * 1024 + 1)]
    response = httpx.post(f"{api}/v1/runs", json={"items": items}, timeout=30)
    assert _error(response) == (413, "item_too_large")
    assert "item 1" in response.json()["error"]["message"]


def test_ndjson_submission_pages_and_results(api: str) -> None:
    lines = "\n".join(json.dumps(item) for item in _items(250)) + "\n\n"
    response = httpx.post(
        f"{api}/v1/runs",
        params={"name": "stream", "scale": 2, "context": json.dumps(["static"])},
        content=lines.encode(),
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["name"] == "stream" and run["scale"] == 2 and run["counts"]["total"] == 250
    assert run["status"] == "queued" and run["model"] == "local/lexical"

    seen, cursor = [], None
    while True:
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{api}/v1/runs/{run['id']}/items", params=params).json()
        seen += [item["index"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(250))
    pending = httpx.get(f"{api}/v1/runs/{run['id']}/items", params={"status": "pending"}).json()
    assert len(pending["items"]) == 100 and all(i["status"] == "pending" for i in pending["items"])

    jsonl = httpx.get(f"{api}/v1/runs/{run['id']}/results").text.splitlines()
    assert [json.loads(line)["id"] for line in jsonl] == [f"q{i}" for i in range(250)]
    rows = list(
        csv.DictReader(
            io.StringIO(
                httpx.get(f"{api}/v1/runs/{run['id']}/results", params={"format": "csv"}).text
            )
        )
    )
    assert len(rows) == 250 and rows[0]["id"] == "q0" and rows[0]["claims"] == "[]"


def test_bad_ndjson_line_is_named(api: str) -> None:
    body = b'{"id": "a", "context": ["x"]}\n{oops\n'
    response = httpx.post(
        f"{api}/v1/runs", content=body, headers={"content-type": "application/x-ndjson"}
    )
    status, code = _error(response)
    assert (status, code) == (422, "invalid_json")
    assert "line 2" in response.json()["error"]["message"]


def test_idempotency_key_returns_the_same_run(api: str) -> None:
    headers = {"Idempotency-Key": "submit-42"}
    first = httpx.post(f"{api}/v1/runs", json={"items": _items(3)}, headers=headers)
    second = httpx.post(f"{api}/v1/runs", json={"items": _items(3)}, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    other = httpx.post(f"{api}/v1/runs", json={"items": _items(3)})
    assert other.json()["id"] != first.json()["id"]


def test_an_idempotency_key_reused_for_another_submission_is_a_422(api: str) -> None:
    headers = {"Idempotency-Key": "submit-43"}
    first = httpx.post(f"{api}/v1/runs", json={"items": _items(3)}, headers=headers)
    assert first.status_code == 202
    for changed in ({"items": _items(4)}, {"items": _items(3), "scale": 10}):
        response = httpx.post(f"{api}/v1/runs", json=changed, headers=headers)
        assert _error(response) == (422, "idempotency_key_reused")
    lines = "".join(json.dumps(item) + "\n" for item in _items(3))
    same = httpx.post(
        f"{api}/v1/runs",
        content=lines.encode(),
        headers={**headers, "content-type": "application/x-ndjson"},
    )
    assert same.status_code == 202 and same.json()["id"] == first.json()["id"]


def test_cancel_marks_unscored_items_cancelled(api: str) -> None:
    run = httpx.post(f"{api}/v1/runs", json={"items": _items(5)}).json()
    cancelled = httpx.post(f"{api}/v1/runs/{run['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["counts"]["cancelled"] == 5 and cancelled["counts"]["pending"] == 0
    assert httpx.post(f"{api}/v1/runs/{run['id']}/retry").status_code == 409


def test_responses_never_show_endpoints_or_keys(api: str, service_env: dict[str, str]) -> None:
    run = httpx.post(f"{api}/v1/runs", json={"items": _items(1), "model": "stub-judge"}).json()
    text = json.dumps(run)
    assert "stub-judge" in text
    assert service_env["STUB_API_KEY"] not in text and "127.0.0.1" not in text


def test_health_and_readiness(api: str) -> None:
    assert httpx.get(f"{api}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{api}/readyz")  # no worker runs in this module
    assert ready.status_code == 503 and ready.json()["workers_alive"] == 0
    checks = ready.json()["checks"]
    assert checks == {"database": "ok", "redis": "ok", "workers": "none alive"}
    # a readiness probe where the workers scale to zero (deploy/kubernetes): still reported
    ready = httpx.get(f"{api}/readyz", params={"exclude": "workers"})
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["workers"] == "none alive"
    assert ready.json()["status"] == "ok"
    refused = httpx.get(f"{api}/readyz", params={"exclude": "disks"})
    assert refused.status_code == 422 and "error" in refused.json(), refused.text


def test_a_run_with_no_live_worker_says_so(api: str) -> None:
    run = httpx.post(f"{api}/v1/runs", json={"items": _items(1)}).json()
    waiting = httpx.get(f"{api}/v1/runs/{run['id']}").json()["waiting"]
    assert waiting["reason"].startswith("no live worker") and waiting["model"] is None


def test_a_large_run_submits_and_cancels_in_one_piece(api: str) -> None:
    """70,000 items: more than one statement's parameter limit, so nothing may list them."""
    n = 70_000
    lines = "".join(json.dumps({"id": f"i{i}", "context": ["c"]}) + "\n" for i in range(n))
    response = httpx.post(
        f"{api}/v1/runs",
        content=lines.encode(),
        headers={"content-type": "application/x-ndjson"},
        timeout=300,
    )
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    cancelled = httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=300)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["counts"]["cancelled"] == n
