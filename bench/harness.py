"""Real processes for benchmarks: a stub LLM, a fresh Postgres database, the API and workers."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests import launcher
from tests.services import (
    Process,
    migrated_database,
    redis_database,
    start_api,
    start_worker,
    wait_for_run,
    write_models_file,
)
from tests.stub_llm import StubServer

MODEL = "stub-judge"
# Benchmarks measure the processes' CPU and memory: each a new interpreter, as users start
# them, not a fork of the tests' launcher (which shares its imports, litellm's included).
launcher.SPAWN = True


@contextmanager
def environment(
    latency_ms: float, rpm: int | None = None, transport: str = "auto", **extra: str
) -> Iterator[dict]:
    """A stub server and a migrated database; yields the env for recallq processes. The
    stub's model takes `transport` (recallq.judge.lanes: "auto" is the direct lane)."""
    with (
        StubServer(latency_ms=latency_ms, record_messages=False) as stub,
        migrated_database() as db,
    ):
        directory = Path(tempfile.mkdtemp(prefix="recallq-bench-"))
        fields: dict[str, int | str] = {"rpm": rpm} if rpm else {}
        if transport != "auto":
            fields["transport"] = transport
        env = {
            **os.environ,
            "RECALLQ_DATABASE_URL": db,
            "RECALLQ_REDIS_URL": redis_database(13),
            "RECALLQ_MODELS_FILE": str(write_models_file(directory, stub.base_url, **fields)),
            "STUB_API_KEY": "sk-bench",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # measured as a lab: no keys, no limits per client
            "RECALLQ_AUTH": "off",
            "RECALLQ_SUBMISSIONS_PER_MINUTE": "0",
            "RECALLQ_MAX_ACTIVE_RUNS_PER_PROJECT": "100000",
            **extra,
        }
        yield {"env": env, "stub": stub, "db": db, "dir": directory}


def items(n: int, tag: str = "") -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "id": f"q{i}",
            "ground_truth": f"Item {tag}{i} was made in {1900 + i % 100}. "
            f"Item {tag}{i} weighs {i % 50} kilograms.",
            "context": [
                f"Item {tag}{i} was made in {1900 + i % 100} in Lyon.",
                f"Records say item {tag}{i} weighs {i % 50} kilograms.",
            ],
        }


def ndjson_file(n: int, tag: str, directory: Path) -> Path:
    path = directory / f"items-{tag}-{n}.jsonl"
    with path.open("w") as handle:
        for item in items(n, tag):
            handle.write(json.dumps(item) + "\n")
    return path


def submit_file(api: str, path: Path, model: str = MODEL) -> tuple[str, float]:
    started = time.perf_counter()
    with path.open("rb") as handle:
        response = httpx.post(
            f"{api}/v1/runs",
            params={"model": model},
            content=iter(lambda: handle.read(256 * 1024), b""),
            headers={"content-type": "application/x-ndjson"},
            timeout=600,
        )
    assert response.status_code == 202, response.text
    return response.json()["id"], time.perf_counter() - started


def wait(api: str, run_id: str) -> dict[str, Any]:
    return wait_for_run(api, run_id, timeout=4 * 3600)


def cpu_seconds(processes: list[Process]) -> float:
    """User + system CPU of these recallq processes and their children, so far."""
    total = 0.0
    for process in processes:
        proc = psutil.Process(process.proc.pid)
        for p in [proc, *proc.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
    return total


__all__ = ["start_api", "start_worker", "Process"]
