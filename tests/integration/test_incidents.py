"""A provider incident pauses a run; it never fails items. Real worker processes, Postgres,
Redis and the stub over HTTP through litellm, with the stub answering every call with 503 (or
429) for a while, at random, or with 401 for a rejected key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.faults import (
    calls_for_tag,
    item_rows,
    make_items,
    progress,
    settled_run,
    submit,
    wait_until,
)
from tests.services import (
    Process,
    migrated_database,
    start_api,
    start_worker,
    wait_for_run,
    write_models_file,
)

pytestmark = pytest.mark.slow

# Seconds, not minutes: each outage outlasts what it must (the items' retries, several
# cool-downs, the queue lease), and no longer.
COOL_DOWN, MAX_COOL_DOWN = 2.0, 4.0
OUTAGE_S = 30  # > the retries' ~10 s, the queue lease (10 s) and 7 maximal cool-downs
RETRY_AFTER_S = 10  # > MAX_COOL_DOWN: the wait comes from the header, not the cool-down


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: no other test's runs for its workers to pick up."""
    with migrated_database() as url:
        yield url


@pytest.fixture(scope="module")
def incident_env(service_env: dict[str, str], stub, tmp_path_factory) -> dict[str, str]:
    directory: Path = tmp_path_factory.mktemp("incidents")
    models = write_models_file(directory, stub.base_url)
    with models.open("a") as handle:  # a second model whose key the provider rejects
        handle.write(
            "  - name: locked-judge\n"
            "    litellm_params:\n"
            "      model: openai/stub-judge\n"
            f"      api_base: {stub.base_url}\n"
            "      api_key: os.environ/LOCKED_API_KEY\n"
        )
    return {
        **service_env,
        "RECALLQ_MODELS_FILE": str(models),
        "LOCKED_API_KEY": "sk-locked-0000",
        "RECALLQ_MAX_ATTEMPTS": "5",
        "RECALLQ_RETRY_BASE_DELAY": "0.05",
        "RECALLQ_RETRY_MAX_DELAY": "2",
        "RECALLQ_REQUEST_TIMEOUT": "10",
        "RECALLQ_REAPER_INTERVAL": "1",
        "RECALLQ_HEARTBEAT_TTL": "3",
        "RECALLQ_QUEUE_LEASE_SECONDS": "10",
        "RECALLQ_BREAKER_COOL_DOWN": str(COOL_DOWN),
        "RECALLQ_BREAKER_MAX_COOL_DOWN": str(MAX_COOL_DOWN),
    }


@pytest.fixture(scope="module")
def api(incident_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(incident_env)
    yield url
    process.stop()


@pytest.fixture(scope="module")
def workers(incident_env: dict[str, str]) -> Iterator[list[Process]]:
    started = [start_worker(incident_env, concurrency=8) for _ in range(2)]
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture()
def provider(clean_stub):
    yield clean_stub
    clean_stub.configure(outage_s=0, reject_keys=[])


def _run(api: str, run_id: str) -> dict[str, Any]:
    return httpx.get(f"{api}/v1/runs/{run_id}", timeout=30).json()


def _outage_calls(stub, tag: str) -> list[dict[str, Any]]:
    return [c for c in calls_for_tag(stub, tag) if c["fault"] == "outage"]


def test_an_outage_mid_run_fails_nothing_and_sends_only_probes(
    api: str, workers: list[Process], provider, incident_env: dict[str, str]
) -> None:
    provider.configure(latency_ms=400)
    run_id = submit(api, make_items("o", 300))
    wait_until(lambda: progress(api, run_id) >= 60, timeout=120)
    provider.outage(OUTAGE_S)
    started = time.time()
    wait_until(lambda: _run(api, run_id)["waiting"] is not None, timeout=30)
    waiting = _run(api, run_id)["waiting"]
    assert waiting["model"] == "stub-judge"
    assert waiting["reason"] == "provider unavailable (503)"
    assert waiting["since"] and waiting["next_probe_at"]
    wait_until(lambda: time.time() > started + OUTAGE_S, timeout=OUTAGE_S + 30)

    run = wait_for_run(api, run_id, timeout=300)
    assert run["status"] == "completed"
    assert run["counts"]["failed"] == 0 and run["counts"]["succeeded"] == 300
    assert run["usage"]["deferrals"] > 0 and run["usage"]["failed_calls"] > 0
    answered = [c for c in calls_for_tag(provider, "o") if c["status"] == 200]
    assert run["usage"]["llm_calls"] == len(answered)  # what the provider answered, once
    calls = _outage_calls(provider, "o")
    # calls in flight when it began fail, the breaker opens, then only probes go out
    late = [c for c in calls if c["t"] > started + 5]
    assert len(calls) <= 60, len(calls)
    assert len(late) <= OUTAGE_S / COOL_DOWN, len(late)
    rows = item_rows(incident_env["RECALLQ_DATABASE_URL"], run_id)
    assert all(1 <= r["llm_calls"] <= 2 for r in rows)  # its attribution, a share of packs


def test_a_429_and_500_storm_fails_nothing(api: str, workers: list[Process], provider) -> None:
    provider.configure(rate_429=0.2, rate_500=0.1, retry_after_s="1", seed=5, latency_ms=20)
    run_id = submit(api, make_items("s", 500))
    wait_for_run(api, run_id, timeout=600)
    # a write refused to a worker taken for dead (a heartbeat late on a loaded machine) still
    # counts its calls, maybe after the run completed
    run = settled_run(
        api,
        run_id,
        lambda: len(calls_for_tag(provider, "s")),
        lambda run: run["usage"]["call_attempts"],
    )
    assert run["counts"]["failed"] == 0 and run["counts"]["succeeded"] == 500
    statuses = [c["status"] for c in calls_for_tag(provider, "s")]
    assert statuses.count(429) > 50 and statuses.count(500) > 30  # the storm did happen
    assert run["usage"]["failed_calls"] == statuses.count(429) + statuses.count(500)
    assert run["usage"]["call_attempts"] == len(statuses)


def test_retry_after_sets_how_long_the_breaker_waits(
    api: str, workers: list[Process], provider
) -> None:
    provider.configure(latency_ms=100)
    provider.outage(2 * RETRY_AFTER_S + 5, status=429, retry_after=str(RETRY_AFTER_S))
    run_id = submit(api, make_items("r", 20))
    wait_until(lambda: len(_outage_calls(provider, "r")) > 0, timeout=30)
    wait_until(lambda: _run(api, run_id)["waiting"] is not None, timeout=30)
    assert _run(api, run_id)["waiting"]["reason"] == "rate limited (429)"
    time.sleep(RETRY_AFTER_S + 5)
    stamps = sorted(c["t"] for c in _outage_calls(provider, "r"))
    first = stamps[0]
    burst = [t for t in stamps if t < first + 5]  # the calls in flight when it began
    after = [t for t in stamps if t >= first + 5]
    assert after, "a probe went out after the Retry-After"
    # nothing in between: the breaker waited the Retry-After
    assert after[0] >= burst[-1] + RETRY_AFTER_S - 0.5
    provider.configure(outage_s=0)
    run = wait_for_run(api, run_id, timeout=120)
    assert run["counts"]["succeeded"] == 20


def test_a_rejected_key_fails_its_items_at_once(api: str, workers: list[Process], provider) -> None:
    provider.configure(reject_keys=["sk-locked-0000"])
    started = time.monotonic()
    run_id = submit(api, make_items("k", 10), model="locked-judge")
    run = wait_for_run(api, run_id, timeout=60)
    assert time.monotonic() - started < 30  # no waiting for a deadline
    assert run["status"] == "completed" and run["counts"]["failed"] == 10
    assert run["waiting"] is None
    items = httpx.get(f"{api}/v1/runs/{run_id}/items").json()["items"]
    assert all("AuthenticationError" in i["error"] for i in items)
    assert all("Incorrect API key" in i["error"] for i in items)  # the provider's message


def test_a_short_retry_deadline_fails_items_and_retry_scores_them(
    api: str, workers: list[Process], provider
) -> None:
    provider.outage(20)
    run_id = submit(api, make_items("d", 10), retry_deadline_s=3)
    run = wait_for_run(api, run_id, timeout=60)
    assert run["counts"]["failed"] == 10
    items = httpx.get(f"{api}/v1/runs/{run_id}/items").json()["items"]
    assert all(i["error"].startswith("gave up after the run's retry deadline (3 s)") for i in items)
    provider.configure(outage_s=0)
    recovered = wait_for_run(api, submit(api, make_items("dp", 1)), timeout=60)
    assert recovered["counts"]["succeeded"] == 1  # the breaker saw the provider back
    retried = httpx.post(f"{api}/v1/runs/{run_id}/retry", timeout=30).json()
    assert retried["retried_items"] == 10
    run = wait_for_run(api, run_id, timeout=120)
    assert run["counts"]["succeeded"] == 10 and run["counts"]["failed"] == 0


def test_cancel_during_an_outage_returns_at_once_and_stops_every_call(
    api: str, workers: list[Process], provider
) -> None:
    provider.configure(latency_ms=100)
    run_id = submit(api, make_items("c", 100))
    wait_until(lambda: progress(api, run_id) >= 5, timeout=60)
    provider.outage(60)
    wait_until(lambda: _run(api, run_id)["waiting"] is not None, timeout=30)
    asked = time.monotonic()
    response = httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=60)
    answered = time.time()
    assert time.monotonic() - asked < 3
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    time.sleep(2 * MAX_COOL_DOWN)  # past the next probe
    assert [c for c in calls_for_tag(provider, "c") if c["t"] > answered] == []
