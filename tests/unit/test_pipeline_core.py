"""Every rule of the item pipeline (recallq.pipeline), one decision at a time: pure functions,
so these run in milliseconds. The drivers (online engine, batch lane) are tested elsewhere
applying them (tests/integration/test_batch_lane.py runs one table through both)."""

from __future__ import annotations

import pytest

from recallq import pipeline
from recallq.core import scoring
from recallq.core.errors import (
    MalformedAnswer,
    PermanentJudgeError,
    ProviderUnavailable,
    RateLimited,
)
from recallq.core.usage import Usage
from recallq.judge import protocol
from recallq.judge.base import PackedReply, Repair
from recallq.pipeline import AskAgain, Claims, Failed, ResendLater, Scored, Verdicts, Wait

CLAIMS = ["Ada was born in 1815", "Ada wrote notes", "Ada liked tea"]


def verdict(index: int, word: str = "yes", contexts: list[int] | None = None) -> dict:
    return {"claim_index": index, "verdict": word, "context_indices": contexts or [0]}


# --- before any call --------------------------------------------------------------------------


def test_no_ground_truth_scores_zero_without_a_call() -> None:
    assert pipeline.start(None) == Scored(scoring.no_ground_truth())


def test_a_ground_truth_goes_on_to_extraction() -> None:
    assert pipeline.start("Ada was born in 1815.") is None


def test_no_claims_scores_zero() -> None:
    assert pipeline.claims_found([]) == Scored(scoring.no_claims())


def test_claims_are_stored_as_found() -> None:
    assert pipeline.claims_found(("a", "b")) == Claims(["a", "b"])


def test_no_context_makes_every_claim_no_without_a_call() -> None:
    ended = pipeline.before_attribution(CLAIMS, [])
    assert ended == Scored(scoring.no_context(CLAIMS), scoring.no_context_verdicts(3))
    assert ended is not None and ended.verdicts is not None
    assert {v.verdict for v in ended.verdicts.values()} == {"no"}
    assert ended.outcome.claims_total == 3 and ended.outcome.score == 0


def test_a_context_goes_on_to_attribution() -> None:
    assert pipeline.before_attribution(CLAIMS, ["Ada Lovelace was born in 1815."]) is None


# --- malformed answers: repaired once -----------------------------------------------------------


def test_a_malformed_answer_is_repaired_once() -> None:
    first = pipeline.malformed(protocol.EXTRACTION, '{"claims": [', "invalid JSON", False)
    assert first == Repair('{"claims": [', "invalid JSON")
    second = pipeline.malformed(protocol.EXTRACTION, "nope", "still bad", True)
    assert second == Failed("claim_extraction: malformed answer after a repair request: still bad")


def test_a_malformed_answer_error_carries_what_the_repair_needs() -> None:
    exc = MalformedAnswer(protocol.ATTRIBUTION, "{", "invalid JSON", Usage(1, 10, 2))
    assert pipeline.malformed_answer(exc, repaired=False) == Repair("{", "invalid JSON")
    failed = pipeline.malformed_answer(exc, repaired=True)
    assert isinstance(failed, Failed) and failed.error.startswith("claim_attribution: malformed")


@pytest.mark.parametrize(
    ("content", "finish_reason", "problem"),
    [
        ('{"claims": [', "stop", "invalid JSON"),
        ('{"claims": ["a"]}', "length", "cut off"),
        ("", "stop", "empty"),
        ('{"verdicts": []}', "stop", 'expected an object with a "claims" list'),
    ],
)
def test_a_raw_answer_is_read_or_repaired_then_failed(
    content: str, finish_reason: str, problem: str
) -> None:
    first = pipeline.read_answer(protocol.EXTRACTION, content, finish_reason, repaired=False)
    assert isinstance(first, Repair) and problem in first.problem and first.answer == content
    second = pipeline.read_answer(protocol.EXTRACTION, content, finish_reason, repaired=True)
    assert isinstance(second, Failed) and problem in second.error


def test_an_answer_over_the_limits_is_never_repaired() -> None:
    limits = protocol.AnswerLimits(answer_bytes=10)
    content = '{"claims": ["a long claim"]}'
    for repaired in (False, True):
        found = pipeline.read_answer(protocol.EXTRACTION, content, "stop", repaired, limits)
        assert isinstance(found, Failed) and found.error.startswith("claim_extraction: ")
        assert "RECALLQ_JUDGE_MAX_ANSWER_BYTES" in found.error
    exc = MalformedAnswer(protocol.EXTRACTION, None, "too big", Usage(1), repairable=False)
    assert pipeline.malformed_answer(exc, repaired=False) == Failed("claim_extraction: too big")


def test_a_raw_answer_is_redacted() -> None:
    data = pipeline.read_answer(
        protocol.EXTRACTION,
        '{"claims": ["key sk-1"]}',
        "stop",
        False,
        redact=lambda t: t.replace("sk-1", "***"),
    )
    assert data == {"claims": ["key ***"]}


def test_a_well_formed_raw_answer_is_its_data() -> None:
    data = pipeline.read_answer(protocol.EXTRACTION, '{"claims": [" a ", ""]}', "stop", False)
    assert data == {"claims": ["a"]}


def test_a_packed_answer_is_never_repaired_its_items_fall_back_alone() -> None:
    assert pipeline.packed_claims_found(None) == {}  # malformed or refused: every item alone
    reply = PackedReply({0: ["a"], 2: ["c"]})  # item 1 left out: extracted alone
    assert pipeline.packed_claims_found(reply) == {0: ["a"], 2: ["c"]}


# --- verdicts: matched, asked again once ---------------------------------------------------------


def test_every_claim_with_a_verdict_scores() -> None:
    found = pipeline.verdicts_found(
        [verdict(0), verdict(1, "no"), verdict(2)], [0, 1, 2], 1, {}, False
    )
    assert isinstance(found, Verdicts) and sorted(found.verdicts) == [0, 1, 2]
    done = pipeline.scored(CLAIMS, found.verdicts, 1.0)
    assert done.outcome == scoring.score_claims(CLAIMS, found.verdicts, 1.0)
    assert done.outcome.score == 0.67 and done.verdicts == found.verdicts


def test_claims_left_without_a_verdict_are_asked_again_keeping_the_others() -> None:
    found = pipeline.verdicts_found(
        [verdict(0), verdict(7), verdict(0, "no")], [0, 1, 2], 1, {}, False
    )
    assert isinstance(found, AskAgain) and found.missing == [1, 2]
    assert list(found.verdicts) == [0] and found.verdicts[0].verdict == "yes"  # first one wins


def test_a_reask_numbers_its_claims_from_zero_and_merges_the_kept_verdicts() -> None:
    kept = {0: scoring.Verdict(0, "yes", [0], "kept")}
    found = pipeline.verdicts_found([verdict(0, "no"), verdict(1)], [1, 2], 1, kept, True)
    assert isinstance(found, Verdicts)
    assert found.verdicts[0].reason == "kept"
    assert (found.verdicts[1].claim_index, found.verdicts[1].verdict) == (1, "no")
    assert (found.verdicts[2].claim_index, found.verdicts[2].verdict) == (2, "yes")


def test_claims_still_without_a_verdict_after_the_reask_fail_the_item() -> None:
    found = pipeline.verdicts_found([verdict(0)], [1, 2], 1, {}, True)
    assert found == Failed("the judge gave no verdict for claim(s) 2, asked twice")


@pytest.mark.parametrize("raw", [None, "yes", {"claim_index": 0}, [[0, "yes"]]])
def test_an_unreadable_verdict_list_leaves_every_claim_to_ask_again(raw: object) -> None:
    found = pipeline.verdicts_found(raw, [0, 1], 1, {}, False)
    assert found == AskAgain([0, 1], {})


def test_context_indices_out_of_range_are_dropped() -> None:
    found = pipeline.verdicts_found([verdict(0, contexts=[0, 5, -1])], [0], 2, {}, False)
    assert isinstance(found, Verdicts) and found.verdicts[0].context_indices == [0]


# --- failures and the retry deadline (seconds) ---------------------------------------------------


def test_a_failed_line_retries_if_transient_else_fails() -> None:
    assert pipeline.line_failed("provider answered 503: x", True) == ResendLater(
        "provider answered 503: x"
    )
    assert pipeline.line_failed("provider answered 400: x", False) == Failed(
        "provider answered 400: x"
    )


def test_the_run_deadline_wins_over_the_setting() -> None:
    assert pipeline.retry_deadline_s(None, 600.0) == 600.0
    assert pipeline.retry_deadline_s(5.0, 600.0) == 5.0
    assert pipeline.retry_deadline_s(0.0, 600.0) == 0.0


def test_a_transient_failure_starts_waiting_now() -> None:
    assert pipeline.wait_or_give_up("503", None, 1000.0, 60.0) == Wait(1000.0, None)
    assert pipeline.wait_or_give_up("503", None, 1000.0, 60.0, 2.5) == Wait(1000.0, 2.5)


def test_waiting_keeps_its_start_until_the_deadline_then_fails() -> None:
    assert pipeline.wait_or_give_up("503", 1000.0, 1059.9, 60.0) == Wait(1000.0, None)
    assert pipeline.wait_or_give_up("503", 1000.0, 1060.0, 60.0) == Failed(
        "gave up after the run's retry deadline (60 s) passed: 503"
    )


def test_a_zero_deadline_fails_at_the_first_transient_failure() -> None:
    failed = pipeline.wait_or_give_up("timeouts", None, 1000.0, 0.0)
    assert failed == Failed("gave up after the run's retry deadline (0 s) passed: timeouts")


def test_an_online_error_that_is_not_worth_waiting_for_fails_with_its_message() -> None:
    error = PermanentJudgeError("BadRequestError: too long")
    assert pipeline.after_error(error, None, 1000.0, 60.0) == Failed("BadRequestError: too long")


def test_waiting_for_rate_limit_room_does_not_count_towards_the_deadline() -> None:
    error = RateLimited("m", 3.0)
    assert pipeline.after_error(error, None, 1000.0, 0.0) == Wait(None, 3.0)
    assert pipeline.after_error(error, 10.0, 1000.0, 60.0) == Wait(10.0, 3.0)  # kept as it was


def test_a_provider_incident_waits_within_the_deadline_then_fails() -> None:
    error = ProviderUnavailable("provider unavailable (503): 5 attempts failed", 30.0)
    assert pipeline.after_error(error, None, 1000.0, 60.0) == Wait(1000.0, 30.0)
    assert pipeline.after_error(error, 990.0, 1000.0, 60.0) == Wait(990.0, 30.0)
    failed = pipeline.after_error(error, 900.0, 1000.0, 60.0)
    assert isinstance(failed, Failed) and failed.error.endswith(str(error))
    assert failed.error.startswith("gave up after the run's retry deadline (60 s)")


def test_a_wait_ends_at_the_deadline_for_a_last_try() -> None:
    error = ProviderUnavailable("provider unavailable (503): 5 attempts failed", 30.0)
    assert pipeline.after_error(error, None, 1000.0, 3.0) == Wait(1000.0, 3.0)
    assert pipeline.after_error(error, 1000.0, 1002.5, 3.0) == Wait(1000.0, 0.5)
    assert pipeline.wait_or_give_up("503", 1000.0, 1001.0, 3.0) == Wait(1000.0, None)


def test_an_item_that_gives_up_reads_the_reason_not_the_last_calls_details() -> None:
    """Failures group by their error: a countdown or an attempt count in it would split
    one problem into many lines of a run's summary."""
    errors = [
        ProviderUnavailable(
            f"connection refused: calls to m paused, next probe in {n} s",
            float(n),
            reason="connection refused",
        )
        for n in (5, 6)
    ]
    given_up = {pipeline.after_error(e, 900.0, 1000.0, 60.0) for e in errors}
    assert given_up == {
        Failed("gave up after the run's retry deadline (60 s) passed: connection refused")
    }


# --- a packed call's usage ----------------------------------------------------------------------


def _total(shares: list[Usage]) -> Usage:
    total = Usage()
    for share in shares:
        total = total + share
    return total


def test_packed_usage_is_split_by_prompt_share_and_adds_up_exactly() -> None:
    usage = Usage(1, 1000, 101, 0.01, call_attempts=2, failed_calls=1)
    shares = pipeline.split_usage(usage, 3, [100, 300, 600])
    total = _total(shares)
    assert (total.llm_calls, total.prompt_tokens, total.completion_tokens) == (1, 1000, 101)
    assert (total.call_attempts, total.failed_calls) == (2, 1)
    assert total.cost_usd == pytest.approx(0.01, abs=1e-15)
    assert [s.prompt_tokens for s in shares] == [100, 300, 600]
    assert [s.llm_calls for s in shares] == [1, 0, 0]
    assert [s.completion_tokens for s in shares] == [10 + 1, 30, 60]  # rounding: the first
    assert shares[2].cost_usd == pytest.approx(0.006)


@pytest.mark.parametrize("weights", [None, [0, 0], [5, 5]])
def test_packed_usage_without_weights_is_split_evenly(weights: list[int] | None) -> None:
    shares = pipeline.split_usage(Usage(1, 11, 3, 0.0), 2, weights)
    assert [s.prompt_tokens for s in shares] == [6, 5]
    assert _total(shares).completion_tokens == 3


def test_an_item_inherits_the_earlier_items_claims_only_for_the_same_ground_truth() -> None:
    claims = ["Paris is in France", "It is the capital"]
    truth = "Paris is in France. It is the capital."
    assert pipeline.inherited_claims(truth, truth, claims) == claims
    assert pipeline.inherited_claims(truth, "Another ground truth.", claims) is None
    assert pipeline.inherited_claims(truth, truth, []) is None  # nothing to take: extract
    assert pipeline.inherited_claims(None, None, claims) is None
