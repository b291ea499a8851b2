"""An API that requires keys, and keys for it: made in this process by the key store that
`recallq keys create` uses (the tests of that command make theirs with it: cli_key)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from recallq.state.apikeys import KeyStore
from recallq.state.db import Database
from tests.launcher import run_recallq
from tests.services import REPO, start_api, start_worker


def secured_env(service_env: dict[str, str], **settings: Any) -> dict[str, str]:
    """service_env with keys required (it has them off) and the given RECALLQ_* settings."""
    env = {**service_env, "RECALLQ_AUTH": "required"}
    env.update({f"RECALLQ_{name.upper()}": str(value) for name, value in settings.items()})
    return env


def recallq(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`recallq ARGS` run to its end (tests.launcher forks it)."""
    return run_recallq(args, env=env, cwd=REPO, timeout=timeout)


def make_key(env: dict[str, str], project: str, role: str, label: str = "test") -> str:
    """A new key in the database of `env`, as `recallq keys create` makes it."""
    database = Database(env["RECALLQ_DATABASE_URL"])
    try:
        _, key = KeyStore(database).create(project, role, label)
    finally:
        database.dispose()
    return key


def cli_key(env: dict[str, str], project: str, role: str, label: str = "test") -> str:
    """A new key from `recallq keys create` (printed once, on stdout)."""
    done = recallq(env, "keys", "create", "--project", project, "--role", role, "--label", label)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("rq_") and len(key) == 46, key
    return key


def key_id_of(env: dict[str, str], label: str) -> str:
    listed = recallq(env, "keys", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    (row,) = [row for row in rows if row["label"] == label]
    return str(row["id"])


def bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def items(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}{i}", "ground_truth": f"Fact number {i}.", "context": [f"Fact {i}."]}
        for i in range(n)
    ]


def submit(
    api: str,
    key: str | None,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> httpx.Response:
    headers = {**bearer(key), **(headers or {})}
    return httpx.post(f"{api}/v1/runs", json=body, headers=headers, timeout=60, **kwargs)


@contextmanager
def api_and_worker(env: dict[str, str], concurrency: int = 2) -> Iterator[str]:
    """A real API and one Celery worker on `env`, stopped afterwards: the API's URL."""
    process, url = start_api(env)
    worker = start_worker(env, concurrency=concurrency)
    try:
        yield url
    finally:
        worker.stop()
        process.stop()


def completed_run(api: str, key: str, body: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    """Submit `body` and wait until its run completes with every item scored: the run."""
    response = submit(api, key, body)
    assert response.status_code == 202, response.text
    run_id = str(response.json()["id"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = httpx.get(f"{api}/v1/runs/{run_id}", headers=bearer(key)).json()
        if run["status"] == "completed":
            assert run["counts"]["succeeded"] == run["counts"]["total"], run
            return run
        time.sleep(0.2)
    raise TimeoutError(run_id)


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return response.status_code, body["error"]["code"]


def post_labels(api: str, key: str | None, run: str, data: bytes, kind: str) -> httpx.Response:
    """POST a labels file of this Content-Type to a run."""
    return httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content=data,
        headers={**bearer(key), "Content-Type": kind},
        timeout=120,
    )


def env_without_secrets() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
