"""Real services for integration tests: a throwaway Postgres database, a Redis database,
and recallq's own API and worker processes started the way users start them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("RECALLQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_BASE = os.environ.get("RECALLQ_TEST_REDIS", "redis://127.0.0.1:6379")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresDatabase:
    """CREATE DATABASE on enter, DROP on exit."""

    def __init__(self) -> None:
        self.name = f"recallq_test_{uuid.uuid4().hex[:10]}"
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        self.url = f"{base.replace('postgresql://', 'postgresql+psycopg://')}/{self.name}"

    def __enter__(self) -> PostgresDatabase:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc: Any) -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@contextmanager
def migrated_database() -> Iterator[str]:
    """A throwaway database at the head revision; yields its URL."""
    from recallq import migrate

    with PostgresDatabase() as database:
        migrate.upgrade(database.url)
        yield database.url


def redis_database(index: int) -> str:
    url = f"{REDIS_BASE}/{index}"
    redis.Redis.from_url(url).flushdb()
    return url


def write_models_file(directory: Path, stub_base_url: str, **limits: int) -> Path:
    path = directory / "models.yaml"
    lines = [
        "models:",
        "  - name: stub-judge",
        "    litellm_params:",
        "      model: openai/stub-judge",
        f"      api_base: {stub_base_url}",
        "      api_key: os.environ/STUB_API_KEY",
    ]
    lines += [f"    {key}: {value}" for key, value in limits.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Process:
    """A recallq subprocess with its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], name: str) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix=f"recallq-{name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recallq.cli", *args],
            env=env,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{text!r} not seen; output:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL, as the OOM killer would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start_worker(env: dict[str, str], concurrency: int = 8) -> Process:
    worker = Process(["worker", "--concurrency", str(concurrency)], env, "worker")
    worker.wait_for_output(" ready.", timeout=90)
    return worker


def start_api(env: dict[str, str]) -> tuple[Process, str]:
    port = free_port()
    api = Process(["api", "--port", str(port)], env, "api")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return api, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"API did not start:\n{api.output()[-3000:]}")


def wait_for_run(api_url: str, run_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api_url}/v1/runs/{run_id}", timeout=60).json()
        if run["status"] in ("completed", "cancelled", "failed"):
            return run
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id} did not end: {run}")
