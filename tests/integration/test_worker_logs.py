"""What a worker process logs about the items it ends, read from its real log: a real API,
one Celery worker, Postgres, Redis and the stub LLM over HTTP through litellm.

An item is named by the user's id and the start of its run's id (never the internal item
number), and the outcome is the item's own: one the judge refuses is "failed", one whose run
was cancelled under it (its budget spent) is "cancelled", never "failed" (issue 20.11)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from tests.integration.secured import bearer, make_key, secured_env, submit
from tests.services import Process, start_api, start_worker


@pytest.fixture(scope="module")
def served(service_env: dict[str, str]) -> Iterator[tuple[str, str, Process, dict[str, str]]]:
    env = secured_env(service_env, submissions_per_minute=0, max_attempts=1)
    key = make_key(env, "logs", "admin")
    worker = start_worker(env, concurrency=1)  # one call at a time: the budget stops the rest
    api, url = start_api(env)
    yield url, key, worker, env
    api.stop()
    worker.stop()


def _wait(url: str, key: str, run_id: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = httpx.get(f"{url}/v1/runs/{run_id}", headers=bearer(key)).json()
        if run["status"] in ("completed", "cancelled", "failed"):
            return run
        time.sleep(0.2)
    raise TimeoutError(run_id)


def _items(tag: str, n: int, refused: int | None = None) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{tag}-{i}",
            "ground_truth": f"Item {tag} {i} was made in 1990. It weighs {i} kilograms.",
            "context": [
                "STUB_HTTP_400: this passage makes the judge refuse."
                if i == refused
                else f"Item {tag} {i} was made in 1990."
            ],
        }
        for i in range(n)
    ]


def _internal_ids(env: dict[str, str], run_id: str) -> dict[str, int]:
    database = env["RECALLQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(database) as conn:
        rows = conn.execute("SELECT key, id FROM items WHERE run_id = %s", (run_id,)).fetchall()
    return {key: item_id for key, item_id in rows}


def _lines(worker: Process, run_id: str) -> list[str]:
    return [line for line in worker.output().splitlines() if f"of run {run_id[:8]}" in line]


def test_a_failed_item_is_logged_by_the_users_id(served) -> None:
    url, key, worker, env = served
    tag = "fail" + uuid.uuid4().hex[:6]
    created = submit(url, key, {"model": "stub-judge", "items": _items(tag, 3, refused=1)})
    assert created.status_code == 202, created.text
    run_id = created.json()["id"]
    done = _wait(url, key, run_id)
    assert (done["counts"]["succeeded"], done["counts"]["failed"]) == (2, 1)

    lines = _lines(worker, run_id)
    assert [line for line in lines if "failed" in line], worker.output()[-3000:]
    (failed,) = [line for line in lines if " failed: " in line]
    assert f"item '{tag}-1' of run {run_id[:8]} failed: " in failed
    internal = _internal_ids(env, run_id)[f"{tag}-1"]
    assert not re.search(rf"\bitem #?{internal}\b", worker.output())


def test_an_item_cancelled_under_it_is_logged_cancelled_not_failed(served) -> None:
    url, key, worker, env = served
    tag = "budget" + uuid.uuid4().hex[:6]
    # one token of budget: the first call spends it, the next call of the run is refused
    body = {"model": "stub-judge", "budget_tokens": 1, "items": _items(tag, 3)}
    created = submit(url, key, body)
    assert created.status_code == 202, created.text
    run_id = created.json()["id"]
    done = _wait(url, key, run_id)
    assert (done["status"], done["cancel_reason"]) == ("cancelled", "budget")
    assert done["counts"]["cancelled"] >= 1

    deadline = time.monotonic() + 30  # the log line follows the item's end
    while not (lines := _lines(worker, run_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lines, worker.output()[-3000:]
    assert not [line for line in lines if "failed" in line], lines
    cancelled = [line for line in lines if " cancelled: " in line]
    assert cancelled, lines
    named = {re.search(r"item '([^']+)'", line).group(1) for line in cancelled}  # type: ignore[union-attr]
    assert named <= {f"{tag}-{i}" for i in range(3)} and named
    items = httpx.get(f"{url}/v1/runs/{run_id}/items", headers=bearer(key)).json()["items"]
    assert all(item["status"] == "cancelled" for item in items if item["id"] in named)
    internal = set(_internal_ids(env, run_id).values())
    assert not any(re.search(rf"\bitem #?{n}\b", line) for line in lines for n in internal)
