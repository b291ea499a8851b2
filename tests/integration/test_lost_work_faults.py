"""Lost work comes back within the heartbeat TTL plus a reaper interval, whatever held it:
real API and worker processes, the stub LLM server, Postgres and a redis-server of this
module's own (issue 19, item 9). The same with `recallq worker --processes 2` (issue 29): a
process SIGKILLed mid-run is replaced and its items come back, SIGTERM to the command stops
both within Docker's grace with nothing lost, a Redis restart under them loses nothing, and
their metrics add up on the command's one port, a dead process's counts included.

The leases are 10 minutes here, so no lease running out can rescue an item within a test's
deadline: only the heartbeats, the held messages and the broker's epoch can.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from typing import cast

import httpx
import psutil
import pytest
from redis import Redis
from sqlalchemy import create_engine, text

from tests.integration.faults import (
    assert_exactly_once,
    calls_for_tag,
    make_items,
    progress,
    submit,
    wait_until,
)
from tests.services import (
    Process,
    RedisServer,
    free_port,
    migrated_database,
    start_api,
    start_worker,
    wait_for_run,
)

pytestmark = pytest.mark.slow

ITEMS = 120
WITHIN = 60.0  # seconds from the last fault to the run's end: the bound issue 19 gives
GRACE = 10.0  # Docker's default stop grace: SIGKILL follows


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server, which the tests restart under the workers."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: no other test's runs for its workers to pick up."""
    with migrated_database() as url:
        yield url


@pytest.fixture(scope="module")
def fault_env(service_env: dict[str, str], redis_server: RedisServer) -> dict[str, str]:
    return {
        **service_env,
        "RECALLQ_REDIS_URL": redis_server.url(),
        "RECALLQ_REAPER_INTERVAL": "1",
        "RECALLQ_HEARTBEAT_TTL": "3",
        "RECALLQ_LEASE_SECONDS": "600",
        "RECALLQ_QUEUE_LEASE_SECONDS": "600",
        # a window smaller than the run: items are released as others end, so some always
        # wait in the broker, queued, with nobody owning them
        "RECALLQ_DISPATCH_WINDOW": "32",
    }


@pytest.fixture(scope="module")
def api(fault_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(fault_env)
    yield url
    process.stop()


@pytest.fixture()
def workers() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for worker in started:
        worker.stop()


def _at(api: str, run_id: str, share: float) -> None:
    wait_until(lambda: progress(api, run_id) >= int(share * ITEMS), timeout=120)


def _unended(database_url: str, run_id: str) -> list[dict[str, object]]:
    """What the run's unended items and the database's sessions were doing (for a failure)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            items = conn.execute(
                text(
                    "SELECT id, status, owner, lease_until, attempts FROM items "
                    "WHERE run_id = :run AND status NOT IN ('succeeded', 'failed', 'cancelled')"
                ),
                {"run": run_id},
            )
            sessions = conn.execute(
                text(
                    "SELECT state, wait_event, left(query, 120) AS query FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            return [dict(r) for r in items.mappings()] + [dict(r) for r in sessions.mappings()]
    finally:
        engine.dispose()


def _completes_within_bound(
    api: str, run_id: str, env: dict[str, str], stub, tag: str, crashed: bool = True
) -> None:
    try:
        run = wait_for_run(api, run_id, timeout=WITHIN)
    except TimeoutError as exc:  # not within the bound
        redis = Redis.from_url(env["RECALLQ_REDIS_URL"], decode_responses=True)
        found = cast(list[str], redis.keys("recallq:*"))
        held = {k: redis.smembers(k) for k in found if k.startswith("recallq:held:")}
        raise AssertionError((_unended(env["RECALLQ_DATABASE_URL"], run_id), found, held)) from exc
    assert_exactly_once(env["RECALLQ_DATABASE_URL"], run, calls_for_tag(stub, tag), crashed)


def test_a_redis_restart_and_a_sigkilled_worker(
    api, workers, fault_env, clean_stub, redis_server
) -> None:
    clean_stub.configure(latency_ms=100)
    workers += [start_worker(fault_env, concurrency=8), start_worker(fault_env, concurrency=8)]
    run_id = submit(api, make_items("rk", ITEMS))
    _at(api, run_id, 0.3)
    redis_server.restart()  # no persistence: every message is gone
    _at(api, run_id, 0.6)
    workers[0].kill()  # mid-run: items in flight, messages held unacknowledged
    _completes_within_bound(api, run_id, fault_env, clean_stub, "rk")
    assert "broker lost its data" in workers[1].output() + workers[0].output()


def test_two_sigkilled_workers(api, workers, fault_env, clean_stub) -> None:
    clean_stub.configure(latency_ms=100)
    workers += [start_worker(fault_env, concurrency=8) for _ in range(3)]
    run_id = submit(api, make_items("kk", ITEMS))
    _at(api, run_id, 0.3)
    workers[0].kill()
    _at(api, run_id, 0.6)
    workers[1].kill()
    _completes_within_bound(api, run_id, fault_env, clean_stub, "kk")


def test_a_worker_started_after_redis_lost_its_data_requeues(
    api, workers, fault_env, clean_stub, redis_server
) -> None:
    clean_stub.configure(latency_ms=100)
    # two threads: most of the run's items wait in the broker, queued, when Redis loses them
    workers.append(start_worker(fault_env, concurrency=2))
    run_id = submit(api, make_items("rs", ITEMS))
    _at(api, run_id, 0.3)
    workers[0].kill()
    redis_server.restart()  # every queued message is gone, and nobody saw it go
    newcomer = start_worker(fault_env, concurrency=8)
    workers.append(newcomer)
    _completes_within_bound(api, run_id, fault_env, clean_stub, "rs")
    assert "broker lost its data" in newcomer.output()


# --- `recallq worker --processes 2` ------------------------------------------------------


def _processes(worker: Process) -> list[psutil.Process]:
    return psutil.Process(worker.proc.pid).children()


def _replaced(worker: Process, victim: psutil.Process) -> int:
    """The pid of the process that replaced `victim`, once it is ready."""
    killed = rf"process (\d) \(pid {victim.pid}\) killed by SIGKILL; starting another"
    wait_until(lambda: re.search(killed, worker.output()) is not None, timeout=30)
    number = re.findall(killed, worker.output())[0]
    back = rf"process {number} is back \(pid (\d+)\)"
    wait_until(lambda: len(re.findall(back, worker.output())) > 0, timeout=30)
    return int(re.findall(back, worker.output())[-1])


def test_a_sigkilled_process_is_replaced_and_its_items_come_back(
    api, workers, fault_env, clean_stub
) -> None:
    clean_stub.configure(latency_ms=100)
    worker = start_worker(fault_env, concurrency=8, processes=2)
    workers.append(worker)
    assert "recallq worker: 2 processes x 8 threads ready." in worker.output()
    victim, other = _processes(worker)
    run_id = submit(api, make_items("pk", ITEMS))
    _at(api, run_id, 0.3)
    victim.kill()  # mid-run: items in flight, messages held unacknowledged
    _completes_within_bound(api, run_id, fault_env, clean_stub, "pk", crashed=True)
    replacement = _replaced(worker, victim)
    assert {p.pid for p in _processes(worker)} == {other.pid, replacement}
    assert worker.proc.poll() is None


def test_sigterm_stops_every_process_in_the_grace_and_loses_nothing(
    api, workers, fault_env, clean_stub
) -> None:
    clean_stub.configure(latency_ms=100)
    # started together (each start is seconds of imports): the other one finishes the run
    worker = Process(["worker", "--processes", "2", "--concurrency", "8"], fault_env, "worker")
    other = Process(["worker", "--processes", "1", "--concurrency", "8"], fault_env, "worker")
    workers += [worker, other]
    for started in workers:
        started.wait_for_output(" ready.", timeout=90)
    processes = _processes(worker)
    run_id = submit(api, make_items("pt", ITEMS))
    _at(api, run_id, 0.3)
    asked = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # the command alone, as `docker stop` sends it
    assert worker.proc.wait(GRACE) == 0, worker.output()[-3000:]
    assert time.monotonic() - asked < GRACE
    assert not any(p.is_running() for p in processes)
    assert "recallq worker: stopped." in worker.output()
    assert progress(api, run_id) < ITEMS  # stopped mid-run: what was left is the other's
    # a warm shutdown: the tasks in flight finished, the others went back: nothing is lost,
    # and no attribution is asked twice
    _completes_within_bound(api, run_id, fault_env, clean_stub, "pt", crashed=False)


def test_a_redis_restart_under_two_processes(
    api, workers, fault_env, clean_stub, redis_server
) -> None:
    clean_stub.configure(latency_ms=100)
    worker = start_worker(fault_env, concurrency=8, processes=2)
    workers.append(worker)
    run_id = submit(api, make_items("pr", ITEMS))
    _at(api, run_id, 0.3)
    redis_server.restart()  # no persistence: every message is gone
    _completes_within_bound(api, run_id, fault_env, clean_stub, "pr", crashed=True)
    assert "broker lost its data" in worker.output()
    assert len(_processes(worker)) == 2


def _page(port: int) -> dict[str, float]:
    """The worker's metrics page: sample (name and labels, as written) -> value."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _total(page: dict[str, float], name: str) -> float:
    return sum(value for sample, value in page.items() if sample.split("{")[0] == name)


def test_the_metrics_of_every_process_add_up_on_one_port(
    api, workers, fault_env, clean_stub
) -> None:
    clean_stub.configure(latency_ms=50)
    port = free_port()
    worker = Process(
        ["worker", "--processes", "2", "--concurrency", "8", "--metrics-port", str(port)],
        fault_env,
        "worker",
    )
    workers.append(worker)
    worker.wait_for_output(" ready.", timeout=90)
    first = _processes(worker)
    run_id = submit(api, make_items("pm", ITEMS))
    _completes_within_bound(api, run_id, fault_env, clean_stub, "pm", crashed=False)
    calls = len(calls_for_tag(clean_stub, "pm"))

    def counts() -> tuple[float, float]:
        page = _page(port)
        return (
            page['recallq_items_ended_total{outcome="succeeded"}'],
            _total(page, "recallq_judge_calls_total"),
        )

    assert counts() == (ITEMS, calls)
    # both processes that scored the run die, one after the other: what they counted stays
    for victim in first:
        victim.kill()
        assert counts() == (ITEMS, calls)  # served meanwhile by the other process
        _replaced(worker, victim)
        assert counts() == (ITEMS, calls)
    assert not {p.pid for p in first} & {p.pid for p in _processes(worker)}
    # the dead processes' heartbeats left the page: its age is the live ones', under the TTL
    time.sleep(float(fault_env["RECALLQ_HEARTBEAT_TTL"]) + 1)
    assert _page(port)["recallq_worker_heartbeat_age_seconds"] < 3
