"""`recallq submit / status / results / cancel / retry` against a running API and worker."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import REPO, start_api, start_worker


@pytest.fixture(scope="module")
def api_url(service_env: dict[str, str]) -> Iterator[str]:
    worker = start_worker(service_env, concurrency=4)
    api, url = start_api(service_env)
    yield url
    api.stop()
    worker.stop()


def recallq(*args: str, api: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RECALLQ_API_URL": api}
    return subprocess.run(
        [sys.executable, "-m", "recallq.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_wait_status_and_results(api_url: str, tmp_path: Path) -> None:
    data = REPO / "examples" / "eval_set.jsonl"
    submitted = recallq("submit", str(data), "--name", "cli", "--wait", api=api_url)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.splitlines()[0]
    final = json.loads(submitted.stdout.split("\n", 1)[1])
    assert final["status"] == "completed" and final["counts"]["succeeded"] == 24

    status = recallq("status", run_id, api=api_url)
    assert json.loads(status.stdout)["id"] == run_id

    out = tmp_path / "results.csv"
    results = recallq("results", run_id, "--format", "csv", "--out", str(out), api=api_url)
    assert results.returncode == 0, results.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 24 and {r["status"] for r in rows} == {"succeeded"}

    retried = recallq("retry", run_id, api=api_url)
    assert json.loads(retried.stdout)["retried_items"] == 0
    cancelled = recallq("cancel", run_id, api=api_url)
    assert json.loads(cancelled.stdout)["status"] == "completed"  # already ended: unchanged


def test_errors_are_reported_without_a_traceback(api_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "ground_truth": "x"}\n')  # no context anywhere
    submitted = recallq("submit", str(bad), api=api_url)
    assert submitted.returncode == 1
    assert "422 no_context" in submitted.stderr and "Traceback" not in submitted.stderr
    missing = recallq("status", "no-such-run", api=api_url)
    assert missing.returncode == 1 and "404 not_found" in missing.stderr


def test_an_unreachable_api_is_one_line(tmp_path: Path) -> None:
    from tests.services import free_port

    nowhere = f"http://127.0.0.1:{free_port()}"
    for args in (("status", "some-run"), ("submit", str(REPO / "examples" / "eval_set.jsonl"))):
        done = recallq(*args, api=nowhere)
        assert done.returncode == 2
        assert f"cannot reach the API at {nowhere}" in done.stderr
        assert "Traceback" not in done.stderr


def test_results_into_a_pipe_closed_early_end_quietly(api_url: str) -> None:
    data = REPO / "examples" / "eval_set.jsonl"
    run_id = recallq("submit", str(data), "--wait", api=api_url).stdout.splitlines()[0]
    env = {**os.environ, "RECALLQ_API_URL": api_url}
    reader = subprocess.Popen(
        f"{sys.executable} -m recallq.cli results {run_id} --format csv | head -c 10",
        shell=True,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = reader.communicate(timeout=120)
    assert out == "id,index,s"
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_submit_with_a_context_extractor_names_the_run_after_the_file(api_url: str) -> None:
    agent_run = REPO / "examples" / "agent_run.jsonl"
    extractor = '{"type": "tool_results"}'
    done = recallq(
        "submit", str(agent_run), "--context-extractor", extractor, "--wait", api=api_url
    )
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout.split("\n", 1)[1])
    assert final["counts"]["succeeded"] == 4 and final["name"] == "agent_run.jsonl"
