"""Batch-mode runs end to end: the API and real worker processes on Postgres and a Redis of this
module's own, the stub's Files and Batch APIs over HTTP through litellm, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.integration.faults import make_items, wait_until
from tests.integration.test_precision import check_precision
from tests.integration.test_precision import items as precision_items
from tests.launcher import run_recallq
from tests.services import (
    REPO,
    Process,
    RedisServer,
    migrated_database,
    start_api,
    start_worker,
    wait_for_run,
    write_models_file,
)
from tests.stub_llm import StubConfig, StubServer

pytestmark = pytest.mark.slow

PRICE_IN, PRICE_OUT = 2e-6, 8e-6  # USD per token, online
KEY = "sk-stub-batch-mode-4410"


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer() as server:  # its own: these tests change its batch settings
        yield server


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """This module's own database: no other test's runs for its workers to pick up."""
    with migrated_database() as url:
        yield url


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()  # its own: a test restarts it
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(database_url: str, redis_server: RedisServer, stub, tmp_path_factory) -> dict[str, str]:
    directory: Path = tmp_path_factory.mktemp("batch-mode")
    models = write_models_file(directory, stub.base_url)
    text_ = models.read_text().replace(
        "      api_key: os.environ/STUB_API_KEY\n",
        "      api_key: os.environ/STUB_API_KEY\n"
        f"      input_cost_per_token: {PRICE_IN:.9f}\n"
        f"      output_cost_per_token: {PRICE_OUT:.9f}\n",
    )
    models.write_text(
        text_
        + "    batch: true\n"
        + "  - name: live-judge\n"
        + "    litellm_params:\n"
        + "      model: openai/stub-judge\n"
        + f"      api_base: {stub.base_url}\n"
        + "      api_key: os.environ/STUB_API_KEY\n"
    )
    return {
        **os.environ,
        "RECALLQ_DATABASE_URL": database_url,
        "RECALLQ_REDIS_URL": redis_server.url(0),
        "RECALLQ_MODELS_FILE": str(models),
        "STUB_API_KEY": KEY,
        "RECALLQ_BATCH_POLL_INTERVAL": "1",
        "RECALLQ_REAPER_INTERVAL": "1",
        "RECALLQ_HEARTBEAT_TTL": "3",
        "RECALLQ_RETRY_BASE_DELAY": "0.05",
        "RECALLQ_REQUEST_TIMEOUT": "10",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "RECALLQ_AUTH": "off",  # keys are tested elsewhere
        "RECALLQ_SUBMISSIONS_PER_MINUTE": "0",
        # the lane sends one request per item and stage: online runs here do the same, so
        # the two spend the same tokens and only the price differs
        "RECALLQ_EXTRACTION_PACK": "1",
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


@pytest.fixture()
def worker(env: dict[str, str]) -> Iterator[list[Process]]:
    """One worker; a test that kills it appends the ones it starts instead."""
    started = [start_worker(env, concurrency=8)]
    yield started
    for process in started:
        process.stop()


@pytest.fixture()
def provider(stub: StubServer) -> StubServer:
    stub.configure(**{**StubConfig().as_dict(), "batch_delay_s": 1.0})
    stub.reset()
    return stub


def submit(api: str, items: list[dict[str, Any]], **fields: Any) -> str:
    body = {"model": "stub-judge", **fields, "items": items}
    response = httpx.post(f"{api}/v1/runs", json=body, timeout=120)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def run_view(api: str, run_id: str) -> dict[str, Any]:
    return httpx.get(f"{api}/v1/runs/{run_id}", timeout=30).json()


def results(api: str, run_id: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{api}/v1/runs/{run_id}/results", timeout=120)
    rows = [json.loads(line) for line in response.text.splitlines()]
    return {row["id"]: row for row in rows}


def unique_custom_ids(stub: StubServer) -> list[str]:
    sent = [custom_id for batch in stub.batches() for custom_id in batch["custom_ids"]]
    assert [c for c, n in Counter(sent).items() if n > 1] == [], "a request was sent twice"
    return sent


def sql(database_url: str, statement: str) -> list[Any]:
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement))
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def varied_items(tag: str, n: int) -> list[dict[str, Any]]:
    """Scores of 1, 0.67 and 0, items without context or ground truth, and re-asks."""
    items = make_items(tag, n)
    for i, item in enumerate(items):
        if i % 3 == 1:
            item["ground_truth"] += f" Sample {tag}{i} glows in the dark."  # unsupported
        if i % 50 == 7:
            item["context"] = []
        if i % 97 == 11:
            item["ground_truth"] = None
        elif i % 101 == 13:
            item["ground_truth"] += " STUB_DROP_VERDICT"  # a verdict left out: asked again
    return items


def test_a_2000_item_batch_run_scores_as_online_at_the_batch_price(
    api: str, worker: list[Process], provider: StubServer, database_url: str
) -> None:
    items = varied_items("big", 2000)
    online_id = submit(api, items, name="online")
    online = wait_for_run(api, online_id, timeout=600)
    assert online["status"] == "completed" and online["mode"] == "online"
    online_results = results(api, online_id)
    provider.reset()  # forget the live calls and which verdicts the stub dropped once
    sql(database_url, "DELETE FROM claim_cache")  # else extraction comes from the cache

    started = time.monotonic()
    batch_id = submit(api, items, name="batch", mode="batch")
    batch = wait_for_run(api, batch_id, timeout=600)
    took = time.monotonic() - started
    assert batch["status"] == "completed" and batch["mode"] == "batch"
    assert provider.stats()["total"] == 0  # not one chat completion went online

    def scored(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {
            key: (r["status"], r["score"], r["reason"], r["error"], r["claims"])
            for key, r in rows.items()
        }

    assert scored(results(api, batch_id)) == scored(online_results)
    assert batch["counts"] == online["counts"] and batch["summary"] == online["summary"]
    assert len({r["score"] for r in online_results.values()}) >= 3

    usage, online_usage = batch["usage"], online["usage"]
    for key in ("llm_calls", "prompt_tokens", "completion_tokens"):
        assert usage[key] == online_usage[key], key
    assert online_usage["cost_usd"] == pytest.approx(
        online_usage["prompt_tokens"] * PRICE_IN + online_usage["completion_tokens"] * PRICE_OUT,
        rel=1e-4,
    )
    assert usage["cost_usd"] == pytest.approx(online_usage["cost_usd"] / 2, rel=1e-4)
    assert usage["by_lane"]["batch"]["llm_calls"] == usage["llm_calls"]
    assert usage["by_lane"]["online"]["llm_calls"] == 0
    assert online_usage["by_lane"]["online"]["llm_calls"] == online_usage["llm_calls"]
    extracted = [i for i in items if i["ground_truth"] is not None]
    attributed = [i for i in extracted if i["context"]]
    asked_again = [i for i in attributed if "STUB_DROP_VERDICT" in i["ground_truth"]]
    stages = usage["by_stage"]
    assert stages["extraction"]["llm_calls"] == len(extracted)
    assert stages["attribution"]["llm_calls"] == len(attributed) + len(asked_again)

    sent = unique_custom_ids(provider)
    assert len(sent) == usage["llm_calls"] == batch["batch"]["requests_submitted"]
    assert batch["batch"]["completed"] == usage["llm_calls"]
    assert batch["batch"]["failed"] == 0 and batch["batch"]["batches_pending"] == 0
    sizes = [b["request_counts"]["total"] for b in provider.batches()]
    assert sizes == [len(extracted), len(attributed), len(asked_again)]
    print(f"\n2,000-item batch run: {took:.1f} s, usage {json.dumps(batch['usage'])}")


def test_a_killed_worker_and_a_restarted_redis_lose_nothing_and_send_nothing_twice(
    api: str,
    worker: list[Process],
    provider: StubServer,
    redis_server: RedisServer,
    env: dict[str, str],
) -> None:
    provider.configure(batch_delay_s=6)
    run_id = submit(api, make_items("kill", 300), mode="batch")

    def pending(stage_batches: int) -> bool:
        lane = run_view(api, run_id)["batch"]
        return len(provider.batches()) == stage_batches and lane["batches_pending"] == 1

    for stage_batches in (1, 2):  # while extraction is pending, then attribution
        wait_until(lambda n=stage_batches: pending(n), timeout=60)
        worker[-1].kill()  # SIGKILL
        redis_server.restart()  # every key and message gone
        worker.append(start_worker(env, concurrency=8))

    run = wait_for_run(api, run_id, timeout=120)
    assert run["status"] == "completed"
    assert run["counts"]["succeeded"] == 300 and run["counts"]["failed"] == 0
    assert run["usage"]["llm_calls"] == 600 and run["usage"]["failed_calls"] == 0
    assert len(unique_custom_ids(provider)) == 600
    assert [b["request_counts"]["total"] for b in provider.batches()] == [300, 300]
    assert all(r["claims_total"] == 2 and r["score"] == 1.0 for r in results(api, run_id).values())


def test_cancel_cancels_the_provider_batch(
    api: str, worker: list[Process], provider: StubServer
) -> None:
    provider.configure(batch_delay_s=30)
    run_id = submit(api, make_items("cancel", 50), mode="batch")
    wait_until(lambda: len(provider.batches()) == 1, timeout=30)
    asked = time.monotonic()
    response = httpx.post(f"{api}/v1/runs/{run_id}/cancel", timeout=30)
    assert time.monotonic() - asked < 3  # the API calls no provider
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    wait_until(lambda: provider.batches()[0]["status"] == "cancelled", timeout=30)
    wait_until(lambda: run_view(api, run_id)["batch"]["batches_pending"] == 0, timeout=30)
    run = run_view(api, run_id)
    assert run["status"] == "cancelled" and run["counts"]["cancelled"] == 50
    time.sleep(3)
    assert len(provider.batches()) == 1  # nothing more was sent


def test_batch_mode_needs_a_model_marked_batch(api: str) -> None:
    body = {"model": "live-judge", "mode": "batch", "items": make_items("refused", 1)}
    refused = httpx.post(f"{api}/v1/runs", json=body, timeout=30)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "batch_not_supported" and "stub-judge" in error["message"]
    bad = httpx.post(f"{api}/v1/runs", json={**body, "mode": "fast"}, timeout=30)
    assert bad.status_code == 422


def test_a_judged_batch_run_gets_its_precision_through_the_batch_api(
    api: str, worker: list[Process], provider: StubServer
) -> None:
    run_id = submit(api, precision_items("api-judged"), mode="batch", precision="judged")
    run = wait_for_run(api, run_id)
    assert run["status"] == "completed" and run["counts"]["succeeded"] == 8
    assert run["mode"] == "batch" and run["precision"] == "judged"
    page = httpx.get(f"{api}/v1/runs/{run_id}/items", params={"limit": 100}, timeout=30).json()
    check_precision({item["id"]: item for item in page["items"]})
    stats = provider.stats()
    assert stats["total"] == 0  # not one online call
    relevance = run["usage"]["by_stage"]["relevance"]
    assert stats["batches"]["lines_by_schema"]["context_relevance"] == 6
    assert relevance["llm_calls"] == 6 and relevance["cost_usd"] > 0
    assert run["usage"]["by_lane"]["batch"]["llm_calls"] == run["usage"]["llm_calls"]
    unique_custom_ids(provider)


def cli(*args: str, api: str) -> subprocess.CompletedProcess[str]:
    return run_recallq(args, env={**os.environ, "RECALLQ_API_URL": api}, cwd=REPO, timeout=180)


def test_the_cli_submits_a_batch_run_and_local_mode_refuses_one(
    api: str, worker: list[Process], provider: StubServer, tmp_path: Path
) -> None:
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in make_items("cli", 20)))
    submitted = cli(
        "submit", str(data), "--model", "stub-judge", "--batch", "--wait", "--json", api=api
    )
    assert submitted.returncode == 0, submitted.stderr
    final = json.loads(submitted.stdout)  # the run id goes to stderr
    assert final["mode"] == "batch" and final["counts"]["succeeded"] == 20
    assert "provider batch(es) pending" in submitted.stderr
    assert provider.stats()["total"] == 0

    local = cli("run", str(data), "--batch", api=api)
    assert local.returncode == 2
    assert "--batch needs the service" in local.stderr and "recallq submit" in local.stderr
