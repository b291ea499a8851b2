"""Context precision's pure rules (recallq.core.precision) and the pipeline's use of them."""

from __future__ import annotations

import math

import pytest

from recallq import pipeline
from recallq.core import precision
from recallq.core.scoring import Verdict


def by_hand(flags: list[bool]) -> float:
    hits, total = 0, 0.0
    for k, rel in enumerate(flags, start=1):
        if rel:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


@pytest.mark.parametrize(
    "flags",
    [
        [True, False, False],  # first
        [False, False, True],  # last
        [True, False, True, False, True],  # interleaved
        [False, True, False, True],
        [False, False, False],  # absent
        [True],
        [False],
    ],
)
def test_average_precision_is_the_hand_computed_value(flags: list[bool]) -> None:
    assert precision.average_precision(flags) == pytest.approx(by_hand(flags), abs=1e-4)
    assert precision.average_precision(flags, 10) == pytest.approx(by_hand(flags) * 10, abs=1e-3)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50])
def test_a_perfect_ranking_is_exactly_the_scale(n: int) -> None:
    flags = [True] * n + [False] * 3
    assert precision.average_precision(flags) == 1.0
    assert precision.average_precision(flags, 5) == 5.0
    assert precision.average_precision([True] * n) == 1.0


def test_no_relevant_passage_is_zero_never_nan() -> None:
    assert precision.average_precision([]) == 0.0
    assert precision.average_precision([False] * 4) == 0.0
    assert precision.first_relevant_rank([False, False]) is None
    assert precision.first_relevant_rank([False, True, True]) == 2


def test_worked_example() -> None:
    # relevant at ranks 2 and 4: (1/2 + 2/4) / 2 = 0.5
    assert precision.average_precision([False, True, False, True]) == 0.5
    # ranks 1 and 3: (1 + 2/3) / 2 = 0.8333
    assert precision.average_precision([True, False, True]) == 0.8333


def test_cited_from_verdicts_counts_each_rank_and_lists_supported_claims() -> None:
    verdicts = {
        0: Verdict(0, "yes", [1, 2]),
        1: Verdict(1, "no", []),
        2: Verdict(2, "yes", [2]),
    }
    got = precision.cited(verdicts, 4, 1.0)
    assert got is not None
    assert [p.relevant for p in got.passages] == [False, True, True, False]
    assert [p.claims for p in got.passages] == [[], [0], [0, 2], []]
    assert got.context_precision == pytest.approx(by_hand([False, True, True, False]), abs=1e-4)
    assert got.first_relevant_rank == 2
    assert got.passages_json()[1] == {"index": 1, "relevant": True, "claims": [0], "reason": None}


def test_cited_without_a_context_is_null() -> None:
    assert precision.cited({0: Verdict(0, "no", [])}, 0, 1.0) is None


def test_cited_ignores_out_of_range_indices() -> None:
    got = precision.cited({0: Verdict(0, "yes", [5, 0])}, 2, 1.0)
    assert got is not None and got.context_precision == 1.0


def test_match_relevance_by_context_index() -> None:
    raw = [
        {"context_index": 2, "verdict": "Yes.", "reason": "r2"},
        {"context_index": 0, "verdict": "no", "reason": "r0"},
        {"context_index": 0, "verdict": "yes"},  # duplicate: first wins
        {"context_index": 9, "verdict": "yes"},  # out of range
        {"context_index": True, "verdict": "yes"},
        "junk",
    ]
    matched, missing = precision.match_relevance(raw, 3)
    assert {i: r.relevant for i, r in matched.items()} == {2: True, 0: False}
    assert missing == [1]
    assert precision.match_relevance(None, 2) == ({}, [0, 1])


def test_relevance_found_asks_again_once_then_fails_naming_the_passage() -> None:
    raw = [{"context_index": 0, "verdict": "yes", "reason": "a"}]
    first = pipeline.relevance_found(raw, [0, 1, 2], 3, {}, reask=False)
    assert isinstance(first, pipeline.AskAgainPassages) and first.missing == [1, 2]
    again = [{"context_index": 1, "verdict": "no", "reason": "b"}]
    second = pipeline.relevance_found(again, first.missing, 3, first.relevance, reask=True)
    assert isinstance(second, pipeline.Failed)
    assert "passage(s) 2" in second.error and "asked twice" in second.error
    whole = [*again, {"context_index": 2, "verdict": "yes", "reason": "c"}]
    done = pipeline.relevance_found(whole, first.missing, 3, first.relevance, reask=True)
    assert isinstance(done, pipeline.Relevant) and sorted(done.relevance) == [0, 1, 2]


def test_judged_precision_keeps_the_reason_and_the_claims_that_cite() -> None:
    verdicts = {0: Verdict(0, "yes", [1])}
    done = pipeline.scored(["c"], verdicts, 1.0, 2, precision.PrecisionMode.OFF)
    assert done.precision is None
    relevance = {
        0: precision.Relevance(0, False, "none"),
        1: precision.Relevance(1, True, "states it"),
    }
    judged = pipeline.judged_precision(done, relevance, 2, 1.0)
    assert judged.precision is not None
    assert judged.precision.context_precision == 0.5
    assert judged.precision.passages_json()[1] == {
        "index": 1,
        "relevant": True,
        "claims": [0],
        "reason": "states it",
    }


def test_scored_cited_and_needs_relevance() -> None:
    verdicts = {0: Verdict(0, "yes", [0])}
    cited = pipeline.scored(["c"], verdicts, 2.0, 3, precision.PrecisionMode.CITED)
    assert cited.precision is not None and cited.precision.context_precision == 2.0
    assert pipeline.needs_relevance("judged", 3)
    assert not pipeline.needs_relevance("judged", 0)
    assert not pipeline.needs_relevance("cited", 3)


def test_id_scores() -> None:
    assert precision.id_scores(["a", "b", "c"], ["a", "c"], 1.0) == (0.8333, 1.0)
    assert precision.id_scores(["x", "a"], ["a", "b"], 1.0) == (0.5, 0.5)
    assert precision.id_scores(["a", "b"], ["a", "b"], 1.0) == (1.0, 1.0)
    assert precision.id_scores([1, 2], ["1"], 1.0) == (1.0, 1.0)
    # without ids to compute from: null, never NaN
    assert precision.id_scores(None, ["a"], 1.0) == (None, None)
    assert precision.id_scores([], ["a"], 1.0) == (None, 0.0)
    assert precision.id_scores(["a"], [], 1.0) == (None, None)
    assert precision.id_scores([], [], 1.0) == (None, None)
    for value in precision.id_scores(["a", "a", "b"], ["a"], 1.0):
        assert value is not None and not math.isnan(value)
    with pytest.raises(ValueError, match="retrieved_context_ids must be a list"):
        precision.id_scores("a,b", ["a"], 1.0)


def test_validate_mode() -> None:
    assert precision.validate_mode(None) == "cited"
    assert precision.validate_mode("judged") == "judged"
    for bad in ("", "Cited", 1, ["off"]):
        with pytest.raises(ValueError, match='precision must be "cited", "judged" or "off"'):
            precision.validate_mode(bad)
