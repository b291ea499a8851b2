"""The pure parts of the provider batch lane: request lines, input files within limits, result
lines matched by custom_id, and what each result means for its item (the online rules)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recallq.batch.requests import (
    UNANSWERED,
    Answer,
    InputFile,
    LineFailure,
    Request,
    answer_usage,
    carry_relevance,
    carry_verdicts,
    custom_id,
    decide,
    kept_relevance,
    kept_verdicts,
    line_id,
    parse_results,
    repair_carry,
    request_line,
    result_of,
)
from recallq.core.outcomes import Stage
from recallq.core.precision import Relevance
from recallq.core.scoring import Verdict
from recallq.judge import protocol
from recallq.judge.prices import Price
from recallq.pipeline import (
    AskAgain,
    AskAgainPassages,
    Claims,
    Failed,
    Relevant,
    Repair,
    ResendLater,
    Verdicts,
)

CLAIMS = ("Ada was born in 1815", "Ada wrote notes", "Ada liked tea")
CONTEXTS = ("Ada Lovelace was born in 1815.", "She wrote notes on the engine.")


GROUND_TRUTH = "Ada was born in 1815. She wrote notes."


def extraction(line: int = 7, **fields: Any) -> Request:
    return Request(line, Stage.EXTRACTION, ground_truth=GROUND_TRUTH, **fields)


def attribution(line: int = 8, **fields: Any) -> Request:
    return Request(line, Stage.ATTRIBUTION, claims=CLAIMS, contexts=CONTEXTS, **fields)


def answered(content: str | None, finish_reason: str = "stop") -> Answer:
    return Answer(content, finish_reason, prompt_tokens=100, completion_tokens=20)


def verdicts_answer(*indices: int) -> Answer:
    """Claim 0 supported by context 0, the others not."""
    verdicts = [
        {
            "claim_index": i,
            "verdict": "yes" if i == 0 else "no",
            "context_indices": [0] if i == 0 else [],
            "reason": f"r{i}",
        }
        for i in indices
    ]
    return answered(json.dumps({"verdicts": verdicts}))


# --- requests -------------------------------------------------------------------------------


def test_custom_ids_name_their_line_and_nothing_else() -> None:
    assert custom_id(42) == "rq-42"
    assert line_id("rq-42") == 42
    assert line_id("42") is None and line_id("rq-x") is None and line_id("other-1") is None


def test_a_request_line_carries_what_an_online_call_sends() -> None:
    params = {"model": "openai/judge", "api_key": "sk-secret", "max_tokens": 500, "api_base": "u"}
    line = request_line(extraction(), "judge", params)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = json.loads(line)
    assert record["custom_id"] == "rq-7"
    assert (record["method"], record["url"]) == ("POST", "/v1/chat/completions")
    assert record["body"] == {
        "model": "judge",
        "messages": protocol.extraction_messages(GROUND_TRUTH),
        "response_format": protocol.response_format(protocol.EXTRACTION),
        "temperature": 0,
        "max_tokens": 500,  # a body parameter of the models file; the key and base are not
    }


def test_an_attribution_request_asks_only_the_claims_it_names() -> None:
    body = json.loads(request_line(attribution(asked=(2,), reask=True), "judge", {}))["body"]
    assert body["messages"] == protocol.attribution_messages([CLAIMS[2]], list(CONTEXTS))
    assert body["response_format"]["json_schema"]["name"] == protocol.ATTRIBUTION
    full = json.loads(request_line(attribution(), "judge", {}))["body"]
    assert full["messages"] == protocol.attribution_messages(list(CLAIMS), list(CONTEXTS))


def test_a_repair_request_is_the_conversation_with_the_bad_answer_and_the_problem() -> None:
    repair = extraction(carry={"answer": '{"claims": [', "problem": "invalid JSON"})
    body = json.loads(request_line(repair, "judge", {}))["body"]
    base = protocol.extraction_messages(GROUND_TRUTH)
    assert body["messages"] == protocol.repair_messages(base, '{"claims": [', "invalid JSON")


def test_an_input_file_stays_within_both_limits() -> None:
    by_count = InputFile(max_requests=2, max_bytes=1000)
    assert by_count.add(1, b"a\n") and by_count.add(2, b"b\n")
    assert not by_count.add(3, b"c\n")
    assert (by_count.line_ids, by_count.content(), by_count.size) == ([1, 2], b"a\nb\n", 4)
    by_size = InputFile(max_requests=10, max_bytes=5)
    assert by_size.add(1, b"abc\n")
    assert not by_size.add(2, b"de\n")  # 4 + 3 bytes would be over
    assert by_size.add(3, b"f")  # 4 + 1 is not
    assert (by_size.line_ids, by_size.size) == ([1, 3], 5)


def test_an_input_file_never_exceeds_its_byte_limit() -> None:
    rng = random.Random(4)
    file = InputFile(max_requests=1000, max_bytes=300)
    taken = [n for n in range(200) if file.add(n, b"x" * rng.randint(1, 40) + b"\n")]
    assert file.size <= 300 and len(file.content()) == file.size
    assert file.line_ids == taken


# --- results --------------------------------------------------------------------------------


def result_line(custom: str, status: int, body: dict[str, Any], error: Any = None) -> str:
    response = {"status_code": status, "request_id": "req", "body": body}
    return json.dumps({"id": "b", "custom_id": custom, "response": response, "error": error})


def completion(content: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": {"content": content}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3},
    }


def test_results_are_matched_by_custom_id_whatever_their_order() -> None:
    lines = [result_line(f"rq-{n}", 200, completion(f'{{"claims": ["c{n}"]}}')) for n in range(50)]
    random.Random(1).shuffle(lines)
    results = parse_results(("\n".join(lines) + "\n").encode())
    assert sorted(results) == sorted(f"rq-{n}" for n in range(50))
    for n in range(50):
        answer = results[f"rq-{n}"]
        assert isinstance(answer, Answer)
        assert answer.content == f'{{"claims": ["c{n}"]}}'
        assert (answer.prompt_tokens, answer.completion_tokens) == (11, 3)


def test_lines_that_are_not_results_are_skipped_and_a_repeat_keeps_the_first() -> None:
    content = "\n".join(
        [
            "not json",
            json.dumps({"no": "custom_id"}),
            result_line("rq-1", 200, completion('{"claims": ["first"]}')),
            result_line("rq-1", 200, completion('{"claims": ["second"]}')),
            "",
        ]
    )
    results = parse_results(content)
    assert list(results) == ["rq-1"]
    assert isinstance(results["rq-1"], Answer) and "first" in (results["rq-1"].content or "")


@pytest.mark.parametrize(
    ("status", "transient"),
    [(500, True), (503, True), (429, True), (408, True), (400, False), (401, False), (404, False)],
)
def test_a_failed_line_is_transient_or_permanent_as_online(status: int, transient: bool) -> None:
    body = {"error": {"message": "The server had an error", "type": "x"}}
    result = result_of(json.loads(result_line("rq-1", status, body)))
    assert result == LineFailure(f"provider answered {status}: The server had an error", transient)


def test_a_line_with_only_an_error_object_goes_again() -> None:
    record = {
        "custom_id": "rq-1",
        "response": None,
        "error": {"code": "batch_expired", "message": "expired"},
    }
    assert result_of(record) == LineFailure("provider answered: expired", True)


# --- what a result means --------------------------------------------------------------------


def test_an_extraction_answer_gives_claims() -> None:
    decision = decide(extraction(), answered('{"claims": [" Ada was born in 1815 ", "", "x"]}'))
    assert decision == Claims(["Ada was born in 1815", "x"])  # as parse_answer cleans them


def test_a_malformed_answer_is_repaired_once_then_fails_the_item() -> None:
    first = decide(extraction(), answered('{"claims": ['))
    assert isinstance(first, Repair) and first.answer == '{"claims": ['
    assert first.problem.startswith("invalid JSON")
    again = extraction(carry=repair_carry(extraction(), first))
    assert again.is_repair
    second = decide(again, answered("still not json"))
    assert isinstance(second, Failed)
    assert second.error.startswith("claim_extraction: malformed answer after a repair request:")
    cut = decide(extraction(), answered('{"claims": ["a"]}', finish_reason="length"))
    assert isinstance(cut, Repair) and "cut off" in cut.problem


def test_attribution_with_every_verdict_scores() -> None:
    decision = decide(attribution(), verdicts_answer(0, 1, 2))
    assert isinstance(decision, Verdicts) and sorted(decision.verdicts) == [0, 1, 2]
    assert decision.verdicts[0] == Verdict(0, "yes", [0], "r0")


def test_claims_left_without_a_verdict_are_asked_again_once_keeping_the_others() -> None:
    first = decide(attribution(), verdicts_answer(0, 2, 7, 0))  # 7 out of range, 0 repeated
    assert isinstance(first, AskAgain) and first.missing == [1]
    assert sorted(first.verdicts) == [0, 2]
    reask = attribution(asked=(1,), reask=True, carry={"verdicts": carry_verdicts(first.verdicts)})
    # the re-ask asks claim 1 alone: the judge answers it as its index 0
    done = decide(reask, verdicts_answer(0))
    assert isinstance(done, Verdicts) and sorted(done.verdicts) == [0, 1, 2]
    assert done.verdicts[1].claim_index == 1 and done.verdicts[0] == first.verdicts[0]
    still = decide(reask, answered('{"verdicts": []}'))
    assert still == Failed("the judge gave no verdict for claim(s) 1, asked twice")


def test_a_repair_of_a_reask_keeps_the_verdicts_it_carries() -> None:
    kept = {"verdicts": carry_verdicts({0: Verdict(0, "yes", [1], "ok")})}
    reask = attribution(asked=(1, 2), reask=True, carry=kept)
    repair = decide(reask, answered("nope"))
    assert isinstance(repair, Repair)
    carry = repair_carry(reask, repair)
    assert kept_verdicts(carry) == {0: Verdict(0, "yes", [1], "ok")}
    assert carry["problem"] and carry["answer"] == "nope"


def test_failures_retry_or_fail_and_an_unanswered_request_goes_again() -> None:
    assert decide(extraction(), LineFailure("provider answered 500: x", True)) == ResendLater(
        "provider answered 500: x"
    )
    assert decide(extraction(), LineFailure("provider answered 400: bad", False)) == Failed(
        "provider answered 400: bad"
    )
    assert decide(attribution(), None) == ResendLater(UNANSWERED.error)


def test_an_answer_costs_its_tokens_at_the_batch_price() -> None:
    usage = answer_usage(answered("{}"), Price(1e-6, 4e-6))
    assert (usage.llm_calls, usage.call_attempts, usage.failed_calls) == (1, 1, 0)
    assert usage.cost_usd == pytest.approx(100 * 1e-6 + 20 * 4e-6)


# --- precision "judged": the relevance request ---------------------------------------------


def relevance(line: int = 9, **fields: Any) -> Request:
    return Request(
        line,
        Stage.RELEVANCE,
        ground_truth=GROUND_TRUTH,
        claims=CLAIMS,
        contexts=CONTEXTS,
        **fields,
    )


def relevance_answer(*indices: int) -> Answer:
    """Passage 0 relevant, the others not."""
    verdicts = [
        {"context_index": i, "verdict": "yes" if i == 0 else "no", "reason": f"p{i}"}
        for i in indices
    ]
    return answered(json.dumps({"verdicts": verdicts}))


def test_a_relevance_request_is_the_online_context_relevance_call() -> None:
    body = json.loads(request_line(relevance(), "judge", {}))["body"]
    passages = list(enumerate(CONTEXTS))
    assert body["messages"] == protocol.relevance_messages(GROUND_TRUTH, passages)
    assert body["response_format"] == protocol.response_format(protocol.RELEVANCE)
    reask = json.loads(request_line(relevance(asked=(1,), reask=True), "judge", {}))["body"]
    assert reask["messages"] == protocol.relevance_messages(GROUND_TRUTH, [(1, CONTEXTS[1])])


def test_passages_left_without_a_relevance_verdict_are_asked_again_once_then_fail() -> None:
    first = decide(relevance(), relevance_answer(0, 5))  # 5 out of range
    assert isinstance(first, AskAgainPassages) and first.missing == [1]
    assert first.relevance == {0: Relevance(0, True, "p0")}
    carry = {"verdicts": {}, "relevance": carry_relevance(first.relevance)}
    assert kept_relevance(carry) == first.relevance
    reask = relevance(asked=(1,), reask=True, carry=carry)
    done = decide(reask, relevance_answer(1))  # a passage keeps its own index in a re-ask
    assert isinstance(done, Relevant) and done.relevance[1] == Relevance(1, False, "p1")
    assert done.relevance[0] == first.relevance[0]
    still = decide(reask, answered('{"verdicts": []}'))
    assert still == Failed("the judge gave no relevance verdict for passage(s) 1, asked twice")


def test_a_repair_of_a_relevance_request_keeps_what_it_carries() -> None:
    carry = {
        "verdicts": carry_verdicts({0: Verdict(0, "yes", [0], "ok")}),
        "relevance": carry_relevance({0: Relevance(0, True, "p0")}),
    }
    request = relevance(asked=(1,), reask=True, carry=carry)
    repair = decide(request, answered("nope"))
    assert isinstance(repair, Repair)
    kept = repair_carry(request, repair)
    assert kept_verdicts(kept) == {0: Verdict(0, "yes", [0], "ok")}
    assert kept_relevance(kept) == {0: Relevance(0, True, "p0")}
    again = decide(relevance(asked=(1,), reask=True, carry=kept), answered("nope"))
    assert isinstance(again, Failed) and again.error.startswith("context_relevance: malformed")
