"""Result exports (recallq.core.export), groups (recallq.core.groups), local run keys, API URLs and
cursors: the pure pieces of issue 12."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from recallq.client import base_url
from recallq.core import export, groups
from recallq.runs import ingest, local, run_views

RESULTS: list[dict[str, Any]] = [
    {
        "id": "q1",
        "index": 0,
        "status": "succeeded",
        "score": 0.5,
        "reason": "The score is 0.5 because ...",
        "error": None,
        "attempts": 1,
        "claims_total": 2,
        "claims_attributed": 1,
        "claims": [
            {
                "index": 0,
                "text": 'A, "quoted".',
                "verdict": "yes",
                "context_indices": [0],
                "reason": "r0",
            },
            {"index": 1, "text": "B.", "verdict": "no", "context_indices": [], "reason": "r1"},
        ],
        "input": [{"role": "user", "content": "hi"}],
        "output": None,
        "ground_truth": "A. B.",
        "context": ["A is so."],
        "metadata": {"topic": "x", "n": 3},
    },
    {
        "id": "q2",
        "index": 1,
        "status": "failed",
        "score": None,
        "reason": None,
        "error": "boom",
        "attempts": 2,
        "claims_total": None,
        "claims_attributed": None,
        "claims": [],
    },
]


def test_jsonl_is_one_object_per_line() -> None:
    lines = list(export.lines(RESULTS, "jsonl"))
    assert [json.loads(line) for line in lines] == RESULTS
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)


def test_csv_has_item_data_as_json_cells() -> None:
    rows = list(csv.DictReader(io.StringIO("".join(export.lines(RESULTS, "csv")))))
    assert list(rows[0]) == export.ITEM_COLUMNS
    assert json.loads(rows[0]["input"]) == [{"role": "user", "content": "hi"}]
    assert rows[0]["ground_truth"] == "A. B." and json.loads(rows[0]["context"]) == ["A is so."]
    assert json.loads(rows[0]["metadata"]) == {"topic": "x", "n": 3}
    assert rows[1]["input"] == "" and rows[1]["error"] == "boom"  # results without item data
    assert json.loads(rows[0]["claims"])[0]["text"] == 'A, "quoted".'


def test_claims_csv_is_one_row_per_claim() -> None:
    rows = list(csv.DictReader(io.StringIO("".join(export.lines(RESULTS, "claims.csv")))))
    assert rows == [
        {
            "id": "q1",
            "index": "0",
            "claim_index": "0",
            "text": 'A, "quoted".',
            "verdict": "yes",
            "context_indices": "[0]",
            "reason": "r0",
        },
        {
            "id": "q1",
            "index": "0",
            "claim_index": "1",
            "text": "B.",
            "verdict": "no",
            "context_indices": "[]",
            "reason": "r1",
        },
    ]


def test_write_and_formats_by_name(tmp_path: Path) -> None:
    with (tmp_path / "out.csv").open("w") as out:
        assert export.write(RESULTS, "csv", out) == 3
    assert export.format_for(Path("r.csv")) == "csv"
    assert export.format_for(Path("r.claims.csv")) == "claims.csv"
    assert export.format_for(Path("R.JSONL")) == export.format_for(Path("r")) == "jsonl"
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        list(export.lines(RESULTS, "xml"))


def test_groups() -> None:
    items = [
        groups.GroupedItem("succeeded", 1.0, {"topic": "a"}),
        groups.GroupedItem("succeeded", 0.5, {"topic": "a"}),
        groups.GroupedItem("failed", None, {"topic": "b"}),
        groups.GroupedItem("succeeded", 0.0, {"topic": 3}),
        groups.GroupedItem("succeeded", 0.25, None),
        groups.GroupedItem("pending", None, {"other": 1}),
    ]
    none = {"mean_context_precision": None, "context_precision_ci95": None}
    assert groups.summarise_groups(items, "topic") == {
        "(missing)": {"items": 2, "scored_items": 1, "failed": 0, "mean_score": 0.25, **none},
        "3": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 0.0, **none},
        "a": {"items": 2, "scored_items": 2, "failed": 0, "mean_score": 0.75, **none},
        "b": {"items": 1, "scored_items": 0, "failed": 1, "mean_score": None, **none},
    }


def test_groups_with_precision() -> None:
    items = [
        groups.GroupedItem("succeeded", 1.0, {"topic": "a"}, 2, context_precision=1.0),
        groups.GroupedItem("succeeded", 0.5, {"topic": "a"}, 1, context_precision=0.25),
        groups.GroupedItem("succeeded", 0.0, {"topic": "a"}),  # no context: no precision
    ]
    group = groups.summarise_groups(items, "topic")["a"]
    assert group["mean_context_precision"] == 0.75
    low, high = group["context_precision_ci95"]
    assert 0 <= low < 0.75 < high


def test_passages_csv() -> None:
    result = {
        "id": "q",
        "index": 0,
        "passages": [
            {"index": 0, "relevant": False, "claims": [], "reason": None},
            {"index": 1, "relevant": True, "claims": [0, 2], "reason": "=states it"},
        ],
    }
    lines = list(
        export.lines([result, {"id": "off", "index": 1, "passages": None}], "passages.csv")
    )
    assert "".join(lines).splitlines() == [
        "id,index,passage_index,relevant,claims,reason",
        "q,0,0,False,[],",
        'q,0,1,True,"[0, 2]",\'=states it',
    ]
    assert export.format_for(Path("r.passages.csv")) == "passages.csv"
    assert groups.group_value({"k": [1, "x"]}, "k") == '[1, "x"]'


def test_local_run_key_follows_the_file_and_the_run_fields(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"context": ["c"]}\n')
    spec = ingest.RunSpec(model="local/lexical", name="d.jsonl")
    key = local.run_key(path, spec, {})
    assert key.startswith(local.RUN_KEY_PREFIX) and len(key) <= 200
    assert local.run_key(path, ingest.RunSpec(model="local/lexical", name="d.jsonl"), {}) == key
    assert local.run_key(path, spec, {"a": "metadata"}) != key
    assert local.run_key(path, ingest.RunSpec(model="m", name="d.jsonl"), {}) != key
    assert local.run_key(path, ingest.RunSpec(model="local/lexical", scale=10), {}) != key
    path.write_text('{"context": ["changed"]}\n')
    assert local.run_key(path, spec, {}) != key


@pytest.mark.parametrize(
    "url",
    ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", " http://h:8000 "],
)
def test_api_url_as_people_write_it(url: str) -> None:
    assert base_url(url) == "http://h:8000"


def test_runs_cursor_round_trip_and_rejects_others() -> None:
    cursor = (datetime(2026, 12, 1, 9, 30, 0, 123456, tzinfo=UTC), "run-id")
    encoded = run_views.encode_run_cursor(cursor)
    assert encoded is not None and run_views.decode_run_cursor(encoded) == cursor
    assert run_views.encode_run_cursor(None) is None
    for bad in ("nope", "MTA=", "W10="):
        with pytest.raises(ValueError):
            run_views.decode_run_cursor(bad)
