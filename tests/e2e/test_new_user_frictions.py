"""A new user's frictions (issue 28, item 7), the CLI-level half: `recallq` as a newcomer types
it, six commands in all (each test fails on the code before the fix). The in-process half is
tests/unit/test_frictions.py."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.launcher import run_recallq

ITEMS = [
    {"id": "a", "ground_truth": "Paris is in France.", "context": ["Paris is in France."],
     "category": "geo"},
    {"id": "b", "ground_truth": "Two plus two is four.", "context": ["Unrelated text."],
     "category": "math"},
    {"id": "c", "ground_truth": "The Seine is a river. Lyon is old.",
     "context": ["The Seine is a river."], "category": "geo"},
]  # fmt: skip
#: DeepEval's shape: `context` is its ideal context, `retrieval_context` what was retrieved.
DEEPEVAL = {
    "input": "q",
    "actual_output": "a",
    "expected_output": "Paris is the capital of France.",
    "context": ["ideal"],
    "retrieval_context": ["Paris is the capital of France."],
}


def _recallq(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    return run_recallq(args, cwd=cwd, env=clean | env, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("frictions")
    (cwd / "data.jsonl").write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (cwd / "deepeval.jsonl").write_text(json.dumps(DEEPEVAL) + "\n")
    return cwd


@pytest.fixture(scope="module")
def scored(folder: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """`recallq run --by category`, with a service's API URL exported, and the run's id."""
    done = _recallq(
        folder, "run", "data.jsonl", "--by", "category", "--quiet",
        RECALLQ_API_URL="http://127.0.0.1:9",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run_id,) = re.findall(r"^  run\s+(\S+)$", done.stdout, re.M)
    return done, str(run_id)


def test_a_local_run_says_where_it_goes_and_its_by_table_reads_alike(
    scored: tuple[subprocess.CompletedProcess[str], str],
) -> None:
    """Frictions: with a service's variables exported, `recallq run` stored where neither
    `recallq runs` nor the pages look, without a word; the `--by` table mixed number formats
    (0, 1, 0.6879)."""
    done, _ = scored
    assert "this run is local" in done.stderr and "recallq runs --local" in done.stderr
    table = done.stdout.split("\nby category\n", 1)[1].split("\n\n", 1)[0].splitlines()
    head = ["category", "items", "scored", "failed", "mean_score", "context_precision"]
    assert table[0].split() == head
    # every figure of the table in one format: the mean, and the precision with its interval
    figures = [figure.strip("[],") for row in table[1:] for figure in row.split()[4:]]
    assert figures and all(re.fullmatch(r"\d\.\d{4}", figure) for figure in figures), table


def test_by_a_field_no_item_has_is_an_error_before_anything_is_scored(folder: Path) -> None:
    """Friction: `--by` a field no item has exited 0 (after scoring the whole run)."""
    done = _recallq(folder, "run", "data.jsonl", "--by", "categry", "--quiet")
    assert done.returncode == 2
    assert "no item has the metadata field 'categry'" in done.stderr
    assert "category" in done.stderr and "nothing was scored" in done.stderr
    assert done.stdout == ""


def test_estimate_takes_map_and_names_the_file_once(folder: Path) -> None:
    """Frictions: `recallq estimate` had no `--map`, though its own DeepEval hint says to pass
    it, and the hint repeated the file name ("deepeval.jsonl: deepeval.jsonl line 1")."""
    refused = _recallq(folder, "estimate", "deepeval.jsonl")
    assert refused.returncode == 2
    assert refused.stderr.count("deepeval.jsonl") == 1, refused.stderr
    assert "--map context=metadata.ideal_context" in refused.stderr
    mapped = _recallq(
        folder, "estimate", "deepeval.jsonl", "--map", "context=metadata.ideal_context"
    )
    assert mapped.returncode == 0, mapped.stderr
    assert re.search(r"^  items\s+1$", mapped.stdout, re.M)


def test_a_run_ids_start_names_it_and_the_label_sheet_says_how_to_label_blind(
    folder: Path, scored: tuple[subprocess.CompletedProcess[str], str]
) -> None:
    """Frictions: a run id's unique prefix was refused; the labelling CSV shows the judge's
    verdict beside the empty human column (kept: the contract's columns; the command says
    how to label without seeing it)."""
    _, run_id = scored
    sheet = folder / "to_label.csv"
    done = _recallq(folder, "label", run_id[:8], "--sample", "2", "--out", str(sheet))
    assert done.returncode == 0, done.stderr
    assert f"recallq label {run_id} --import" in done.stdout
    assert "hide those columns" in done.stdout and f"/runs/{run_id}/label" in done.stdout
    with sheet.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(row["judge_verdict"] in ("yes", "no") for row in rows)
    assert all(row["human_verdict"] == "" for row in rows)


def test_cancel_heads_its_summary_with_its_own_name(
    folder: Path, scored: tuple[subprocess.CompletedProcess[str], str]
) -> None:
    """Frictions: `cancel` printed its summary under the header `recallq status` (and a run
    id's unique start was refused)."""
    _, run_id = scored
    done = _recallq(folder, "cancel", run_id[:8])
    assert done.returncode == 0, done.stderr
    assert f"run {run_id} had already ended (completed)" in done.stderr
    assert done.stdout.startswith("recallq cancel\n") and "recallq status" not in done.stdout
