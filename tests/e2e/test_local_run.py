"""`recallq run` as a newcomer runs it: a subprocess, SQLite, the in-process worker."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from pathlib import Path

from tests.integration.test_pipeline import ITEMS
from tests.launcher import run_recallq
from tests.services import REPO, free_port, write_models_file


def recallq_run(args: list[str], cwd: Path, env: dict[str, str] | None = None):
    env = {k: v for k, v in (env or os.environ).items() if not k.startswith("RECALLQ_")} | {
        k: v for k, v in (env or {}).items() if k.startswith("RECALLQ_")
    }
    return run_recallq(["run", *args], cwd=cwd, env=env, timeout=300)


def test_example_runs_offline_with_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    done = recallq_run([str(REPO / "examples" / "eval_set.jsonl"), "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "recallq summary" in done.stdout
    assert "score distribution" in done.stdout
    assert (tmp_path / "recallq.db").exists()  # the default SQLite file, in the working dir
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 24
    assert all(r["status"] == "succeeded" for r in results)
    by_id = {r["id"]: r for r in results}
    assert "no ground truth" in by_id["api-refund-window-null-gt"]["reason"]
    assert by_id["medical-amoxicillin-no-context"]["score"] == 0
    assert all(c["verdict"] == "no" for c in by_id["medical-amoxicillin-no-context"]["claims"])
    assert any(0 < r["score"] < 1 for r in results)
    # the example's item without passages is counted apart, not taken for a retrieval miss
    assert "no_context         1 item scored 0: no context was retrieved" in done.stdout
    gated = recallq_run(
        [str(REPO / "examples" / "eval_set.jsonl"), "--max-no-context", "0"], tmp_path
    )
    assert gated.returncode == 1
    assert "1 item was scored without any context, more than --max-no-context 0" in gated.stderr


def test_same_scenarios_through_the_stub_on_sqlite(tmp_path: Path, clean_stub) -> None:
    data = tmp_path / "items.jsonl"
    items = [dict(item) for item in ITEMS[:4]]
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    env = {
        **os.environ,
        "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, clean_stub.base_url)),
        "STUB_API_KEY": "sk-stub-secret",
    }
    out = tmp_path / "out.jsonl"
    done = recallq_run([str(data), "--model", "stub-judge", "--out", str(out)], tmp_path, env)
    assert done.returncode == 0, done.stderr
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert results["full"]["score"] == 1.0
    assert results["partial"]["score"] == 0.67
    assert [c["verdict"] for c in results["partial"]["claims"]] == ["yes", "no", "yes"]
    assert results["no-ground-truth"]["score"] == 0 and results["no-ground-truth"]["claims"] == []
    assert "no context was retrieved" in results["no-context"]["reason"]
    calls = Counter(c["schema"] for c in clean_stub.calls())
    # the three ground truths are extracted in one packed call, then one attribution each
    # (none for the item without context)
    assert calls == Counter({"claim_extraction_packed": 1, "claim_attribution": 2})
    assert "llm_calls          3" in done.stdout


def test_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"id": "a", "ground_truth": "x", "context": ["x"]}\n{not json\n')
    done = recallq_run([str(data)], tmp_path)
    assert done.returncode == 2
    assert "line 2: invalid JSON" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_key_missing_from_the_environment_stops_before_any_item(
    tmp_path: Path, clean_stub
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STUB_API_KEY"} | {
        "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, clean_stub.base_url)),
    }
    example = str(REPO / "examples" / "eval_set.jsonl")
    done = recallq_run([example, "--model", "stub-judge"], tmp_path, env)
    assert done.returncode == 2
    assert "STUB_API_KEY" in done.stderr and "not set" in done.stderr
    assert "Traceback" not in done.stderr
    assert clean_stub.calls() == []
    assert not (tmp_path / "local.db").exists()  # nothing was started


def test_an_unknown_model_names_the_known_ones(tmp_path: Path) -> None:
    done = recallq_run([str(REPO / "examples" / "eval_set.jsonl"), "--model", "nope"], tmp_path)
    assert done.returncode == 2
    assert "unknown model 'nope'" in done.stderr and "local/lexical" in done.stderr


def test_csv_out_and_a_histogram_in_the_runs_scale(tmp_path: Path) -> None:
    out = tmp_path / "results.csv"
    example = str(REPO / "examples" / "eval_set.jsonl")
    done = recallq_run([example, "--scale", "10", "--out", str(out), "--quiet"], tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 24 and max(float(r["score"]) for r in rows) == 10
    assert "  8-10]" in done.stdout and "(x scale)" not in done.stdout


def test_the_agent_example_runs_with_a_context_extractor(tmp_path: Path) -> None:
    agent_run = str(REPO / "examples" / "agent_run.jsonl")
    without = recallq_run([agent_run, "--quiet"], tmp_path)
    assert without.returncode == 2 and "no item has a context" in without.stderr
    assert "(its fields: id, input, output, ground_truth)" in without.stderr
    assert "--context-extractor for agent-shaped items" in without.stderr
    extractor = '{"type": "tool_results"}'
    done = recallq_run([agent_run, "--context-extractor", extractor, "--quiet"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "succeeded          4" in done.stdout


def test_an_empty_file_and_a_csv_of_unknown_columns_are_one_line_naming_the_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "odd.csv").write_text("q,gold,passages\nhi,Paris is in France,Paris\n")
    empty = recallq_run(["empty.jsonl"], tmp_path)
    assert (empty.returncode, empty.stderr) == (
        2,
        "recallq: empty.jsonl: the file holds no items\n",
    )
    odd = recallq_run(["odd.csv"], tmp_path)
    assert odd.returncode == 2 and odd.stderr.count("\n") == 1
    assert "'q', 'gold' and 'passages'" in odd.stderr and "--map q=ground_truth" in odd.stderr
    mapped = recallq_run(
        ["odd.csv", "--map", "gold=ground_truth", "--map", "passages=context"], tmp_path
    )
    assert mapped.returncode == 0, mapped.stderr


def test_a_judge_nothing_listens_for_says_so_and_gives_up_at_the_retry_deadline(
    tmp_path: Path,
) -> None:
    """A typo in api_base is a refused connection, which litellm reports as a 500: the run
    says "connection refused" and, with --retry-deadline, ends instead of waiting 6 hours."""
    nothing_there = f"http://127.0.0.1:{free_port()}/v1"
    env = {
        **os.environ,
        "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, nothing_there)),
        "STUB_API_KEY": "sk-anything",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS[:2]))
    done = recallq_run(
        [str(data), "--model", "stub-judge", "--retry-deadline", "3", "--quiet"], tmp_path, env
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 x gave up after the run's retry deadline (3 s) passed: connection refused" in (
        done.stdout
    )
    assert "provider unavailable (500)" not in done.stdout + done.stderr
    refused = recallq_run([str(data), "--retry-deadline", "0", "--fresh"], tmp_path, env)
    assert refused.returncode == 2 and "retry_deadline_s must be more than 0" in refused.stderr
