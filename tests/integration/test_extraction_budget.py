"""A submission's context extractor runs outside any transaction and lock, under a total time
budget: a hostile extractor is refused once the budget is spent, and never holds up another
key's submission in the same project.

Before, the extractor ran inside the submission's transaction holding the project's lock: a
1-item submission from another key of the project waited 44.9 s behind two 150-item ones.
Real API (keys required), Postgres, Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.secured import bearer, make_key, secured_env
from tests.services import start_api

pytestmark = pytest.mark.alone  # a submission answered within 1 s of another's

BUDGET_S = 3.0
# each doubling doubles the work: about 0.1 s per item on this machine, so 150 items pass
# the budget many times over, while each item stays under the per-item timeout
HOSTILE = "output[0].xs" + " | [@,@][]" * 8 + " | [*].to_string(@) | sort(@) | [:1]"


def _agent_item(index: int) -> dict[str, Any]:
    return {
        "id": f"a{index}",
        "ground_truth": "The answer is 0.",
        "input": {"inputMessages": [{"role": "user", "content": "?"}]},
        "output": [
            {
                "id": "m",
                "role": "assistant",
                "content": "0",
                "createdAt": "t",
                "xs": list(range(20)),
            }
        ],
    }


@pytest.fixture(scope="module")
def served(service_env: dict[str, str]) -> Iterator[tuple[str, str, str]]:
    env = secured_env(
        service_env,
        submissions_per_minute=0,
        max_active_runs_per_project=100_000,
        context_extractor_budget=BUDGET_S,
        jmespath_timeout=2.0,
    )
    hostile_key = make_key(env, "shared-project", "write", "hostile")
    other_key = make_key(env, "shared-project", "write", "other")
    process, url = start_api(env)
    yield url, hostile_key, other_key
    process.stop()


def _one_item(api: str, key: str) -> tuple[httpx.Response, float]:
    body = {"items": [{"id": "q", "ground_truth": "A fact.", "context": ["A fact."]}]}
    started = time.monotonic()
    response = httpx.post(f"{api}/v1/runs", json=body, headers=bearer(key), timeout=120)
    return response, time.monotonic() - started


def test_a_hostile_extractor_is_refused_and_blocks_no_other_submission(
    served: tuple[str, str, str],
) -> None:
    api, hostile_key, other_key = served
    baseline = min(_one_item(api, other_key)[1] for _ in range(3))

    hostile_body = {
        "items": [_agent_item(i) for i in range(150)],
        "context_extractor": {"type": "jmespath", "expression": HOSTILE},
    }
    hostile: dict[str, Any] = {}

    def send_hostile() -> None:
        started = time.monotonic()
        hostile["response"] = httpx.post(
            f"{api}/v1/runs", json=hostile_body, headers=bearer(hostile_key), timeout=300
        )
        hostile["elapsed"] = time.monotonic() - started
        hostile["done_at"] = time.monotonic()

    thread = threading.Thread(target=send_hostile)
    thread.start()
    time.sleep(1.0)  # the hostile submission is extracting now
    other, elapsed = _one_item(api, other_key)
    other_done_at = time.monotonic()
    thread.join()

    assert other.status_code == 202, other.text
    refused = hostile["response"]
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_extractor_too_slow"
    assert f"more than {BUDGET_S:g} s" in error["message"]
    # the 1-item submission was answered while the hostile one still ran
    assert hostile["elapsed"] >= BUDGET_S
    assert other_done_at < hostile["done_at"]
    assert elapsed - baseline < 1.0, (elapsed, baseline)
