"""Context precision in local mode: `recallq run --precision` (the offline judge, SQLite,
in-process runner), `--min-precision` gates, the passages CSV, and `recallq.evaluate` with its
`passages_to_pandas()`. `cited` and `judged` agree for the offline judge (a passage is
relevant when it supports a claim of the ground truth, the rule attribution uses)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest

import recallq
from tests.launcher import run_recallq

R1 = "Marie Curie discovered polonium in 1898."
R2 = "Marie Curie discovered radium with Pierre."
J1 = "Lighthouses guide ships along rocky coasts."
TRUTH = "Marie Curie discovered polonium. Marie Curie discovered radium."
ITEMS: list[dict[str, Any]] = [
    {"id": "first", "reference": TRUTH, "contexts": [R1, R2, J1], "topic": "a"},
    {"id": "last", "reference": TRUTH, "contexts": [J1, J1, R2], "topic": "b"},
    {"id": "absent", "reference": TRUTH, "contexts": [J1], "topic": "b"},
    {"id": "empty", "reference": TRUTH, "contexts": [], "topic": "a"},
]
EXPECTED = {"first": 1.0, "last": 0.3333, "absent": 0.0, "empty": None}


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    return {**env, "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}"}


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    return path


@pytest.mark.parametrize("mode", ["cited", "judged"])
def test_recallq_run_precision_and_its_gate(tmp_path: Path, mode: str) -> None:
    path, env = _write(tmp_path), _env(tmp_path)
    out = tmp_path / "out.passages.csv"
    args = ["run", str(path), "--quiet", "--precision", mode, "--out", str(out)]
    done = run_recallq([*args, "--min-precision", "0.5", "--by", "topic"], env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # mean (1 + 1/3 + 0) / 3 = 0.4444 < 0.5
    assert "mean context precision 0.4444 is below --min-precision 0.5" in done.stderr
    assert f"context_precision  0.4444 [0, 0.9149] ({mode}, 3 items)" in done.stdout
    assert "first_relevant     1: 1, 3: 1, none: 1" in done.stdout
    rows = list(csv.DictReader(out.open()))
    assert [(r["id"], r["passage_index"], r["relevant"]) for r in rows] == [
        ("first", "0", "True"),
        ("first", "1", "True"),
        ("first", "2", "False"),
        ("last", "0", "False"),
        ("last", "1", "False"),
        ("last", "2", "True"),
        ("absent", "0", "False"),
    ]
    again = run_recallq([*args, "--min-precision", "0.4"], env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # the same run, found again
    assert "mean context precision 0.4444 >= --min-precision 0.4" in again.stdout


def test_a_bad_precision_is_one_line(tmp_path: Path) -> None:
    done = run_recallq(
        ["run", str(_write(tmp_path)), "--precision", "ranked"], env=_env(tmp_path), cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr == 'recallq: precision must be "cited", "judged" or "off"\n'


def test_evaluate_precision_judged_and_passages_frame(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    def scored() -> float:
        value = REGISTRY.get_sample_value("recallq_precision_items_total", {"mode": "judged"})
        return value or 0.0

    before = scored()
    database = f"sqlite:///{tmp_path / 'evaluate.db'}"
    result = recallq.evaluate(ITEMS, database_url=database, progress=False, precision="judged")
    assert scored() - before == 3  # items scored by precision mode (Prometheus)
    found = {item["id"]: item["context_precision"] for item in result.items}
    assert found == EXPECTED
    assert result.summary["mean_context_precision"] == 0.4444
    assert result.usage["by_stage"]["relevance"]["llm_calls"] == 0  # the offline judge
    frame = result.passages_to_pandas()
    assert list(frame.columns) == ["id", "index", "passage_index", "relevant", "claims", "reason"]
    assert frame[frame["id"] == "last"]["relevant"].tolist() == [False, False, True]
    assert frame["reason"].iloc[0].startswith("supports claim(s) 0")
    assert "context_precision" in result.to_pandas().columns
    groups = result.summary_by("topic")
    assert groups["a"]["mean_context_precision"] == 1.0
    with pytest.raises(ValueError, match='precision must be "cited", "judged" or "off"'):
        recallq.evaluate(ITEMS, database_url=database, progress=False, precision="ranked")
