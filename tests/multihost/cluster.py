"""recallq spread over the hosts of tests/multihost/hosts.py: Postgres, Redis and the API on the
db host, the stub judge on the judge host, workers on worker hosts of their own, each started
the way users start them (`python -m recallq.cli api|worker`, `python -m tests.stub_llm`)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import create_engine, text

from recallq.coordination import keys
from recallq.state import migrate
from tests.multihost import hosts
from tests.multihost.hosts import API_PORT, DB_ADDRESS, JUDGE_ADDRESS, REDIS_PORT, STUB_PORT
from tests.services import write_models_file

DATABASE = "recallq"
TERMINAL = ("completed", "cancelled", "failed")


class Stub:
    """The stub judge's controls (/_stub/...), through its relay."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def configure(self, **config: Any) -> None:
        self._client.post("/_stub/config", json=config).raise_for_status()

    def reset(self) -> None:
        self._client.post("/_stub/reset").raise_for_status()

    def calls(self) -> list[dict[str, Any]]:
        response = self._client.get("/_stub/calls")
        response.raise_for_status()
        return list(response.json())


@dataclass
class Worker:
    """A worker host and the `recallq worker --processes 1` running on it: a supervisor and
    the one Celery process it forked, which does the work."""

    host: hosts.Host
    process: hosts.Process
    child_pid: int = 0

    @property
    def worker_id(self) -> str:
        """As recallq names it (recallq.coordination.liveness, computed in the forked process):
        namespaces share the hostname, and `ip netns exec` execs, so the supervisor is
        `process` and the worker its only child."""
        return f"{socket.gethostname()}:{self.child_pid}"

    @property
    def live(self) -> bool:
        return not self.host.gone and self.process.proc.poll() is None


class Cluster:
    def __init__(self, network: hosts.Network, scratch: Path, settings: dict[str, str]) -> None:
        """`settings`: RECALLQ_* variables for the API and every worker."""
        self.network = network
        self.scratch = scratch
        self.db = network.add_host("db", data="1")
        self.judge = network.add_host("judge", judge="1")
        self.postgres = hosts.Postgres(self.db)
        self.postgres.create_database(DATABASE)
        migrate.upgrade(self.postgres.url(DATABASE))
        self.database_url = self.postgres.url(DATABASE)
        self._redis_process, redis_socket = hosts.start_redis(self.db, scratch)
        self.redis = redis.Redis(unix_socket_path=redis_socket, decode_responses=True)
        base = {
            **os.environ,
            "STUB_API_KEY": "sk-stub-secret",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "RECALLQ_MODELS_FILE": str(
                write_models_file(scratch, f"http://{JUDGE_ADDRESS}:{STUB_PORT}/v1")
            ),
            "RECALLQ_RETRY_BASE_DELAY": "0.05",
            "RECALLQ_AUTH": "off",
            "RECALLQ_SUBMISSIONS_PER_MINUTE": "0",
            "RECALLQ_MAX_ACTIVE_RUNS_PER_PROJECT": "100000",
            **settings,
        }
        self.worker_env = {
            **base,
            "RECALLQ_DATABASE_URL": self.postgres.url(DATABASE, over="network"),
            "RECALLQ_REDIS_URL": f"redis://{DB_ADDRESS}:{REDIS_PORT}/0",
        }
        stub = self.judge.start(
            [
                sys.executable, "-m", "tests.stub_llm", "--host", JUDGE_ADDRESS,
                "--port", str(STUB_PORT), "--no-record-messages",
            ],
            {**os.environ, "PYTHONUNBUFFERED": "1"},
            "stub",
        )  # fmt: skip
        stub.wait_for_output("STUB_READY", timeout=60)
        hosts.relay(self.judge, scratch / "stub.sock", f"{JUDGE_ADDRESS}:{STUB_PORT}")
        self.stub = Stub(hosts.http_client(scratch / "stub.sock", f"{JUDGE_ADDRESS}:{STUB_PORT}"))
        api_env = {
            **base,
            "RECALLQ_DATABASE_URL": self.postgres.url(DATABASE, over="local"),
            "RECALLQ_REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
        }
        api_command = [sys.executable, "-m", "recallq.cli", "api", "--port", str(API_PORT)]
        self._api = self.db.start(api_command, api_env, "api")
        self._api.wait_for_output("Application startup complete", timeout=120)
        hosts.relay(self.db, scratch / "api.sock", f"127.0.0.1:{API_PORT}")
        self.api = hosts.http_client(scratch / "api.sock", f"127.0.0.1:{API_PORT}", timeout=60)
        self._workers: list[Worker] = []

    def close(self) -> None:
        """The workers and the API first: nothing is left writing to a database that stops."""
        for worker in self._workers:
            worker.process.stop(timeout=10)
        self._api.stop(timeout=10)
        self.api.close()
        self.redis.close()
        self.postgres.stop()

    # --- workers -----------------------------------------------------------------------------

    def workers(self, count: int, threads: int) -> list[Worker]:
        """`count` live workers, each on a host of its own, with its links whole and no delay:
        those left by an earlier test, and new ones for the rest (started together: each
        spends seconds of CPU importing litellm)."""
        live = [w for w in self._workers if w.live][:count]
        for worker in live:
            worker.host.heal()
            worker.host.delay_postgres(0)
        starting: list[Worker] = []
        for _ in range(count - len(live)):
            name = f"w{len(self._workers) + len(starting) + 1}"
            number = str(10 + len(self._workers) + len(starting) + 1)
            host = self.network.add_host(name, data=number, judge=number, wire=True)
            command = [
                sys.executable, "-m", "recallq.cli", "worker",
                "--processes", "1", "--concurrency", str(threads),
            ]  # fmt: skip
            starting.append(Worker(host, host.start(command, self.worker_env, "worker")))
        for worker in starting:
            worker.process.wait_for_output(" ready.", timeout=180)
            worker.child_pid = hosts.only_child(worker.process.pid)
        self._workers += starting
        return live + starting

    def alive(self, worker: Worker) -> bool:
        """Whether recallq counts the worker alive (its heartbeat key is there)."""
        return bool(self.redis.exists(keys.heartbeat(worker.worker_id)))

    @contextmanager
    def watching(self, workers: list[Worker]) -> Iterator[dict[str, float]]:
        """Yields, filled in when the block ends, how long each worker (by id) looked dead to
        the reaper in all (its heartbeat key missing), from polls every 0.2 s."""
        dead: dict[str, float] = {w.worker_id: 0.0 for w in workers}
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.2):
                for worker in workers:
                    if not self.alive(worker):
                        dead[worker.worker_id] += 0.2

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield dead
        finally:
            stop.set()
            thread.join()

    # --- runs --------------------------------------------------------------------------------

    def submit(self, items: list[dict[str, Any]]) -> str:
        response = self.api.post("/v1/runs", json={"model": "stub-judge", "items": items})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.api.get(f"/v1/runs/{run_id}")
        response.raise_for_status()
        return dict(response.json())

    def progress(self, run_id: str) -> int:
        counts = self.run(run_id)["counts"]
        return int(counts["succeeded"]) + int(counts["failed"])

    def wait_for_run(self, run_id: str, timeout: float) -> dict[str, Any]:
        run = hosts.wait_until(
            lambda: (found := self.run(run_id))["status"] in TERMINAL and found,
            timeout=timeout,
            interval=0.2,
        )
        return dict(run)

    def query(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return [dict(row) for row in conn.execute(text(sql), params).mappings()]
        finally:
            engine.dispose()

    def owned_by(self, run_id: str, worker: Worker) -> set[int]:
        """The run's items running under one of the worker's owner tokens."""
        rows = self.query(
            "SELECT id FROM items WHERE run_id = :run AND status = 'running' AND owner LIKE :owner",
            run=run_id,
            owner=f"{worker.worker_id}/%",
        )
        return {row["id"] for row in rows}

    def calls_for(self, tag: str) -> list[dict[str, Any]]:
        """The stub's calls for items made with `tag` (tests.integration.faults.make_items)."""
        return [
            c for c in self.stub.calls() if c["data"] and f"Sample {tag}" in json.dumps(c["data"])
        ]


def timed(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> float:
    """Seconds until `predicate` holds (TimeoutError after `timeout`)."""
    start = time.monotonic()
    hosts.wait_until(predicate, timeout, interval)
    return time.monotonic() - start
