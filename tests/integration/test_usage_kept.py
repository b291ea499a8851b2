"""Usage counts every call the provider answered, also those whose answer could not be written
where it was meant to be: a write refused because another pass took the item over meanwhile, a
write the database did not take because it was down (recallq.state.usage_spool). Real API and
worker processes, the stub judge (its count of answered calls is what the provider billed), and
a Postgres cluster of this module's own, stopped under the workers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis import Redis
from sqlalchemy import create_engine, text

from recallq.core.outcomes import Stage
from recallq.core.usage import Usage
from recallq.state.usage_spool import SPOOL_KEY, Charge
from tests.integration.faults import (
    answered_calls,
    assert_exactly_once,
    make_items,
    progress,
    settled_run,
    submit,
    wait_until,
)
from tests.services import (
    PostgresCluster,
    Process,
    migrated_database,
    start_api,
    start_worker,
    wait_for_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresCluster]:
    """A Postgres cluster of this module's own, which a test stops under the workers."""
    cluster = PostgresCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def pg_database(postgres: PostgresCluster) -> Iterator[str]:
    with migrated_database(postgres.admin_url) as url:
        yield url


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return {
        **service_env,
        "RECALLQ_REAPER_INTERVAL": "1",
        "RECALLQ_HEARTBEAT_TTL": "3",
        "RECALLQ_LEASE_SECONDS": "120",
        "RECALLQ_QUEUE_LEASE_SECONDS": "10",
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


@pytest.fixture()
def workers() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for worker in started:
        if worker.proc.poll() is None:
            os.killpg(worker.proc.pid, signal.SIGCONT)  # a paused one stops too
        worker.stop()


def _charges(database_url: str, run_id: str) -> list[dict[str, Any]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT * FROM usage_charges WHERE run_id = :run ORDER BY charge_id"),
                {"run": run_id},
            )
            return [dict(row) for row in rows.mappings()]
    finally:
        engine.dispose()


def test_a_refused_write_still_counts_its_calls(api, workers, env, clean_stub) -> None:
    """A worker paused with calls in flight is taken for dead; another worker takes its items
    over and scores them. Once the paused worker goes on, its calls' answers find the items no
    longer its own: the writes are refused, and their usage counts all the same."""
    clean_stub.configure(latency_ms=2500)
    paused = start_worker(env, concurrency=4)
    workers.append(paused)
    run_id = submit(api, make_items("w", 4))
    wait_until(lambda: clean_stub.stats()["in_flight"] > 0, timeout=60)
    os.killpg(paused.proc.pid, signal.SIGSTOP)  # its heartbeat stops, its calls are answered
    workers.append(start_worker(env, concurrency=4))
    run = wait_for_run(api, run_id, timeout=120)
    assert run["status"] == "completed"
    os.killpg(paused.proc.pid, signal.SIGCONT)
    paused.wait_for_output("refused: no longer owned", timeout=60)

    run = settled_run(api, run_id, lambda: len(answered_calls(clean_stub, "w")))
    answered = answered_calls(clean_stub, "w")
    assert_exactly_once(env["RECALLQ_DATABASE_URL"], run, answered, repeated=True)
    assert run["usage"]["llm_calls"] == len(answered_calls(clean_stub, "w"))


def test_usage_kept_while_postgres_is_down_is_written_once_when_it_is_back(
    api, workers, env, clean_stub, postgres
) -> None:
    clean_stub.configure(latency_ms=1500)
    workers.append(start_worker(env, concurrency=8))
    redis = Redis.from_url(env["RECALLQ_REDIS_URL"], decode_responses=True)
    run_id = submit(api, make_items("d", 24))
    wait_until(lambda: progress(api, run_id) >= 2, timeout=90)
    wait_until(lambda: clean_stub.stats()["in_flight"] > 0, timeout=30)
    with postgres.down():
        # the calls in flight are answered; their writes fail; their usage is kept
        wait_until(lambda: redis.hlen(SPOOL_KEY) > 0, timeout=30)
    wait_until(lambda: redis.hlen(SPOOL_KEY) == 0, timeout=60)  # written once it is back
    run = wait_for_run(api, run_id, timeout=180)
    run = settled_run(api, run_id, lambda: len(answered_calls(clean_stub, "d")))
    answered = answered_calls(clean_stub, "d")
    assert_exactly_once(env["RECALLQ_DATABASE_URL"], run, answered, repeated=True)
    charges = _charges(env["RECALLQ_DATABASE_URL"], run_id)
    assert charges and sum(c["llm_calls"] for c in charges) > 0

    # the same charges kept again (a flush whose commit or whose clean-up was lost): once
    again = {
        c["charge_id"]: Charge(
            c["charge_id"],
            c["item_id"],
            run_id,
            Stage(c["stage"]),
            Usage(
                c["llm_calls"],
                c["prompt_tokens"],
                c["completion_tokens"],
                c["cost_usd"],
                c["call_attempts"],
                c["failed_calls"],
            ),
            c["answered_at"].timestamp(),
        ).to_json()
        for c in charges
    }
    redis.hset(SPOOL_KEY, mapping=again)
    wait_until(lambda: redis.hlen(SPOOL_KEY) == 0, timeout=60)
    after = httpx.get(f"{api}/v1/runs/{run_id}", timeout=30).json()
    assert after["usage"] == run["usage"]
    assert len(_charges(env["RECALLQ_DATABASE_URL"], run_id)) == len(charges)
