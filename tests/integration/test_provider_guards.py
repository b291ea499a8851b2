"""What a provider can do to recallq, end to end: a real API (keys required), a Celery worker,
Postgres, Redis and the stub LLM server called over HTTP through litellm.

- A provider that echoes the request's Authorization header in its 401: the configured key
  appears in no item, export, response, database row or log line.
- Spend control: a run with `budget_usd` (priced model) or `budget_tokens` (unpriced model)
  stops within one window of calls in flight past its budget, cancelled with reason
  "budget"; the dry-run estimate matches the actual cost of a run within 10%.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.integration.secured import bearer, make_key, secured_env, submit
from tests.services import Process, start_api, start_worker

SECRET = "sk-guard-" + uuid.uuid4().hex  # the provider key recallq must never let out
CONCURRENCY = 4  # the worker's threads: at most this many calls in flight
INPUT_PRICE, OUTPUT_PRICE = 0.000001, 0.000002


def _models_file(directory: Path, base_url: str) -> Path:
    path = directory / "models.yaml"
    common = {"api_base": base_url, "api_key": "os.environ/STUB_API_KEY"}
    models = {
        "models": [
            {"name": "stub-judge", "litellm_params": {"model": "openai/stub-judge", **common}},
            {
                "name": "stub-priced",
                "litellm_params": {
                    "model": "openai/stub-priced",
                    **common,
                    "input_cost_per_token": INPUT_PRICE,
                    "output_cost_per_token": OUTPUT_PRICE,
                },
            },
        ]
    }
    path.write_text(json.dumps(models))  # YAML is a superset of JSON
    return path


@pytest.fixture(scope="module")
def env(service_env: dict[str, str], stub, tmp_path_factory) -> dict[str, str]:
    models = _models_file(tmp_path_factory.mktemp("guards"), stub.base_url)
    return secured_env(
        {**service_env, "STUB_API_KEY": SECRET, "RECALLQ_MODELS_FILE": str(models)},
        submissions_per_minute=0,
        max_attempts=1,
    )


@pytest.fixture(scope="module")
def served(env: dict[str, str]) -> Iterator[tuple[str, str, Process, Process]]:
    key = make_key(env, "guards", "admin")
    worker = start_worker(env, concurrency=CONCURRENCY)
    api, url = start_api(env)
    yield url, key, api, worker
    api.stop()
    worker.stop()


def _wait(url: str, key: str, run_id: str, timeout: float = 180) -> dict[str, Any]:
    with httpx.Client(headers=bearer(key)) as client:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = client.get(f"{url}/v1/runs/{run_id}").json()
            if run["status"] in ("completed", "cancelled"):
                return run
            time.sleep(0.2)
    raise TimeoutError(run_id)


FILLER = (
    "The catalogue lists every item with its maker, the year it was made, its weight and "
    "its colour, as recorded by the registry when the item was first inspected. "
)


def _items(n: int, tag: str) -> list[dict[str, Any]]:
    """Ground truths no run has seen (no claim-cache hits), three claims each, with two
    retrieved passages of a realistic length (a few hundred characters)."""
    return [
        {
            "id": f"{tag}-{i}",
            "ground_truth": f"Item {tag} {i} was made in 1990. It weighs {i} kilograms. "
            f"Its colour is blue number {i}.",
            "context": [
                f"{FILLER}Item {tag} {i} was made in 1990. {FILLER}",
                f"{FILLER}It weighs {i} kilograms. {FILLER}",
            ],
        }
        for i in range(n)
    ]


def test_the_estimate_matches_the_actual_cost_within_ten_percent(served) -> None:
    url, key, _, _ = served
    body = {"model": "stub-priced", "items": _items(20, uuid.uuid4().hex[:8])}
    estimate = submit(url, key, body, params={"dry_run": "true"})
    assert estimate.status_code == 200, estimate.text
    guess = estimate.json()
    assert guess["dry_run"] is True and guess["items"] == 20
    # extraction packed 8 to a call as the workers pack it (8 + 8 + 4), one attribution each
    assert (guess["extraction_calls"], guess["attribution_calls"], guess["calls"]) == (3, 20, 23)
    assert guess["cache_hits"] == 0 and guess["priced"] is True
    run = submit(url, key, body)
    assert run.status_code == 202
    done = _wait(url, key, run.json()["id"])
    assert done["status"] == "completed" and done["counts"]["succeeded"] == 20
    actual = done["usage"]
    print(f"estimate {guess}; actual {actual}")
    assert actual["llm_calls"] == guess["calls"]
    assert abs(guess["cost_usd"] - actual["cost_usd"]) <= 0.10 * actual["cost_usd"]
    assert abs(guess["tokens"] - actual["prompt_tokens"] - actual["completion_tokens"]) <= 0.10 * (
        actual["prompt_tokens"] + actual["completion_tokens"]
    )
    # the same ground truths again: the claim cache serves every extraction
    again = submit(url, key, body, params={"dry_run": "true"}).json()
    assert again["cache_hits"] == 20 and again["calls"] == 20


def _per_call_cost(url: str, key: str) -> float:
    """The most one call of these items costs, from a run without a budget."""
    body = {"model": "stub-priced", "items": _items(4, uuid.uuid4().hex[:8])}
    done = _wait(url, key, submit(url, key, body).json()["id"])
    return 2 * done["usage"]["cost_usd"] / done["usage"]["llm_calls"]


def test_a_run_stops_within_one_window_past_its_budget(served) -> None:
    url, key, _, _ = served
    call_cost = _per_call_cost(url, key)
    budget = 20 * call_cost / 2  # about 10 items' worth of a 60-item run
    body = {
        "model": "stub-priced",
        "budget_usd": budget,
        "items": _items(60, uuid.uuid4().hex[:8]),
    }
    created = submit(url, key, body)
    assert created.status_code == 202 and created.json()["budget_usd"] == budget
    done = _wait(url, key, created.json()["id"])
    spent = done["usage"]["cost_usd"]
    print(
        f"budget {budget:.6f} spent {spent:.6f} calls {done['usage']['llm_calls']} {done['counts']}"
    )
    assert done["status"] == "cancelled" and done["cancel_reason"] == "budget"
    assert spent >= budget  # it ran until the budget was reached...
    assert spent - budget <= CONCURRENCY * call_cost  # ...and at most one window past it
    assert done["counts"]["cancelled"] > 0 and done["counts"]["failed"] == 0
    retried = httpx.post(f"{url}/v1/runs/{done['id']}/retry", headers=bearer(key))
    assert retried.status_code == 409


def test_a_token_budget_holds_for_an_unpriced_model(served) -> None:
    url, key, _, _ = served
    body = {"model": "stub-judge", "budget_tokens": 3000, "items": _items(60, uuid.uuid4().hex[:8])}
    done = _wait(url, key, submit(url, key, body).json()["id"])
    usage = done["usage"]
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    per_call = tokens / usage["llm_calls"]
    print(f"token budget 3000 used {tokens} in {usage['llm_calls']} calls")
    assert done["status"] == "cancelled" and done["cancel_reason"] == "budget"
    assert usage["cost_usd"] == 0  # unpriced
    assert 3000 <= tokens <= 3000 + CONCURRENCY * 2 * per_call


def test_a_user_cancel_says_so(served) -> None:
    url, key, _, _ = served
    created = submit(url, key, {"model": "stub-judge", "items": _items(200, uuid.uuid4().hex[:8])})
    cancelled = httpx.post(f"{url}/v1/runs/{created.json()['id']}/cancel", headers=bearer(key))
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["cancel_reason"] == "user"


def test_a_provider_echoing_the_key_leaks_it_nowhere(served, stub, env: dict[str, str]) -> None:
    url, key, api, worker = served
    stub.configure(reject_keys=[SECRET])
    try:
        created = submit(url, key, {"model": "stub-judge", "items": _items(3, "echo")})
        assert created.status_code == 202
        run_id = created.json()["id"]
        done = _wait(url, key, run_id)
    finally:
        stub.configure(reject_keys=[])
    assert done["counts"]["failed"] == 3
    assert any(call.get("fault") == "rejected_key" for call in stub.calls())  # it did echo

    seen: list[str] = [json.dumps(done)]
    with httpx.Client(headers=bearer(key), timeout=60) as client:
        items = client.get(f"{url}/v1/runs/{run_id}/items").json()
        seen.append(json.dumps(items))
        seen.append(client.get(f"{url}/v1/runs/{run_id}/items/echo-0").text)
        seen.append(client.get(f"{url}/v1/runs/{run_id}/results").text)
        seen.append(client.get(f"{url}/v1/runs/{run_id}/results?format=csv").text)
    error = items["items"][0]["error"]
    assert "AuthenticationError" in error and "[redacted]" in error  # still says what happened

    database = env["RECALLQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(database) as conn:
        for table in ("runs", "items", "claims", "claim_cache"):
            rows = conn.execute(f"SELECT t::text FROM {table} t").fetchall()
            seen.extend(row[0] for row in rows)
    seen.append(worker.output())
    seen.append(api.output())
    leaks = [text[max(0, text.find(SECRET) - 80) :][:200] for text in seen if SECRET in text]
    assert leaks == []
    # nor a recognisable piece of it
    assert not any(SECRET[-16:] in text for text in seen)


def test_the_cli_estimate_is_the_dry_run_estimate(
    served, env: dict[str, str], tmp_path: Path
) -> None:
    from tests.integration.secured import recallq

    url, key, _, _ = served
    items = _items(7, uuid.uuid4().hex[:8])
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    done = recallq(env, "estimate", str(data), "--model", "stub-priced", "--json")
    assert done.returncode == 0, done.stderr
    local = json.loads(done.stdout)
    served_estimate = submit(
        url, key, {"model": "stub-priced", "items": items}, params={"dry_run": "true"}
    ).json()
    for field in ("items", "calls", "prompt_tokens", "completion_tokens", "cost_usd"):
        assert local[field] == served_estimate[field], field
    table = recallq(env, "estimate", str(data), "--model", "stub-priced")
    assert "judge calls        8 (0 claim-cache hits)" in table.stdout  # 1 packed + 7
    unknown = recallq(env, "estimate", str(data), "--model", "nope")
    assert unknown.returncode == 2 and "unknown model" in unknown.stderr
