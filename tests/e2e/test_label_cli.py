"""`recallq label`, `recallq agreement` and `recallq gate --corrected` on a local run (SQLite,
subprocesses, the offline judge), as the docs walk through them on examples/eval_set.jsonl."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.launcher import run_recallq
from tests.services import REPO

COLUMNS = [
    "item_id",
    "claim_index",
    "claim",
    "context",
    "judge_verdict",
    "judge_reason",
    "human_verdict",
    "note",
]


def _recallq(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    return run_recallq(args, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cwd = tmp_path_factory.mktemp("labels")
    done = _recallq(cwd, "run", str(REPO / "examples" / "eval_set.jsonl"), "--quiet")
    assert done.returncode == 0, done.stderr
    runs = _recallq(cwd, "runs", "--json")
    assert runs.returncode == 0, runs.stderr
    (run,) = json.loads(runs.stdout)
    return cwd, str(run["id"])


def test_sample_fill_in_import_agreement_and_corrected_gate(local_run: tuple[Path, str]) -> None:
    cwd, run = local_run
    sheet = cwd / "to_label.csv"
    drawn = _recallq(cwd, "label", run, "--sample", "8", "--seed", "4", "--out", str(sheet))
    assert drawn.returncode == 0, drawn.stderr
    assert "8 items" in drawn.stdout
    with sheet.open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    assert len({r["item_id"] for r in rows}) == 8
    assert f"({len(rows)} claims)" in drawn.stdout
    assert all(r["human_verdict"] == "" and r["note"] == "" for r in rows)

    # the person rejects every claim the judge accepted in the first item, agrees elsewhere,
    # and leaves the last row empty
    first = rows[0]["item_id"]
    for row in rows[:-1]:
        overturned = row["item_id"] == first and row["judge_verdict"] == "yes"
        row["human_verdict"] = "no" if overturned else row["judge_verdict"]
    with sheet.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    imported = _recallq(cwd, "label", run, "--import", str(sheet))
    assert imported.returncode == 0, imported.stderr
    assert f"{len(rows) - 1} labels stored, 1 row left empty, 0 rows" in imported.stdout

    shown = _recallq(cwd, "agreement", run)
    assert shown.returncode == 0, shown.stderr
    assert f"{len(rows) - 1} claims of 8 items compared" in shown.stdout
    assert "corrected" in shown.stdout
    body = json.loads(_recallq(cwd, "agreement", run, "--json").stdout)
    overturned = sum(r["item_id"] == first and r["judge_verdict"] == "yes" for r in rows[:-1])
    assert body["confusion"]["judge_yes_human_no"] == overturned
    assert body["confusion"]["judge_no_human_yes"] == 0
    corrected = body["corrected"]
    assert corrected["mean_score"] <= corrected["judge_mean_score"]
    low = corrected["mean_score_ci95"][0]

    report = cwd / "report.html"
    written = _recallq(cwd, "report", run, "--out", str(report))
    assert written.returncode == 0, written.stderr
    html = report.read_text()
    assert 'data-testid="agreement"' in html and 'data-testid="corrected-interval"' in html
    assert f"{len(rows) - 1} claims of 8 items" in html

    passes = _recallq(cwd, "gate", run, "--min-score", str(max(0.0, low - 0.01)), "--corrected")
    assert passes.returncode == 0, passes.stderr
    assert "corrected mean score" in passes.stdout
    fails = _recallq(cwd, "gate", run, "--min-score", str(low + 0.01), "--corrected")
    assert fails.returncode == 1 and "95% lower bound" in fails.stderr
    # without --corrected the gate is the judge's, as before
    plain = _recallq(cwd, "gate", run, "--min-score", str(low + 0.01))
    assert "corrected" not in plain.stderr + plain.stdout


def test_bad_label_commands_are_one_line_exit_2(local_run: tuple[Path, str]) -> None:
    cwd, run = local_run
    for args in (
        ("label", run, "--sample", "5"),  # no --out
        ("label", "no-such-run", "--sample", "5", "--out", "x.csv"),
        ("label", run, "--import", "missing.csv"),
        ("label", run, "--sample", "0", "--out", "x.csv"),
        ("agreement", "no-such-run"),
    ):
        done = _recallq(cwd, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        # one line that says why (argparse's own errors come after its usage lines)
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("recallq")

    assert not (cwd / "x.csv").exists()  # a failed draw leaves no file behind

    bad = cwd / "bad.csv"
    bad.write_text("item_id,claim_index,human_verdict\nnope,0,yes\n")
    done = _recallq(cwd, "label", run, "--import", str(bad))
    assert done.returncode == 1 and "bad.csv:2: no item 'nope'" in done.stderr

    # issue 28: a quote never closed swallowed the rows below it, without a word
    broken = cwd / "broken.csv"
    broken.write_text(
        "item_id,claim_index,human_verdict,note\n"
        'hr-expense-meals,0,yes,"oops\n'
        "hr-expense-meals,1,no,\n"
        "hr-expense-mileage,0,yes,\n"
    )
    done = _recallq(cwd, "label", run, "--import", str(broken))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"recallq: {broken}:2: not CSV: a quote opened on this line is never closed"
    ]
    assert "2 labels stored, 0 rows left empty, 1 row with problems" in done.stdout
    unrelated = cwd / "unrelated.csv"
    unrelated.write_text("a,b\n1,2\n")  # columns that match nothing: was "skipped 1"
    done = _recallq(cwd, "label", run, "--import", str(unrelated))
    assert done.returncode == 2 and "line 1: a CSV labels file starts with a header" in done.stderr


def test_an_unwritable_out_is_one_line_and_keeps_the_drawn_sample(
    local_run: tuple[Path, str],
) -> None:
    cwd, run = local_run
    kept = cwd / "kept.csv"
    first = _recallq(cwd, "label", run, "--sample", "3", "--seed", "1", "--out", str(kept))
    assert first.returncode == 0, first.stderr
    for out in (cwd / "missing" / "x.csv", cwd):  # no such folder; a folder
        done = _recallq(cwd, "label", run, "--sample", "5", "--seed", "9", "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"recallq: cannot write {out}: "
            + ("No such file or directory" if out != cwd else "Is a directory")
        ]
    with sqlite3.connect(cwd / "recallq.db") as db:
        seeds = db.execute("SELECT seed FROM label_samples WHERE run_id = ?", (run,)).fetchall()
    assert seeds == [(1,)]  # the failed draws replaced nothing
