"""Every read of a run answers while Redis is down mid-run: the HTTP API's reads and the web
pages read runs through recallq.runs.reads, which gives what Postgres knows and says
`waiting_unknown` when Redis, which knows why an active run waits, cannot be asked. Never a
500 (GET /v1/runs/{id} of an active run was one)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.integration.faults import make_items, progress, submit, wait_until
from tests.services import RedisServer, migrated_database, start_api, start_worker

ITEMS = 30


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server, which the test stops under the API."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: no other test's runs for its worker to pick up."""
    with migrated_database() as url:
        yield url


def test_every_read_of_a_run_answers_while_redis_is_down(
    service_env: dict[str, str], redis_server: RedisServer, clean_stub
) -> None:
    env = {**service_env, "RECALLQ_REDIS_URL": redis_server.url()}
    clean_stub.configure(latency_ms=400)  # slow enough that the run is mid-way when it stops
    api, url = start_api(env)
    worker = start_worker(env, concurrency=2)
    try:
        run_id = submit(url, make_items("noredis", ITEMS))
        wait_until(lambda: progress(url, run_id) >= 2, timeout=120)
        redis_server.stop()

        run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=30)
        assert run.status_code == 200, run.text
        view = run.json()
        assert view["status"] == "running" and view["counts"]["succeeded"] >= 2
        assert view["waiting"] is None and view["waiting_unknown"] is True

        item = quote("noredis-0", safe="")
        reads = [
            "/v1/runs",
            f"/v1/runs/{run_id}/items",
            f"/v1/runs/{run_id}/items/{item}",
            f"/v1/runs/{run_id}/results",
            f"/v1/runs/{run_id}/results?format=csv",
            f"/v1/compare?base={run_id}&candidate={run_id}",
            f"/v1/runs/{run_id}/labels",
            f"/v1/runs/{run_id}/agreement",
            "/",
            f"/runs/{run_id}",
            f"/runs/{run_id}/items",
            f"/runs/{run_id}/items/{item}",
            f"/compare?base={run_id}&candidate={run_id}",
            f"/runs/{run_id}/label",
        ]
        answers = {path: httpx.get(f"{url}{path}", timeout=30).status_code for path in reads}
        assert answers == dict.fromkeys(reads, 200)
        page = httpx.get(f"{url}/runs/{run_id}", timeout=30).text
        assert "Redis cannot be reached now" in page
    finally:
        redis_server.start()  # empty again: the worker stops without waiting on it
        worker.stop()
        api.stop()
