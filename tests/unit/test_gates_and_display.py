"""Exit codes and gates (recallq.core.gates), and what the CLI prints about runs
(recallq.viewer.text)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recallq.core import gates
from recallq.core.exits import Exit
from recallq.core.gates import Gate
from recallq.viewer import text as display

VIEW: dict[str, Any] = {
    "id": "run-1",
    "name": "nightly",
    "status": "completed",
    "model": "local/lexical",
    "scale": 1.0,
    "created_at": "2026-12-01T09:30:00+00:00",
    "counts": {
        "total": 10,
        "pending": 0,
        "running": 0,
        "succeeded": 8,
        "failed": 2,
        "cancelled": 0,
    },
    "summary": {
        "mean_score": 0.6125,
        "scored_items": 8,
        "claims_total": 20,
        "claims_attributed": 12,
        "no_ground_truth": 1,
        "no_context": 2,
        "histogram": {"edges": [0, 0.2, 0.4, 0.6, 0.8, 1.0], "counts": [1, 0, 2, 3, 2]},
    },
    "usage": {
        "llm_calls": 18,
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "cost_usd": 0.0123,
        "claim_cache_hits": 2,
    },
    "failures": [
        {"error": "judge said no", "count": 1, "example_id": "q3"},
        {"error": "timeout", "count": 1, "example_id": "q9"},
    ],
}


def view(**changes: Any) -> dict[str, Any]:
    made = copy.deepcopy(VIEW)
    for path, value in changes.items():
        target = made
        *parents, leaf = path.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return made


@pytest.mark.parametrize(
    ("run", "gate", "code", "reasons"),
    [
        (view(counts__failed=0), Gate(), Exit.OK, []),
        (view(), Gate(), Exit.FAILED, ["2 items failed (allow some with --max-failed N)"]),
        (view(), Gate(max_failed=2), Exit.OK, []),
        (view(), Gate(max_failed=1), Exit.FAILED, ["2 items failed, more than --max-failed 1"]),
        (
            view(counts__failed=1),
            Gate(max_failed=0),
            Exit.FAILED,
            ["1 item failed, more than --max-failed 0"],
        ),
        (view(), Gate(min_score=0.6, max_failed=5), Exit.OK, []),
        (
            view(),
            Gate(min_score=0.7, max_failed=5),
            Exit.FAILED,
            ["mean score 0.6125 is below --min-score 0.7"],
        ),
        (
            view(summary__mean_score=None),
            Gate(min_score=0.1, max_failed=10),
            Exit.FAILED,
            ["no item was scored, so the mean score cannot reach --min-score 0.1"],
        ),
        (
            view(),
            Gate(min_score=0.9),
            Exit.FAILED,
            [
                "2 items failed (allow some with --max-failed N)",
                "mean score 0.6125 is below --min-score 0.9",
            ],
        ),
        (
            view(status="running", counts__pending=3, counts__running=1),
            Gate(min_score=0.1, max_failed=9),
            Exit.FAILED,
            ["run run-1 is running: 4 of 10 items not scored yet"],
        ),
        (
            view(status="cancelled", cancel_reason="budget", counts__failed=0),
            Gate(),
            Exit.FAILED,
            ["run run-1 was cancelled (budget)"],
        ),
    ],
)
def test_exit_codes_and_reasons(run, gate, code, reasons) -> None:
    assert gates.exit_code(run, gate) == (code, reasons)


def test_exit_codes_are_the_documented_ones() -> None:
    assert [int(code) for code in Exit] == [0, 1, 2, 130]


def test_passed_line_says_what_was_checked() -> None:
    assert gates.passed_line(view(), Gate(min_score=0.5, max_failed=3)) == (
        "gate passed: mean score 0.6125 >= --min-score 0.5, 2 failed <= --max-failed 3"
    )


@pytest.mark.parametrize(
    ("value", "text"), [(0.7, "0.7"), (0.69999, "0.7"), (0.6999, "0.6999"), (1.0, "1"), (0, "0")]
)
def test_number(value: float, text: str) -> None:
    assert gates.number(value) == text


def test_gate_of_parsed_options() -> None:
    class Options:
        min_score = 0.5

    assert Gate.of(Options()) == Gate(min_score=0.5, max_failed=None)


# --- display ---------------------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def test_progress_line_and_a_paused_run() -> None:
    running = view(status="running", counts__pending=2, counts__running=1)
    assert display.progress_line(running) == "running: 8 scored, 2 failed, 3 to go"
    running["waiting"] = {
        "model": "gpt-4o-mini",
        "reason": "provider outage (503)",
        "since": (NOW - timedelta(seconds=30)).isoformat(),
        "next_probe_at": (NOW + timedelta(seconds=42)).isoformat(),
    }
    assert display.progress_line(running, NOW) == (
        "running: 8 scored, 2 failed, 3 to go; paused: provider outage (503), next try in 42 s"
    )
    running["waiting"]["next_probe_at"] = None
    assert display.paused(running, NOW) == "paused: provider outage (503)"
    running["waiting"] = None
    assert display.paused(running, NOW) is None


def test_summary_uses_the_field_names() -> None:
    lines = display.summary_lines(view())
    text = "\n".join(lines)
    assert lines[0] == "recallq summary"
    for expected in (
        "  mean_score         0.6125",
        "  no_ground_truth    1 item scored 0: no ground truth to check against",
        "  no_context         2 items scored 0: no context was retrieved (check what feeds the "
        "contexts)",
        "  claims_attributed  12 of 20 (claims_total)",
        "  llm_calls          18",
        "  cost_usd           0.0123",
        "  1 x judge said no (e.g. item q3)",
        "  0.8-1]    #############        2",
    ):
        assert expected in lines, (expected, text)
    assert "cancelled" not in text  # zero counts other than succeeded/failed are left out


def test_summary_by_group() -> None:
    groups: dict[str, dict[str, Any]] = {
        "a": {"items": 3, "scored_items": 3, "failed": 0, "mean_score": 0.5},
        "(missing)": {"items": 1, "scored_items": 0, "failed": 1, "mean_score": None},
    }
    lines = display.summary_lines(view(), by="topic", groups=groups)
    assert lines[-3:] == [
        "  topic       items  scored  failed  mean_score",
        "  a               3       3       0      0.5000",
        "  (missing)       1       0       1           -",
    ]


def test_failures_beyond_those_listed_are_counted() -> None:
    many = view(counts__failed=5)
    assert display.failure_lines(many)[-1] == "  ... and 3 more with other errors"


def test_runs_table() -> None:
    lines = display.runs_table([view(), view(id="run-2", name=None, summary__mean_score=None)])
    assert lines[0].split() == [
        "created",
        "(UTC)",
        "id",
        "status",
        "total",
        "failed",
        "mean_score",
        "model",
        "name",
    ]
    assert lines[1].split() == [
        "2026-12-01",
        "09:30",
        "run-1",
        "completed",
        "10",
        "2",
        "0.6125",
        "local/lexical",
        "nightly",
    ]
    assert lines[2].split()[-3:] == ["-", "local/lexical", "-"]
    assert display.runs_table([]) == ["no runs"]


def test_compare_lines() -> None:
    result = {
        "matched": 3,
        "unmatched": {"base_only": 1, "candidate_only": 0, "unscored": 0},
        "base_mean": 0.5,
        "candidate_mean": 0.6,
        "mean_difference": 0.1,
        "ci95": [-0.05, 0.25],
        "improved": 1,
        "regressed": 0,
        "unchanged": 2,
        "largest_changes": [
            {
                "key": "q1",
                "base": 0.5,
                "candidate": 1.0,
                "difference": 0.5,
                "flipped": [{"claim": "It rains.", "base": "no", "candidate": "yes"}],
            }
        ],
        "claims_flipped": {"no_to_yes": 1, "yes_to_no": 0},
        "base_run": {"id": "A", "name": "a", "model": "m", "status": "running"},
        "candidate_run": {"id": "B", "name": None, "model": "m", "status": "completed"},
    }
    lines = display.compare_lines(result)
    assert "  mean_difference  +0.1000  (95% CI -0.0500 to +0.2500)" in lines
    assert "  (the interval contains 0: no difference shown at 95%)" in lines
    assert "  note: the base run is still running" in lines
    assert "  q1: 0.5 -> 1 (+0.50)" in lines and "      no -> yes: It rains." in lines
    assert "  base             A (a), m" in lines


def test_database_label_hides_passwords(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    assert display.database_label("sqlite:///recallq.db") == str(tmp_path / "recallq.db")
    assert display.database_label("postgresql+psycopg://me:s3cret@db:5432/x") == (
        "postgresql+psycopg://me:***@db:5432/x"
    )


def test_a_gate_on_items_scored_without_context() -> None:
    run = view(status="completed", counts__failed=0)
    assert gates.misses(run, gates.Gate(max_no_context=2)) == []
    assert gates.misses(run, gates.Gate(max_no_context=1)) == [
        "2 items were scored without any context, more than --max-no-context 1"
    ]
    assert gates.misses(run, gates.Gate()) == []  # not gated unless asked
    passed = gates.passed_line(run, gates.Gate(max_no_context=2))
    assert passed.endswith("2 without context <= --max-no-context 2")
