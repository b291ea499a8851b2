"""Cancel and resume through the run service, against a real API, workers, Postgres, a
Redis of the test's own (stopped for the outage cases) and the stub judge.

Before: `POST /v1/runs/{id}/cancel` answered 500 with Redis down although the run was
cancelled in the database, and a cancelled run could not be continued (409 run_cancelled).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.secured import recallq
from tests.services import RedisServer, start_api, start_worker, wait_for_run


def _items(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"q{i}", "ground_truth": f"Fact number {i}.", "context": [f"Fact number {i}."]}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def redis_own() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(service_env: dict[str, str], redis_own: RedisServer) -> dict[str, str]:
    return {**service_env, "RECALLQ_REDIS_URL": redis_own.url(0), "RECALLQ_CANCEL_WAIT": "2"}


@pytest.fixture(scope="module")
def api(env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


def _run(api: str, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{api}/v1/runs/{run_id}", timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_cancel_with_redis_down_is_a_200_that_matches_the_run_and_resume_waits_for_it(
    api: str, env: dict[str, str], redis_own: RedisServer
) -> None:
    created = httpx.post(f"{api}/v1/runs", json={"items": _items(5)}, timeout=60)
    assert created.status_code == 202, created.text
    run_id = created.json()["id"]  # no worker yet: its items wait

    redis_own.stop()
    try:
        cancelled = httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=60)
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert cancelled.json()["calls_stopped"] is False
        stored = _run(api, run_id)
        assert stored["status"] == "cancelled" and stored["counts"]["cancelled"] == 5

        # resuming needs Redis (the gate must let the calls through): a 503, nothing changed
        refused = httpx.post(f"{api}/v1/runs/{run_id}/resume", timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "unavailable"
        assert _run(api, run_id)["status"] == "cancelled"
    finally:
        redis_own.start()

    resumed = httpx.post(f"{api}/v1/runs/{run_id}/resume", timeout=60)
    assert resumed.status_code == 202, resumed.text
    assert resumed.json()["resumed_items"] == 5
    assert resumed.json()["status"] != "cancelled"
    worker = start_worker(env, concurrency=4)
    try:
        done = wait_for_run(api, run_id)
    finally:
        worker.stop()
    assert done["status"] == "completed", done
    assert done["counts"]["succeeded"] == 5 and done["counts"]["cancelled"] == 0
    assert done["cancel_reason"] is None

    again = httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=60)
    assert again.status_code == 200 and again.json()["status"] == "completed"
    assert again.json()["calls_stopped"] is True


def test_a_completed_run_does_not_resume_and_a_cancelled_one_does_not_retry(
    api: str, env: dict[str, str]
) -> None:
    run_id = httpx.post(f"{api}/v1/runs", json={"items": _items(2)}, timeout=60).json()["id"]
    assert httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=60).status_code == 200
    retried = httpx.post(f"{api}/v1/runs/{run_id}/retry", timeout=60)
    assert retried.status_code == 409
    assert retried.json()["error"]["code"] == "run_cancelled"
    assert "resume" in retried.json()["error"]["message"]
    bad = httpx.post(f"{api}/v1/runs/{run_id}/resume", json={"budget_usd": -1}, timeout=60)
    assert bad.status_code == 422, bad.text
    unknown = httpx.post(f"{api}/v1/runs/{run_id}/resume", json={"items": []}, timeout=60)
    assert unknown.status_code == 422, unknown.text
    new_kind = httpx.post(f"{api}/v1/runs/{run_id}/resume", json={"budget_usd": 5}, timeout=60)
    assert new_kind.status_code == 409 and "has no budget_usd" in new_kind.text
    assert new_kind.json()["error"]["code"] == "no_budget"
    by_cli = recallq(env, "resume", run_id, "--api", api)  # the CLI asks the service
    assert by_cli.returncode == 0, by_cli.stderr
    assert f"resume run {run_id}: 2 items queued again" in by_cli.stderr
    twice = httpx.post(f"{api}/v1/runs/{run_id}/resume", timeout=60)
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "run_not_cancelled"
    again = recallq(env, "resume", run_id, "--api", api)
    assert again.returncode == 2 and "409 run_not_cancelled" in again.stderr
    missing = httpx.post(f"{api}/v1/runs/no-such-run/resume", timeout=60)
    assert missing.status_code == 404


def test_a_budget_cancelled_run_resumes_only_with_a_higher_budget(
    api: str, env: dict[str, str], clean_stub: Any
) -> None:
    body = {"items": _items(4), "model": "stub-judge", "budget_tokens": 1}
    run_id = httpx.post(f"{api}/v1/runs", json=body, timeout=60).json()["id"]
    worker = start_worker(env, concurrency=2)
    try:
        stopped = wait_for_run(api, run_id)
        assert stopped["status"] == "cancelled" and stopped["cancel_reason"] == "budget"
        assert stopped["counts"]["cancelled"] > 0

        refused = httpx.post(f"{api}/v1/runs/{run_id}/resume", timeout=60)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "budget_spent"
        assert "higher budget_usd or budget_tokens" in refused.json()["error"]["message"]

        raised = {"budget_tokens": 10**9}
        resumed = httpx.post(f"{api}/v1/runs/{run_id}/resume", json=raised, timeout=60)
        assert resumed.status_code == 202, resumed.text
        assert resumed.json()["resumed_items"] == stopped["counts"]["cancelled"]
        done = wait_for_run(api, run_id)
    finally:
        worker.stop()
    # the worker had read the budget of 1 token before: the raised one wins in the gate
    assert done["status"] == "completed", done
    assert done["counts"]["cancelled"] == 0
    assert done["counts"]["succeeded"] + done["counts"]["failed"] == 4
