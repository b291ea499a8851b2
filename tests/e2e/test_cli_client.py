"""The client commands (submit, status, results, runs, compare, gate, cancel, retry) and
`recallq.Client` against a running API and worker."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.launcher import run_recallq
from tests.services import REPO, start_api, start_worker


@pytest.fixture(scope="module")
def api_url(service_env: dict[str, str]) -> Iterator[str]:
    worker = start_worker(service_env, concurrency=4)
    api, url = start_api(service_env)
    yield url
    api.stop()
    worker.stop()


def recallq(*args: str, api: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    env["RECALLQ_API_URL"] = api
    return run_recallq(args, env=env, cwd=REPO)


def test_submit_wait_status_and_results(api_url: str, tmp_path: Path) -> None:
    data = REPO / "examples" / "eval_set.jsonl"
    submitted = recallq("submit", str(data), "--name", "cli", "--wait", "--json", api=api_url)
    assert submitted.returncode == 0, submitted.stderr
    final = json.loads(submitted.stdout)  # stdout is the run object alone
    run_id = final["id"]
    assert f"recallq: run {run_id}" in submitted.stderr
    assert final["status"] == "completed" and final["counts"]["succeeded"] == 24

    status = recallq("status", run_id, "--json", api=api_url)
    assert json.loads(status.stdout)["id"] == run_id
    readable = recallq("status", run_id, api=api_url)
    assert "no_ground_truth    1 item scored 0" in readable.stdout
    assert "score distribution" in readable.stdout

    out = tmp_path / "results.csv"
    results = recallq("results", run_id, "--format", "csv", "--out", str(out), api=api_url)
    assert results.returncode == 0, results.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 24 and {r["status"] for r in rows} == {"succeeded"}

    retried = recallq("retry", run_id, api=api_url)
    assert f"retry run {run_id}: 0 failed items queued again" in retried.stderr
    assert "status             completed" in retried.stdout  # the summary, as status prints
    resumed = recallq("resume", run_id, api=api_url)
    assert resumed.returncode == 2 and f"run {run_id} is completed: only a cancelled run" in (
        resumed.stderr
    )
    cancelled = recallq("cancel", run_id, api=api_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"run {run_id} had already ended (completed): nothing to cancel" in cancelled.stderr
    assert "status             completed" in cancelled.stdout  # the summary, as status prints
    assert json.loads(recallq("cancel", run_id, "--json", api=api_url).stdout)["status"] == (
        "completed"
    )


def test_submit_wait_prints_the_summary_status_prints(api_url: str) -> None:
    data = REPO / "examples" / "eval_set.jsonl"
    waited = recallq("submit", str(data), "--wait", "--quiet", api=api_url)
    assert waited.returncode == 0, waited.stderr
    run_id = waited.stderr.split("recallq: run ")[1].split()[0]
    status = recallq("status", run_id, api=api_url)
    assert waited.stdout == status.stdout
    assert not waited.stdout.lstrip().startswith("{") and len(waited.stdout.splitlines()) < 40


def test_a_run_whose_every_item_failed_says_so_first(api_url: str, tmp_path: Path) -> None:
    data = tmp_path / "all-bad.jsonl"
    bad = [
        {"id": f"bad{n}", "ground_truth": "STUB_HTTP_400 here.", "context": ["x"]} for n in range(3)
    ]
    data.write_text("".join(json.dumps(item) + "\n" for item in bad))
    done = recallq("submit", str(data), "--model", "stub-judge", "--wait", "--quiet", api=api_url)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1].startswith("  every item failed (3 of 3): "), done.stdout


def test_errors_are_reported_without_a_traceback(api_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "ground_truth": "x"}\n')  # no context anywhere
    submitted = recallq("submit", str(bad), api=api_url)
    assert submitted.returncode == 2
    assert "422 no_context" in submitted.stderr and "Traceback" not in submitted.stderr
    assert "(its fields: id, ground_truth)" in submitted.stderr
    assert "--map context=FIELD" in submitted.stderr
    missing = recallq("status", "no-such-run", api=api_url)
    assert missing.returncode == 2 and "404 not_found" in missing.stderr
    nothing = recallq("submit", str(tmp_path / "nothing.jsonl"), api=api_url)
    assert nothing.returncode == 2
    assert nothing.stderr == f"recallq: no such file: {tmp_path / 'nothing.jsonl'}\n"
    typo = tmp_path / "typo.jsonl"
    typo.write_text('{"id": "a", "refrence": "x", "context": ["x"]}\n')
    hinted = recallq("submit", str(typo), api=api_url)
    assert hinted.returncode == 2 and "did you mean 'reference'?" in hinted.stderr
    assert f"{typo} line 1: item 0 (a)" in hinted.stderr  # read here, named by file and line


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
    run_id = json.loads(recallq("submit", str(data), "--wait", "--json", api=api_url).stdout)["id"]
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
        "submit", str(agent_run), "--context-extractor", extractor, "--wait", "--json", api=api_url
    )
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["counts"]["succeeded"] == 4 and final["name"] == "agent_run.jsonl"


# --- issue 12: tools' files, gates, runs, compare, the Python client ---------------------------

DATA = REPO / "tests" / "data"


def test_tool_shaped_files_through_the_service(api_url: str, tmp_path: Path) -> None:
    for name in ("ragas.jsonl", "deepeval.json", "contexts.csv"):
        done = recallq("submit", str(DATA / name), "--wait", "--json", "--quiet", api=api_url)
        assert done.returncode == 0, done.stderr
        run = json.loads(done.stdout)
        assert run["status"] == "completed" and run["counts"]["failed"] == 0, name
    out = tmp_path / "contexts.jsonl"
    assert recallq("results", run["id"], "--out", str(out), api=api_url).returncode == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first["metadata"] == {"topic": "warranty"} and first["input"] == (
        "How long is the warranty?"
    )


def test_submit_wait_and_gate_exit_codes(api_url: str, tmp_path: Path) -> None:
    items = [
        {"id": "ok", "ground_truth": "Oslo is in Norway.", "context": ["Oslo is in Norway."]},
        {
            "id": "half",
            "ground_truth": "Lima is in Peru. Quito is in Chile.",
            "context": ["Lima is in Peru."],
        },
        {"id": "bad", "ground_truth": "STUB_HTTP_400 here.", "context": ["x"]},
    ]
    data = tmp_path / "gates.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    failed = recallq("submit", str(data), "--model", "stub-judge", "--wait", "--json", api=api_url)
    assert failed.returncode == 1, failed.stderr
    assert "recallq: 1 item failed (allow some with --max-failed N)" in failed.stderr
    run_id = json.loads(failed.stdout)["id"]

    assert recallq("gate", run_id, "--max-failed", "1", api=api_url).returncode == 0
    below = recallq("gate", run_id, "--min-score", "0.8", "--max-failed", "1", api=api_url)
    assert below.returncode == 1
    assert "gate failed: mean score 0.75 is below --min-score 0.8" in below.stderr
    tolerated = recallq(
        "submit",
        str(data),
        "--model",
        "stub-judge",
        "--wait",
        "--max-failed",
        "1",
        "--min-score",
        "0.7",
        "--quiet",
        api=api_url,
    )
    assert tolerated.returncode == 0, tolerated.stderr
    assert "gate passed: mean score 0.75 >= --min-score 0.7" in tolerated.stderr
    unknown = recallq("gate", "no-such-run", "--min-score", "0.1", api=api_url)
    assert unknown.returncode == 2 and "404 not_found" in unknown.stderr


def test_runs_and_compare_through_the_api(api_url: str, tmp_path: Path) -> None:
    base, candidate = [], []
    for n in range(20):
        truth = f"Bridge {n} spans {n + 40} metres. Bridge {n} opened in {1900 + n}."
        first, second = truth.split(". ")
        base.append({"id": f"b{n}", "ground_truth": truth, "context": [first + "."]})
        found = [first + ".", second] if n % 2 == 0 else [first + "."]
        candidate.append({"id": f"b{n}", "ground_truth": truth, "context": found})
    ids = []
    for name, items in (("bridges-a", base), ("bridges-b", candidate)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(item) + "\n" for item in items))
        done = recallq(
            "submit", str(path), "--name", name, "--wait", "--json", "--quiet", api=api_url
        )
        ids.append(json.loads(done.stdout)["id"])
    listed = recallq("runs", "--name", "bridges-b", "--json", api=api_url)
    assert [run["id"] for run in json.loads(listed.stdout)] == [ids[1]]
    table = recallq("runs", "--limit", "2", api=api_url).stdout.splitlines()
    assert ids[1] in table[1] and ids[0] in table[2]
    # an API URL as copied from the routes, ending in /v1, works too
    compared = recallq("compare", *ids, "--json", api=f"{api_url}/v1/")
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    assert result["mean_difference"] == 0.25 and result["ci95"][0] <= 0.25 <= result["ci95"][1]
    text = recallq("compare", *ids, api=api_url).stdout
    assert "10 improved, 0 regressed, 10 unchanged" in text and "largest changes" in text


def test_python_client(api_url: str) -> None:
    import recallq

    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        {
            "question": [f"q{n}" for n in range(7)],
            "reference": [f"Fact {n} is true." for n in range(7)],
            "retrieved_contexts": [[f"Fact {n} is true."] if n % 2 else [] for n in range(7)],
            "team": ["a", "b", "a", "b", "a", "b", "a"],
        }
    )
    with recallq.Client(api_url + "/") as client:
        run = client.submit(frame, name="from-a-frame")
        view = run.wait(progress=False)
        assert view["status"] == "completed" and view["counts"]["succeeded"] == 7
        assert [item["id"] for item in run.items(page_size=3)] == [str(n) for n in range(7)]
        scored = run.items(status="succeeded", item_data=False)
        assert len(scored) == len(list(run.iter_items(status="succeeded", item_data=False)))
        assert len(scored) == 7 and "metadata" not in scored[0]
        table = run.to_pandas()
        assert list(table["score"]) == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
        assert table.loc[1, "metadata"] == {"team": "b"} and table.loc[1, "input"] == "q1"
        claims = run.claims_to_pandas()
        assert len(claims) == 7 and set(claims["verdict"]) == {"yes", "no"}
        assert run.id in [r.id for r in client.runs(name="from-a-frame")]
        same = client.compare(run, run.id)
        assert same["mean_difference"] == 0 and same["unchanged"] == 7
        with pytest.raises(recallq.ApiError) as missing:
            client.run("no-such-run")
        assert missing.value.status == 404 and missing.value.code == "not_found"


def test_a_bad_item_read_mid_upload_stores_nothing(api_url: str) -> None:
    """The client reads and streams in one pass: the first bad item stops the upload, and the
    API, which stores a run in one transaction, keeps nothing of it."""
    import recallq
    from recallq.runs.dataset import DatasetError

    items: list[dict[str, Any]] = [
        {"id": f"i{n}", "ground_truth": "g", "context": ["c"]} for n in range(1500)
    ]
    items[1200]["context"] = [{"url": "https://example.com"}]
    with recallq.Client(api_url) as client:
        with pytest.raises(DatasetError, match=r"item 1200 \(i1200\): context passage 0"):
            client.submit(items, name="cut-short")
        assert client.runs(name="cut-short") == []
        assert client.get("/healthz") == {"status": "ok"}


def test_by_a_field_no_item_has_is_a_404_naming_the_fields(api_url: str, tmp_path: Path) -> None:
    import httpx

    data = tmp_path / "topics.jsonl"
    items = [
        {
            "id": f"t{n}",
            "ground_truth": "Snow is white.",
            "context": ["Snow is white."],
            "metadata": {"topic": "weather"},
        }
        for n in range(2)
    ]
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    run_id = json.loads(recallq("submit", str(data), "--wait", "--json", api=api_url).stdout)["id"]
    response = httpx.get(f"{api_url}/v1/runs/{run_id}", params={"by": "topc"})
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "unknown_field"
    assert error["message"] == "no item has the metadata field 'topc'; the items' fields: topic"
    assert httpx.get(f"{api_url}/v1/runs/{run_id}", params={"by": "topic"}).status_code == 200
    page = httpx.get(f"{api_url}/runs/{run_id}", params={"by": "topc"})
    assert page.status_code == 200 and "the items&#39; fields: topic" in page.text
