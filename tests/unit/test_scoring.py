"""Unit tests for recallq.core.scoring: the scoring rules (ground truth, claims, verdicts,
reason)."""

from __future__ import annotations

import json
import math

import pytest

from recallq.core.scoring import (
    Outcome,
    Verdict,
    ground_truth_text,
    match_verdicts,
    no_claims,
    no_context,
    no_context_verdicts,
    no_ground_truth,
    normalise_verdict,
    recall_score,
    score_claims,
    validate_scale,
)

CLAIMS = ["Einstein was born in 1879", "He won the Nobel Prize", "He lived in Paris"]


def verdicts_for(*specs: tuple[str, list[int]]) -> dict[int, Verdict]:
    """Verdicts for claims 0..n-1 from (verdict, context_indices) pairs."""
    return {i: Verdict(i, verdict, indices) for i, (verdict, indices) in enumerate(specs)}


def raw(index, verdict="yes", context_indices=None, reason="r"):
    return {
        "claim_index": index,
        "verdict": verdict,
        "context_indices": [] if context_indices is None else context_indices,
        "reason": reason,
    }


# --- (1) score = attributed / total x scale, rounded to 2 decimals -------------------------


@pytest.mark.parametrize(
    ("attributed", "total", "scale", "expected"),
    [
        (2, 3, 1.0, 0.67),
        (1, 3, 1.0, 0.33),
        (2, 3, 10.0, 6.67),
        (1, 3, 10.0, 3.33),
        (3, 3, 1.0, 1.0),
        (0, 3, 1.0, 0.0),
        (1, 2, 1.0, 0.5),
        (1, 8, 1.0, 0.12),  # 0.125 -> round half to even
        (5, 7, 100.0, 71.43),
        (1, 1, 2.5, 2.5),
    ],
)
def test_recall_score_is_ratio_times_scale_rounded(attributed, total, scale, expected) -> None:
    assert recall_score(attributed, total, scale) == expected


def test_recall_score_matches_formula_and_stays_within_scale() -> None:
    for scale in (0.5, 1.0, 3.0, 10.0, 100.0):
        for total in range(1, 13):
            for attributed in range(total + 1):
                score = recall_score(attributed, total, scale)
                assert score == round(attributed / total * scale, 2)
                assert 0.0 <= score <= scale


def test_recall_score_with_no_claims_is_zero() -> None:
    assert recall_score(0, 0, 1.0) == 0.0
    assert recall_score(3, 0, 10.0) == 0.0


def test_recall_score_caps_attributed_at_total() -> None:
    assert recall_score(5, 3, 1.0) == 1.0
    assert recall_score(5, 3, 10.0) == 10.0


def test_score_claims_outcome_keeps_exact_counts() -> None:
    outcome = score_claims(CLAIMS, verdicts_for(("yes", [0]), ("yes", [1]), ("no", [])), 1.0)
    assert isinstance(outcome, Outcome)
    assert outcome.score == 0.67
    assert outcome.claims_total == 3
    assert outcome.claims_attributed == 2


def test_score_claims_with_scale_ten() -> None:
    outcome = score_claims(CLAIMS, verdicts_for(("yes", [0]), ("no", []), ("yes", [2])), 10.0)
    assert (outcome.score, outcome.claims_total, outcome.claims_attributed) == (6.67, 3, 2)
    assert outcome.reason.startswith("The score is 6.67 because 2 of 3 claims")


def test_score_claims_all_and_none_supported() -> None:
    all_yes = score_claims(CLAIMS, verdicts_for(*[("yes", [0])] * 3), 1.0)
    assert (all_yes.score, all_yes.claims_total, all_yes.claims_attributed) == (1.0, 3, 3)
    all_no = score_claims(CLAIMS, verdicts_for(*[("no", [])] * 3), 1.0)
    assert (all_no.score, all_no.claims_total, all_no.claims_attributed) == (0.0, 3, 0)


@pytest.mark.parametrize(("scale", "expected"), [(1, 1.0), (0.5, 0.5), (10, 10.0), (1e-3, 1e-3)])
def test_validate_scale_accepts_positive_finite_numbers(scale, expected) -> None:
    result = validate_scale(scale)
    assert result == expected
    assert type(result) is float


@pytest.mark.parametrize(
    "scale",
    [0, 0.0, -0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "1", "abc", None, [1], {}],
    ids=repr,
)
def test_validate_scale_rejects(scale) -> None:
    with pytest.raises(ValueError):
        validate_scale(scale)


def test_validate_scale_rejects_huge_integer_with_value_error() -> None:
    with pytest.raises(ValueError):
        validate_scale(10**400)


# --- (2) ground truth ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "  ", "\n\t  \r\n"], ids=repr)
def test_ground_truth_missing_or_blank_is_none(value) -> None:
    assert ground_truth_text(value) is None


def test_ground_truth_string_is_kept_as_is() -> None:
    text = "  Einstein was born in 1879.\n"
    assert ground_truth_text(text) == text


@pytest.mark.parametrize(
    "value",
    [
        {"born": 1879, "city": "Ulm"},
        {"name": "Zürich"},
        ["Einstein", "Nobel Prize"],
        1879,
        0,
        3.5,
        False,
        {"nested": {"list": [1, None, "x"]}},
    ],
    ids=repr,
)
def test_ground_truth_non_string_is_json_text(value) -> None:
    text = ground_truth_text(value)
    assert isinstance(text, str)
    assert json.loads(text) == value
    assert text == json.dumps(value, ensure_ascii=False)


def test_ground_truth_json_keeps_unicode_readable() -> None:
    assert ground_truth_text({"city": "Zürich"}) == '{"city": "Zürich"}'
    assert ground_truth_text(1879) == "1879"
    assert ground_truth_text(False) == "false"


def test_no_ground_truth_outcome() -> None:
    outcome = no_ground_truth()
    assert (outcome.score, outcome.claims_total, outcome.claims_attributed) == (0.0, 0, 0)
    assert outcome.reason.startswith("The score is 0 because")
    assert "no ground truth" in outcome.reason


# --- (3) no claims -------------------------------------------------------------------------


def test_no_claims_outcome() -> None:
    outcome = no_claims()
    assert (outcome.score, outcome.claims_total, outcome.claims_attributed) == (0.0, 0, 0)
    assert outcome.reason.startswith("The score is 0 because")
    assert "no claims" in outcome.reason


# --- (4) no context ------------------------------------------------------------------------


def test_no_context_verdicts_are_all_no_without_indices() -> None:
    verdicts = no_context_verdicts(3)
    assert sorted(verdicts) == [0, 1, 2]
    for index, verdict in verdicts.items():
        assert verdict.claim_index == index
        assert verdict.verdict == "no"
        assert verdict.context_indices == []
        assert "no context" in verdict.reason


def test_no_context_verdicts_for_zero_claims() -> None:
    assert no_context_verdicts(0) == {}


def test_no_context_outcome() -> None:
    outcome = no_context(CLAIMS)
    assert (outcome.score, outcome.claims_total, outcome.claims_attributed) == (0.0, 3, 0)
    assert outcome.reason.startswith("The score is 0 because")
    assert "no context was retrieved" in outcome.reason


def test_no_context_verdicts_score_zero() -> None:
    outcome = score_claims(CLAIMS, no_context_verdicts(len(CLAIMS)), 10.0)
    assert (outcome.score, outcome.claims_total, outcome.claims_attributed) == (0.0, 3, 0)


# --- (6) matching verdicts to claims -------------------------------------------------------


def test_match_all_verdicts() -> None:
    matched, missing = match_verdicts(
        [raw(1, "no", [], "absent"), raw(0, "yes", [1], "stated"), raw(2, "yes", [0])], 3, 2
    )
    assert missing == []
    assert matched == {
        0: Verdict(0, "yes", [1], "stated"),
        1: Verdict(1, "no", [], "absent"),
        2: Verdict(2, "yes", [0], "r"),
    }


def test_missing_claims_are_reported_in_order() -> None:
    matched, missing = match_verdicts([raw(1), raw(3)], 5, 1)
    assert sorted(matched) == [1, 3]
    assert missing == [0, 2, 4]


@pytest.mark.parametrize("value", [None, {}, "yes", 3, {"verdicts": []}], ids=repr)
def test_non_list_answer_leaves_every_claim_missing(value) -> None:
    assert match_verdicts(value, 3, 1) == ({}, [0, 1, 2])


def test_zero_claims() -> None:
    assert match_verdicts([raw(0)], 0, 1) == ({}, [])


def test_out_of_range_verdicts_are_ignored() -> None:
    matched, missing = match_verdicts([raw(-1), raw(3), raw(99), raw(1, "no")], 3, 1)
    assert list(matched) == [1]
    assert matched[1].verdict == "no"
    assert missing == [0, 2]


def test_duplicate_verdicts_first_wins() -> None:
    matched, missing = match_verdicts(
        [raw(0, "no", [], "first"), raw(0, "yes", [0], "second"), raw(1, "yes", [0])], 2, 1
    )
    assert matched[0] == Verdict(0, "no", [], "first")
    assert matched[1].verdict == "yes"
    assert missing == []


def test_unreadable_first_verdict_does_not_block_a_later_readable_one() -> None:
    matched, missing = match_verdicts([raw(0, "maybe"), raw(0, "yes", [0], "ok")], 1, 1)
    assert matched == {0: Verdict(0, "yes", [0], "ok")}
    assert missing == []


@pytest.mark.parametrize("index", [True, False, "0", "1", 0.0, 1.0, None, [0], {"i": 0}], ids=repr)
def test_non_int_claim_index_is_ignored(index) -> None:
    matched, missing = match_verdicts([raw(index)], 2, 1)
    assert matched == {}
    assert missing == [0, 1]


def test_entries_that_are_not_objects_or_lack_claim_index_are_ignored() -> None:
    answer = ["yes", 0, None, [0, "yes"], {"verdict": "yes"}, raw(1)]
    matched, missing = match_verdicts(answer, 2, 1)
    assert list(matched) == [1]
    assert missing == [0]


@pytest.mark.parametrize(
    "verdict", ["maybe", "", "   ", None, 1, 0, [], {}, "yes no", "yess", "nope", "true"], ids=repr
)
def test_unreadable_verdict_is_ignored(verdict) -> None:
    matched, missing = match_verdicts([raw(0, verdict)], 1, 1)
    assert matched == {}
    assert missing == [0]


def test_verdict_key_missing_is_ignored() -> None:
    matched, missing = match_verdicts([{"claim_index": 0, "context_indices": [0]}], 1, 1)
    assert (matched, missing) == ({}, [0])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("yes", "yes"),
        ("Yes", "yes"),
        (" yes ", "yes"),
        ("yes.", "yes"),
        ("YES", "yes"),
        ("Yes!", "yes"),
        ("\tYes.\n", "yes"),
        ("no", "no"),
        ("No.", "no"),
        (" NO ", "no"),
    ],
    ids=repr,
)
def test_normalise_verdict_accepts_variants(value, expected) -> None:
    assert normalise_verdict(value) == expected


@pytest.mark.parametrize("value", ["Yes", " yes ", "yes.", "YES", "No.", " no "], ids=repr)
def test_verdict_variants_are_matched(value) -> None:
    matched, missing = match_verdicts([raw(0, value)], 1, 1)
    assert missing == []
    assert matched[0].verdict == value.strip(" .").lower()


@pytest.mark.parametrize(
    "value", ["maybe", "", "   ", "unknown", "yes no", "yess", "nope", None, 1, 1.0, [], {}]
)
def test_normalise_verdict_rejects_non_verdicts(value) -> None:
    assert normalise_verdict(value) is None


def test_context_indices_are_filtered_deduped_and_sorted() -> None:
    messy = [2, 0, 2, 5, -1, 3, True, False, "1", 1.0, None, [0], 1]
    matched, _ = match_verdicts([raw(0, "yes", messy)], 1, 3)
    assert matched[0].context_indices == [0, 1, 2]


@pytest.mark.parametrize("value", [None, "0", 0, {"0": 0}, (0, 1)], ids=repr)
def test_context_indices_that_are_not_a_list_become_empty(value) -> None:
    matched, _ = match_verdicts([raw(0, "yes", value)], 1, 3)
    assert matched[0].context_indices == []


def test_context_indices_with_no_contexts_are_empty() -> None:
    matched, _ = match_verdicts([raw(0, "yes", [0, 1])], 1, 0)
    assert matched[0].context_indices == []


@pytest.mark.parametrize("reason", [None, 3, ["x"], {"why": "x"}], ids=repr)
def test_non_string_reason_becomes_empty(reason) -> None:
    matched, _ = match_verdicts([raw(0, "yes", [0], reason)], 1, 1)
    assert matched[0].reason == ""


def test_missing_reason_becomes_empty() -> None:
    matched, _ = match_verdicts([{"claim_index": 0, "verdict": "yes"}], 1, 1)
    assert matched[0] == Verdict(0, "yes", [], "")


@pytest.mark.parametrize("scale", [1.0, 10.0, 0.5])
def test_duplicate_yes_verdicts_never_push_score_above_scale(scale) -> None:
    answer = [raw(0, "yes", [0])] * 5 + [raw(1, "YES", [0])] * 3 + [raw(0, "yes.")]
    matched, missing = match_verdicts(answer, 2, 1)
    assert missing == []
    outcome = score_claims(["a", "b"], matched, scale)
    assert outcome.score == scale
    assert (outcome.claims_total, outcome.claims_attributed) == (2, 2)


def test_duplicate_yes_verdicts_do_not_cover_other_claims() -> None:
    matched, missing = match_verdicts([raw(0, "yes", [0])] * 3, 3, 1)
    assert list(matched) == [0]
    assert missing == [1, 2]


# --- (7) reason ----------------------------------------------------------------------------


def test_reason_exact_text() -> None:
    outcome = score_claims(CLAIMS, verdicts_for(("yes", [0]), ("yes", [1, 2]), ("no", [])), 1.0)
    assert outcome.reason == (
        "The score is 0.67 because 2 of 3 claims are supported by the context: "
        '"Einstein was born in 1879" (context 0); "He won the Nobel Prize" (context 1, 2); '
        'missing: "He lived in Paris".'
    )


def test_reason_structure_names_supporting_contexts_and_missing_claims() -> None:
    claims = ["alpha claim", "beta claim", "gamma claim"]
    outcome = score_claims(claims, verdicts_for(("no", []), ("yes", [3, 4]), ("yes", [0])), 1.0)
    prefix = "The score is 0.67 because 2 of 3 claims are supported by the context: "
    assert outcome.reason.startswith(prefix)
    supported, _, missing = outcome.reason[len(prefix) :].partition("; missing: ")
    assert supported == '"beta claim" (context 3, 4); "gamma claim" (context 0)'
    assert missing == '"alpha claim".'
    assert outcome.reason.count("missing: ") == 1


def test_reason_all_supported_has_no_missing_part() -> None:
    outcome = score_claims(CLAIMS[:2], verdicts_for(("yes", [0]), ("yes", [0, 1])), 1.0)
    assert outcome.reason == (
        "The score is 1 because 2 of 2 claims are supported by the context: "
        '"Einstein was born in 1879" (context 0); "He won the Nobel Prize" (context 0, 1).'
    )
    assert "missing" not in outcome.reason


def test_reason_none_supported_lists_every_claim_as_missing() -> None:
    outcome = score_claims(CLAIMS[:2], verdicts_for(("no", []), ("no", [])), 1.0)
    assert outcome.reason == (
        "The score is 0 because 0 of 2 claims are supported by the context; "
        'missing: "Einstein was born in 1879"; "He won the Nobel Prize".'
    )


def test_reason_supported_claim_without_indices_is_quoted_alone() -> None:
    outcome = score_claims(["a fact"], verdicts_for(("yes", [])), 1.0)
    assert outcome.reason == (
        'The score is 1 because 1 of 1 claims are supported by the context: "a fact".'
    )


def test_reason_collapses_whitespace_and_clips_long_claims() -> None:
    long_claim = "word " * 40  # 200 characters
    claims = ["spread\n  over\tlines", long_claim]
    outcome = score_claims(claims, verdicts_for(("yes", [0]), ("no", [])), 1.0)
    assert '"spread over lines" (context 0)' in outcome.reason
    quoted = outcome.reason.split("missing: ", 1)[1].removesuffix(".")
    assert quoted.startswith('"word word') and quoted.endswith('…"')
    assert len(quoted) == 80 + 2  # 79 characters, the ellipsis and two quotes


def test_reason_states_the_reported_score() -> None:
    for scale in (1.0, 10.0, 3.0, 100.0):
        outcome = score_claims(CLAIMS, verdicts_for(("yes", [0]), ("yes", [1]), ("no", [])), scale)
        assert outcome.reason.startswith(f"The score is {outcome.score:g} because 2 of 3 claims")


def test_reason_states_the_two_decimal_score_for_large_scales() -> None:
    outcome = score_claims(CLAIMS, verdicts_for(("yes", [0]), ("yes", [1]), ("no", [])), 100000.0)
    assert outcome.score == 66666.67
    assert outcome.reason.startswith("The score is 66666.67 because 2 of 3 claims")
