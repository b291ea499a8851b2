"""Real services for integration tests: throwaway Postgres databases and clusters, the test
session's own redis-server, and recallq's own API and worker processes started the way users
start them.

Nothing here touches a server the tests did not start, except to CREATE and DROP databases of
their own on the Postgres named by RECALLQ_TEST_PG: Redis is a redis-server of the session's
own on a free port, and the tests that restart Postgres restart a cluster of their own
(initdb in a temporary directory).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import socket
import subprocess
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

from tests.launcher import recallq_process

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("RECALLQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresDatabase:
    """CREATE DATABASE on enter, DROP on exit."""

    def __init__(self, admin_url: str = PG_ADMIN_URL) -> None:
        self.admin_url = admin_url
        self.name = f"recallq_test_{uuid.uuid4().hex[:10]}"
        base = admin_url.rsplit("/", 1)[0]
        self.url = f"{base.replace('postgresql://', 'postgresql+psycopg://')}/{self.name}"

    def __enter__(self) -> PostgresDatabase:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc: Any) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@contextmanager
def migrated_database(admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """A throwaway database at the head revision; yields its URL."""
    from recallq.state import migrate

    with PostgresDatabase(admin_url) as database:
        migrate.upgrade(database.url)
        yield database.url


def _as_postgres_user(command: list[str]) -> list[str]:
    """Postgres refuses to run as root; CI runs as root."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresCluster:
    """A Postgres cluster of the tests' own (initdb in a temporary directory, a free port), for
    tests that stop or restart the database under running workers."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        self.bin = Path(found[-1]).parent if found else Path(shutil.which("initdb") or "").parent
        self.dir = Path(tempfile.mkdtemp(prefix="recallq-pg-"))
        self.port = free_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = str(self.dir / "data")
        subprocess.run(
            _as_postgres_user(
                [str(self.bin / "initdb"), "-D", data, "-U", "postgres", "-A", "trust"]
            ),
            check=True,
            capture_output=True,
        )
        self._ctl = [str(self.bin / "pg_ctl"), "-D", data, "-l", str(self.dir / "log"), "-w"]
        self._options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"

    def start(self) -> PostgresCluster:
        subprocess.run(
            _as_postgres_user([*self._ctl, "-o", self._options, "start"]),
            check=True,
            capture_output=True,
        )
        return self

    def restart(self) -> None:
        subprocess.run(
            _as_postgres_user([*self._ctl, "-m", "fast", "-o", self._options, "restart"]),
            check=True,
            capture_output=True,
        )

    @contextmanager
    def down(self) -> Iterator[None]:
        """Stopped (a fast shutdown: every session is ended) for the block, then started again:
        a database outage."""
        subprocess.run(
            _as_postgres_user([*self._ctl, "-m", "fast", "stop"]), check=True, capture_output=True
        )
        try:
            yield
        finally:
            self.start()

    def stop(self) -> None:
        subprocess.run(_as_postgres_user([*self._ctl, "-m", "immediate", "stop"]), check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """A redis-server of the tests' own on a free port, without persistence, as the machine's
    is configured: a restart loses every key, as a real one without persistence does."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="recallq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url())
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self) -> None:
        """Stopped and started again: every message in it is gone."""
        self.stop()
        self.start()


_redis_server: RedisServer | None = None


def redis_server() -> RedisServer:
    """The test session's (or a benchmark's) own redis-server, started on first use."""
    global _redis_server
    if _redis_server is None:
        _redis_server = RedisServer().start()
        atexit.register(_redis_server.stop)
    return _redis_server


def redis_database(index: int) -> str:
    """Database `index` of the session's own redis-server, emptied."""
    url = redis_server().url(index)
    redis.Redis.from_url(url).flushdb()
    return url


def write_models_file(directory: Path, stub_base_url: str, **fields: int | str) -> Path:
    """The stub's model `stub-judge`, with `fields` of its entry (`rpm=`, `transport=`)."""
    path = directory / "models.yaml"
    lines = [
        "models:",
        "  - name: stub-judge",
        "    litellm_params:",
        "      model: openai/stub-judge",
        f"      api_base: {stub_base_url}",
        "      api_key: os.environ/STUB_API_KEY",
    ]
    lines += [f"    {key}: {value}" for key, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Process:
    """A recallq process (`python -m recallq.cli ARGS`, tests.launcher forks it) in a session
    of its own, with its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], name: str) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix=f"recallq-{name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = recallq_process(
            args, env=env, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT
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


def start_worker(env: dict[str, str], concurrency: int = 8, processes: int = 1) -> Process:
    """`recallq worker`: `processes` of `concurrency` threads (one by default: the command's
    default, one per CPU, would double the suite's CPU)."""
    args = ["worker", "--processes", str(processes), "--concurrency", str(concurrency)]
    worker = Process(args, env, "worker")
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
