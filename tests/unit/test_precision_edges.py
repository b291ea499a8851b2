"""Edges of context precision found by probing it as a user and as an attacker: ids that leave
nothing to be relevant to, ids read from CSV cells, and the one message for bad ids in every
entry point."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import recallq
from recallq.cli.parser import build_parser
from recallq.core import precision
from recallq.core.gates import Gate, misses
from recallq.core.precision import REFERENCE_IDS as REFERENCE
from recallq.core.precision import RETRIEVED_IDS as RETRIEVED
from recallq.judge import protocol
from recallq.runs import dataset

ITEM = {"id": "q", "ground_truth": "Einstein was born in 1879.", "context": ["Born in 1879."]}


def test_no_reference_id_leaves_id_precision_null_like_no_ground_truth() -> None:
    # nothing is relevant to an item without reference ids: null (never a 0 that drags the
    # mean down), as context_precision is without a ground truth
    assert precision.id_scores(["a", "b"], [], 1.0) == (None, None)
    assert precision.id_scores([], [], 1.0) == (None, None)
    # a reference id and nothing retrieved is a miss: recall 0, precision null (no context)
    assert precision.id_scores([], ["a"], 10.0) == (None, 0.0)


def test_csv_cells_carry_ids_as_lists(tmp_path: Path) -> None:
    path = tmp_path / "ids.csv"
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["id", "ground_truth", "context", RETRIEVED, REFERENCE])
        # a JSON list, and the Python repr pandas' to_csv writes for a list column (RAGAS's)
        writer.writerow(
            ["q", ITEM["ground_truth"], "Born in 1879.", '["r1", "r2"]', "['r2', 'r9']"]
        )
    (item,) = dataset.items_from(path)
    assert item["metadata"] == {RETRIEVED: ["r1", "r2"], REFERENCE: ["r2", "r9"]}
    url = f"sqlite:///{tmp_path / 'recallq.db'}"
    summary = recallq.evaluate(path, database_url=url, progress=False).summary
    assert summary["mean_id_precision"] == 0.5 and summary["mean_id_recall"] == 0.5


@pytest.mark.parametrize(
    "ids",
    ["r1", {"r1": 1}, [1.5], [None], [["r1"]], [True]],
    ids=["string", "object", "float", "null", "nested", "boolean"],
)
def test_bad_ids_are_the_one_message(ids: object, tmp_path: Path) -> None:
    bad = {**ITEM, "retrieved_context_ids": ids, "reference_context_ids": ["r1"]}
    with pytest.raises(ValueError) as raised:
        recallq.evaluate([bad], database_url=f"sqlite:///{tmp_path / 'r.db'}", progress=False)
    assert str(raised.value) == (
        "item 0: retrieved_context_ids must be a list of ids (strings or integers)"
    )


@pytest.mark.parametrize(
    "command", [["run", "data.jsonl"], ["submit", "data.jsonl"], ["gate", "r"]]
)
@pytest.mark.parametrize("option", ["--min-precision", "--min-score"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_a_gate_threshold_that_is_not_a_finite_number_is_refused(
    command: list[str], option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # every comparison with NaN is false: `mean < nan` let every run pass its gate
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, f"{option}={value}"])
    assert exited.value.code == 2
    assert f"argument {option}: must be a finite number, got {value!r}" in capsys.readouterr().err


def test_a_nan_threshold_never_passes_a_gate() -> None:
    view = {
        "id": "r",
        "status": "completed",
        "counts": {"total": 1, "pending": 0, "running": 0, "succeeded": 1, "failed": 0},
        "summary": {"mean_score": 0.5, "mean_context_precision": 0.5, "no_context": 0},
    }
    for gate in (Gate(min_precision=math.nan), Gate(min_score=math.nan)):
        assert misses(view, gate), gate
    assert not misses(view, Gate(min_precision=0.5, min_score=0.5))


@pytest.mark.parametrize("schema", [protocol.RELEVANCE, protocol.ATTRIBUTION])
def test_a_judges_nul_or_lone_surrogate_becomes_a_replacement_character(schema: str) -> None:
    # Postgres text cannot hold a NUL, and a lone surrogate cannot be encoded as UTF-8: stored
    # in a JSON column it made every read of the item a 500
    index = "context_index" if schema == protocol.RELEVANCE else "claim_index"
    answer = json.dumps(
        {"verdicts": [{index: 0, "verdict": "yes", "reason": "a\u0000b\ud800c", "x": ["\udfff"]}]}
    )
    for redact in (None, str.upper):
        data = protocol.parse_answer(schema, answer, "stop", redact=redact)
        (verdict,) = data["verdicts"]
        assert verdict["reason"] == ("A\ufffdB\ufffdC" if redact else "a\ufffdb\ufffdc")
        assert verdict["x"] == ["\ufffd"]
    claims = protocol.parse_answer(protocol.EXTRACTION, '{"claims": ["x\\u0000y"]}', "stop")
    assert claims["claims"] == ["x\ufffdy"]


def test_csv_columns_mapped_to_the_ids_carry_lists(tmp_path: Path) -> None:
    path = tmp_path / "mapped.csv"
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["id", "ground_truth", "context", "ret", "ref"])
        writer.writerow(["q", ITEM["ground_truth"], "Born in 1879.", '["r1", "r2"]', "['r1']"])
    mapping = {"ret": f"metadata.{RETRIEVED}", "ref": f"metadata.{REFERENCE}"}
    (item,) = dataset.items_from(path, mapping=mapping)
    assert item["metadata"] == {RETRIEVED: ["r1", "r2"], REFERENCE: ["r1"]}
