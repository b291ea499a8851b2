"""Unit tests for the offline judge local/lexical (pure functions, no I/O)."""

from __future__ import annotations

import pytest

from recallq.core.usage import Usage
from recallq.judge.lexical import (
    SUPPORT_THRESHOLD,
    LexicalJudge,
    split_claims,
    supporting_contexts,
)

EINSTEIN = "Einstein was born in 1879. He won the Nobel Prize in Physics in 1921."
ULM = "Albert Einstein was born on 14 March 1879 in Ulm."

VERDICT_KEYS = {"claim_index", "verdict", "context_indices", "reason"}


# --- split_claims: sentences ---------------------------------------------------------


def test_two_sentences_become_two_claims_without_trailing_punctuation() -> None:
    assert split_claims(EINSTEIN) == [
        "Einstein was born in 1879",
        "He won the Nobel Prize in Physics in 1921",
    ]


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n", ". ! ?"])
def test_empty_or_contentless_input_gives_no_claims(text: str) -> None:
    assert split_claims(text) == []


def test_abbreviations_do_not_end_sentences() -> None:
    text = "Dr. Smith moved to the U.S. in 1990. He met Prof. Jones, e.g. at Harvard."
    assert split_claims(text) == [
        "Dr. Smith moved to the U.S. in 1990",
        "He met Prof. Jones, e.g. at Harvard",
    ]


def test_initials_do_not_end_sentences() -> None:
    text = "J. R. R. Tolkien wrote The Hobbit. It was published in 1937."
    assert split_claims(text) == ["J. R. R. Tolkien wrote The Hobbit", "It was published in 1937"]


def test_decimals_do_not_end_sentences() -> None:
    text = "The rate rose to 3.5 percent. It fell to 2.25 percent in 2020."
    assert split_claims(text) == ["The rate rose to 3.5 percent", "It fell to 2.25 percent in 2020"]


def test_question_and_exclamation_marks_end_sentences() -> None:
    text = "Is water wet? Water boils at 100 degrees! Ice melts at 0 degrees."
    assert split_claims(text) == [
        "Is water wet",
        "Water boils at 100 degrees",
        "Ice melts at 0 degrees",
    ]


def test_newlines_and_bullets_split_and_markers_are_dropped() -> None:
    text = (
        "- Paris is the capital of France\n"
        "* Berlin is the capital of Germany\n"
        "\n"
        "1. Rome is the capital of Italy\n"
        "2) Madrid is the capital of Spain"
    )
    assert split_claims(text) == [
        "Paris is the capital of France",
        "Berlin is the capital of Germany",
        "Rome is the capital of Italy",
        "Madrid is the capital of Spain",
    ]


def test_fragment_without_content_words_is_dropped() -> None:
    assert split_claims("It is. Einstein was born in 1879.") == ["Einstein was born in 1879"]


def test_trailing_abbreviation_keeps_its_dot() -> None:
    assert split_claims("Einstein moved to the U.S.") == ["Einstein moved to the U.S."]


def test_numbers_and_entities_are_kept_verbatim() -> None:
    text = "The city had 1,000,000 residents (45%) in 2020."
    assert split_claims(text) == ["The city had 1,000,000 residents (45%) in 2020"]


# --- split_claims: clauses -----------------------------------------------------------


def test_bare_and_never_splits() -> None:
    # "between home and the usual office" must stay one claim; only ", and" and ";" split
    text = "Commuting miles between home and the usual office are excluded."
    assert split_claims(text) == ["Commuting miles between home and the usual office are excluded"]


def test_comma_and_splits_two_independent_clauses() -> None:
    text = "Curie discovered polonium in 1898, and she won a second Nobel Prize in 1911."
    assert split_claims(text) == [
        "Curie discovered polonium in 1898",
        "she won a second Nobel Prize in 1911",
    ]


def test_semicolon_splits_clauses() -> None:
    assert split_claims("Einstein was born in Ulm; he died in Princeton.") == [
        "Einstein was born in Ulm",
        "he died in Princeton",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Tom and Jerry are cartoon characters",
        "He studied physics and mathematics at ETH Zurich",
        "Marie Curie discovered polonium and radium",
        "He visited Paris, London, Berlin, and Rome",
    ],
)
def test_and_does_not_split_when_a_side_is_too_short(text: str) -> None:
    assert split_claims(text) == [text]


# --- supporting_contexts -------------------------------------------------------------


def test_numbers_must_match() -> None:
    assert supporting_contexts("Einstein was born in 1879", ["Einstein was born in 1878"]) == []
    assert supporting_contexts("Einstein was born in 1879", ["Einstein was born in 1879"]) == [0]


def test_decimal_number_must_match_exactly() -> None:
    claim = "Inflation reached 3.5 percent"
    assert supporting_contexts(claim, ["Inflation reached 3.6 percent"]) == []
    assert supporting_contexts(claim, ["inflation reached 3.5 percent"]) == [0]


def test_number_with_commas_and_percentages_normalise() -> None:
    assert supporting_contexts("The town has 1,000 residents", ["town of 1000 residents"]) == [0]
    assert supporting_contexts("Sales grew by 45%", ["sales grew 45 percent"]) == [0]


def test_missing_number_rejects_even_with_full_word_overlap() -> None:
    contexts = ["Einstein won the Nobel Prize in Physics."]
    assert supporting_contexts("Einstein won the Nobel Prize in Physics in 1921", contexts) == []


def test_case_plural_and_possessive_are_normalised() -> None:
    claim = "Curie's Nobel Prizes honoured her discoveries"
    assert supporting_contexts(claim, ["CURIE NOBEL PRIZE HONOURED DISCOVERY"]) == [0]
    # Two-word claims need both words, so each normalisation must work on its own.
    assert supporting_contexts("Nobel prizes", ["the NOBEL PRIZE"]) == [0]
    assert supporting_contexts("prize winners", ["Prizes and a winner"]) == [0]
    assert supporting_contexts("many countries", ["many a country"]) == [0]
    assert supporting_contexts("Einstein's theory", ["theory of Einstein"]) == [0]
    assert supporting_contexts("the boss's office", ["office of the BOSS"]) == [0]


def test_double_s_words_are_not_depluralised() -> None:
    assert supporting_contexts("boss meeting", ["bos meeting"]) == []


def test_stopwords_alone_do_not_support() -> None:
    assert supporting_contexts("Einstein was born in 1879", ["it was in the 1879 of"]) == []


def test_threshold_fraction_of_content_words() -> None:
    assert SUPPORT_THRESHOLD == 0.6
    claim = "alpha bravo charlie delta echo"  # five content words
    assert supporting_contexts(claim, ["alpha bravo charlie"]) == [0]  # 3/5 = 0.6
    assert supporting_contexts(claim, ["alpha bravo"]) == []  # 2/5 = 0.4


def test_multiple_supporting_contexts_in_order() -> None:
    contexts = [
        "In 1879 Einstein was born.",
        "A recipe for bread.",
        "Albert Einstein was born in Ulm in 1879.",
    ]
    assert supporting_contexts("Einstein was born in 1879", contexts) == [0, 2]


def test_no_contexts_supports_nothing() -> None:
    assert supporting_contexts("Einstein was born in 1879", []) == []


# --- LexicalJudge (protocol v1 shapes) -----------------------------------------------


def test_identity() -> None:
    assert LexicalJudge.name == "local/lexical"
    assert LexicalJudge.prompt_version == "lexical-1"


def test_extract_claims_shape_and_zero_usage() -> None:
    reply = LexicalJudge().extract_claims(EINSTEIN)
    assert set(reply.data) == {"claims"}
    assert reply.data["claims"] == split_claims(EINSTEIN)
    assert reply.usage == Usage()
    assert reply.usage.llm_calls == 0


def test_extract_claims_empty_ground_truth() -> None:
    assert LexicalJudge().extract_claims("  ").data == {"claims": []}


def test_attribute_einstein_example() -> None:
    judge = LexicalJudge()
    claims = judge.extract_claims(EINSTEIN).data["claims"]
    assert len(claims) == 2

    reply = judge.attribute(claims, [ULM])

    assert set(reply.data) == {"verdicts"}
    assert reply.usage == Usage()
    first, second = reply.data["verdicts"]
    assert set(first) == VERDICT_KEYS and set(second) == VERDICT_KEYS
    assert first == {
        "claim_index": 0,
        "verdict": "yes",
        "context_indices": [0],
        "reason": "matched 3/3 content words in context 0",
    }
    assert second["claim_index"] == 1
    assert second["verdict"] == "no"
    assert second["context_indices"] == []
    assert second["reason"].startswith("no context contains:")
    assert "nobel" in second["reason"] and "1921" in second["reason"]


def test_attribute_one_verdict_per_claim_with_all_supporting_indices() -> None:
    claims = ["Einstein was born in 1879", "Paris is the capital of France", "bread recipe"]
    contexts = ["Paris is the capital of France.", "Einstein, born 1879.", "Born in 1879, Einstein"]
    verdicts = LexicalJudge().attribute(claims, contexts).data["verdicts"]
    assert [v["claim_index"] for v in verdicts] == [0, 1, 2]
    assert [v["verdict"] for v in verdicts] == ["yes", "yes", "no"]
    assert [v["context_indices"] for v in verdicts] == [[1, 2], [0], []]
    assert "context 1" in verdicts[0]["reason"] and "context 2" in verdicts[0]["reason"]


def test_attribute_reason_names_best_context_and_missing_number() -> None:
    contexts = ["Einstein was born in 1878", "the year 1879"]
    (verdict,) = LexicalJudge().attribute(["Einstein was born in 1879"], contexts).data["verdicts"]
    assert verdict["verdict"] == "no"
    assert verdict["reason"] == "best match is context 0 with 2/3 content words but it lacks 1879"


def test_attribute_without_contexts_says_no_to_every_claim() -> None:
    reply = LexicalJudge().attribute(["Einstein was born in 1879", "He won a prize"], [])
    assert [v["verdict"] for v in reply.data["verdicts"]] == ["no", "no"]
    assert all(v["context_indices"] == [] for v in reply.data["verdicts"])
    assert reply.data["verdicts"][0]["reason"] == "no context provided"
    assert reply.usage.llm_calls == 0


def test_attribute_without_claims() -> None:
    assert LexicalJudge().attribute([], [ULM]).data == {"verdicts": []}


def test_attribute_is_deterministic() -> None:
    judge = LexicalJudge()
    claims = split_claims(EINSTEIN)
    assert judge.attribute(claims, [ULM]).data == judge.attribute(claims, [ULM]).data
