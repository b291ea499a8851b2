"""The Python API: `recallq.evaluate` in-process on lists, frames and files; `Result`; what
`import recallq` loads; and the bearer key `recallq.Client` sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import recallq
from recallq.runs.ingest import SubmissionError
from tests.launcher import run_recallq
from tests.services import REPO

DATA = REPO / "tests" / "data"
HEAVY = ("litellm", "celery", "kombu", "fastapi", "starlette", "uvicorn", "openai")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}


def test_import_and_a_local_evaluation_load_no_server_broker_or_llm_library(
    tmp_path: Path,
) -> None:
    script = f"""
import sys
import recallq
assert recallq.__version__
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
assert not loaded, ("import", loaded)
result = recallq.evaluate(
    [{{"question": "q", "reference": "Snow is white.", "contexts": ["Snow is white."]}}],
    progress=False,
)
assert result.summary["mean_score"] == 1.0, result.summary
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
assert not loaded, ("evaluate", loaded)
print("ok", result.run_id)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
    # stored where `recallq run` stores runs, so the CLI sees them
    run_id = done.stdout.split()[1]
    listed = run_recallq(["runs", "--json"], cwd=tmp_path, env=_clean_env(), timeout=60)
    assert [run["id"] for run in json.loads(listed.stdout)] == [run_id]


@pytest.fixture
def database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'evaluations.db'}"


def test_evaluate_a_ragas_file(database: str) -> None:
    result = recallq.evaluate(DATA / "ragas.jsonl", progress=False, database_url=database)
    assert result.counts == {
        "total": 2,
        "pending": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 0,
        "cancelled": 0,
    }
    assert result.run["name"] == "ragas.jsonl" and len(result) == 2
    first = result.items[0]
    assert first["input"] == "When did the first Super Bowl take place?"
    assert first["claims"] and first["context"]
    assert result.items[1]["metadata"] == {
        "reference_contexts": [
            "Pride and Prejudice is an 1813 novel of manners written by Jane Austen."
        ]
    }
    assert "mean_score=" in repr(result)


def test_a_dataframe_in_and_out(database: str) -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        {
            "user_input": ["a", "b", "c", "d"],
            "reference": [
                "Copper conducts heat. Copper is red.",
                "Gold is soft.",
                None,
                "Iron rusts.",
            ],
            "retrieved_contexts": [["Copper conducts heat."], ["Gold is soft."], ["x"], []],
            "category": ["metal", "metal", "misc", None],
        }
    )
    result = recallq.evaluate(frame, database_url=database, progress=False)
    table = result.to_pandas()
    assert list(table.columns) == [
        "id",
        "index",
        "status",
        "score",
        "claims_total",
        "claims_attributed",
        "attempts",
        "reason",
        "error",
        "context_precision",
        "first_relevant_rank",
        "id_precision",
        "id_recall",
        "input",
        "output",
        "ground_truth",
        "context",
        "metadata",
        "metadata.category",
    ]
    assert list(table["score"]) == [0.5, 1.0, 0.0, 0.0]
    assert table.loc[0, "metadata"] == {"category": "metal"} and table.loc[3, "metadata"] is None
    assert result.summary["no_ground_truth"] == 1
    lean = result.to_pandas(item_data=False)
    assert "input" not in lean.columns and len(lean) == 4
    claims = result.claims_to_pandas()
    assert list(claims.columns) == [
        "id",
        "index",
        "claim_index",
        "text",
        "verdict",
        "context_indices",
        "reason",
    ]
    assert list(claims["verdict"]) == ["yes", "no", "yes", "no"]
    # context precision: each metal item's one passage supports a claim; the misc item has no
    # ground truth and the last no context, so neither has one
    none = {"mean_context_precision": None, "context_precision_ci95": None}
    metal = {"mean_context_precision": 1.0, "context_precision_ci95": [1.0, 1.0]}
    assert result.summary_by("category") == {
        "(missing)": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 0.0, **none},
        "metal": {"items": 2, "scored_items": 2, "failed": 0, "mean_score": 0.75, **metal},
        "misc": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 0.0, **none},
    }
    with pytest.raises(ValueError, match="no item has the metadata field 'categroy'") as refused:
        result.summary_by("categroy")
    assert "the items' fields: " in str(refused.value) and "category" in str(refused.value)


def test_a_parquet_file(tmp_path: Path, database: str) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "set.parquet"
    pandas.DataFrame(
        {
            "question": ["q1", "q2"],
            "ground_truth": ["Tea is hot.", "Ice is cold."],
            "contexts": [["Tea is hot."], ["Fire is hot."]],
        }
    ).to_parquet(path)
    result = recallq.evaluate(path, database_url=database, progress=False)
    assert [item["score"] for item in result.items] == [1.0, 0.0]


def test_results_compare_with_a_known_difference(database: str) -> None:
    base, candidate = [], []
    for n in range(30):
        first, second = f"River {n} is {n + 5} km long", f"River {n} flows into sea {n % 4}"
        truth = f"{first}. {second}."
        base.append({"id": f"r{n}", "ground_truth": truth, "context": [first + "."]})
        found = [first + ".", second + "."] if n % 3 == 0 else [first + "."]
        candidate.append({"id": f"r{n}", "ground_truth": truth, "context": found})
    a = recallq.evaluate(base, database_url=database, progress=False)
    b = recallq.evaluate(candidate, database_url=database, progress=False)
    result = b.compare(a)
    assert result["matched"] == 30
    expected = round(10 * 0.5 / 30, 4)
    assert result["mean_difference"] == expected
    assert result["ci95"][0] <= expected <= result["ci95"][1]
    assert result["improved"] == 10 and result["claims_flipped"]["no_to_yes"] == 10


def test_evaluate_again_returns_the_finished_run_as_the_cli_does(
    tmp_path: Path, clean_stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.services import write_models_file

    monkeypatch.setenv("RECALLQ_MODELS_FILE", str(write_models_file(tmp_path, clean_stub.base_url)))
    monkeypatch.setenv("STUB_API_KEY", "sk-stub-secret")
    database = f"sqlite:///{tmp_path / 'cell.db'}"
    items = [
        {"id": f"c{n}", "ground_truth": f"Lake {n} is deep.", "context": ["x"]} for n in range(3)
    ]
    first = recallq.evaluate(items, "stub-judge", database_url=database, progress=False)
    calls = len(clean_stub.calls())
    assert calls > 0
    again = recallq.evaluate(items, "stub-judge", database_url=database, progress=False)
    assert again.run_id == first.run_id and len(clean_stub.calls()) == calls  # no call
    assert again.items == first.items
    other = recallq.evaluate(
        items, "stub-judge", database_url=database, progress=False, name="another"
    )
    assert other.run_id != first.run_id  # other run fields: another run
    fresh = recallq.evaluate(items, "stub-judge", database_url=database, progress=False, fresh=True)
    assert fresh.run_id not in (first.run_id, other.run_id)
    path = tmp_path / "cell.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    of_file = recallq.evaluate(path, "stub-judge", database_url=database, progress=False)
    assert recallq.evaluate(path, "stub-judge", database_url=database, progress=False).run_id == (
        of_file.run_id
    )
    # the CLI finds the run evaluate made of the same file: the same key
    env = {
        **_clean_env(),
        "RECALLQ_DATABASE_URL": database,
        "STUB_API_KEY": "sk-stub-secret",
        "RECALLQ_MODELS_FILE": str(tmp_path / "models.yaml"),
    }
    done = run_recallq(["run", str(path), "--model", "stub-judge"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert f"this file was scored already in run {of_file.run_id}" in done.stderr


def test_bad_input_is_a_value_error_naming_the_item(database: str) -> None:
    # the run service's SubmissionError, with the API's code, as the API answers it
    with pytest.raises(SubmissionError) as caught:
        recallq.evaluate(
            [{"id": "x", "reference": "r", "contexts": [{"url": "u"}]}],
            database_url=database,
            progress=False,
        )
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith("item 0 (x): context passage 0 has no 'text'")
    assert caught.value.code == "invalid_request"
    with pytest.raises(TypeError, match="unknown run field"):
        recallq.evaluate([], database_url=database, temperature=0)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        recallq.evaluate([{"context": ["c"]}], model="nope", database_url=database)


RUN_VIEW = {
    "id": "r1",
    "status": "completed",
    "counts": {"total": 2, "pending": 0, "running": 0, "succeeded": 2, "failed": 0},
    "summary": {"mean_score": 0.9},
}


class _Recorder(BaseHTTPRequestHandler):
    """A server that answers every GET with one run object and records its Authorization."""

    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # the http.server API
        _Recorder.seen.append({"path": self.path, "authorization": self.headers["Authorization"]})
        body = json.dumps(RUN_VIEW).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_client_sends_its_bearer_key(recorder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with recallq.Client(recorder + "/v1", api_key="rq-key-123") as client:
        assert client.run("r1").view["status"] == "completed"
    monkeypatch.setenv("RECALLQ_API_KEY", "rq-from-env")
    with recallq.Client(recorder) as client:
        client.run("r1")
    monkeypatch.delenv("RECALLQ_API_KEY")
    with recallq.Client(recorder) as client:
        client.run("r1")
    assert _Recorder.seen == [
        {"path": "/v1/runs/r1", "authorization": "Bearer rq-key-123"},
        {"path": "/v1/runs/r1", "authorization": "Bearer rq-from-env"},
        {"path": "/v1/runs/r1", "authorization": None},
    ]
    env = {**_clean_env(), "RECALLQ_API_URL": recorder, "RECALLQ_API_KEY": "rq-cli"}
    done = run_recallq(["gate", "r1", "--min-score", "0.5"], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _Recorder.seen[-1] == {"path": "/v1/runs/r1", "authorization": "Bearer rq-cli"}
