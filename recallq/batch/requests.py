"""The pure parts of the provider batch lane: request lines out, result lines in. No I/O.

    Request ──request_line()──► one JSONL line of an input file (InputFile keeps the limits)
    output / error file ──parse_results()──► {custom_id: Answer | LineFailure}
    a request and its result ──decide()──► what happens to the item next

A run with precision `judged` makes a third request per item with a context, after attribution:
the context_relevance request (stage `relevance`), whose line carries the item's attribution
verdicts, so the item is scored when its relevance answer is applied.

It also says what a batch answer used (at recallq.judge.prices' batch price); what the lane needs of
a provider is recallq.batch.provider.

`decide` applies the pipeline's rules (recallq.pipeline), the online engine's too, to one
answer, so a batch-mode run scores exactly as an online one. What an online call does twice in
a row, the lane does in two batches: the repair request or the re-ask is a new request in a
later batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recallq import pipeline
from recallq.batch.provider import ENDPOINT, is_transient
from recallq.core import precision as precision_rules
from recallq.core import scoring
from recallq.core.outcomes import Stage
from recallq.core.usage import Usage
from recallq.judge import protocol
from recallq.judge.base import Repair
from recallq.judge.prices import Price
from recallq.pipeline import (
    AskAgain,
    AskAgainPassages,
    Claims,
    Failed,
    Relevant,
    ResendLater,
    Verdicts,
)

CUSTOM_ID_PREFIX = "rq-"
#: Body parameters of a models file entry's litellm_params that a batch request carries, as
#: an online call does (the rest configure the connection or the price).
BODY_PARAMS = ("max_tokens", "max_completion_tokens", "top_p", "seed", "reasoning_effort")


SCHEMA = {
    Stage.EXTRACTION: protocol.EXTRACTION,
    Stage.ATTRIBUTION: protocol.ATTRIBUTION,
    Stage.RELEVANCE: protocol.RELEVANCE,
}


def custom_id(line_id: int) -> str:
    """The custom_id of a request line: its row id, which no other request ever has."""
    return f"{CUSTOM_ID_PREFIX}{line_id}"


def line_id(custom: str) -> int | None:
    """The request line a custom_id names, or None for one the lane did not make."""
    number = custom.removeprefix(CUSTOM_ID_PREFIX)
    if number == custom or not number.isdigit():
        return None
    return int(number)


# --- requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request as its line stores it, with the item data it needs.

    `asked` are the claim indices an attribution asks, the passage indices a relevance
    request asks (None: all); `reask` says it asks again for claims (passages) an earlier
    answer left without a verdict; `carry` holds what it carries over from earlier requests:
    `verdicts` a re-ask keeps (a relevance request: the item's attribution verdicts, every
    one), `relevance` the passage verdicts a relevance re-ask keeps, and for a repair request
    the malformed `answer` and the `problem` with it."""

    line_id: int
    stage: Stage
    ground_truth: str | None = None
    claims: tuple[str, ...] = ()
    contexts: tuple[str, ...] = ()
    asked: tuple[int, ...] | None = None
    reask: bool = False
    carry: dict[str, Any] | None = None

    @property
    def is_repair(self) -> bool:
        return bool(self.carry) and "problem" in (self.carry or {})

    def asked_indices(self) -> list[int]:
        every = self.contexts if self.stage == Stage.RELEVANCE else self.claims
        return list(range(len(every))) if self.asked is None else list(self.asked)

    def messages(self) -> list[dict[str, str]]:
        """The chat messages an online call would send for this request."""
        if self.stage == Stage.EXTRACTION:
            assert self.ground_truth is not None
            messages = protocol.extraction_messages(self.ground_truth)
        elif self.stage == Stage.RELEVANCE:
            assert self.ground_truth is not None
            passages = [(i, self.contexts[i]) for i in self.asked_indices()]
            messages = protocol.relevance_messages(self.ground_truth, passages)
        else:
            asked = [self.claims[i] for i in self.asked_indices()]
            messages = protocol.attribution_messages(asked, list(self.contexts))
        if self.is_repair:
            carry = self.carry or {}
            messages = protocol.repair_messages(messages, carry.get("answer"), carry["problem"])
        return messages


def request_body(request: Request, model: str, params: dict[str, Any]) -> dict[str, Any]:
    """The chat-completion body: what recallq.judge.llm sends online for the same request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages(),
        "response_format": protocol.response_format(SCHEMA[request.stage]),
        "temperature": 0,
    }
    body.update({key: params[key] for key in BODY_PARAMS if key in params})
    return body


def request_line(request: Request, model: str, params: dict[str, Any]) -> bytes:
    """One line of a batch input file (OpenAI's format), newline included."""
    line = {
        "custom_id": custom_id(request.line_id),
        "method": "POST",
        "url": ENDPOINT,
        "body": request_body(request, model, params),
    }
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@dataclass
class InputFile:
    """Lines of one batch input file, within the provider's limits."""

    max_requests: int
    max_bytes: int
    line_ids: list[int] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, line_id: int, line: bytes) -> bool:
        """Take the line if the file stays within both limits; False (not taken) if not."""
        if len(self.line_ids) >= self.max_requests or self.size + len(line) > self.max_bytes:
            return False
        self.line_ids.append(line_id)
        self.chunks.append(line)
        self.size += len(line)
        return True

    def content(self) -> bytes:
        return b"".join(self.chunks)


# --- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A request the provider answered (HTTP 200): what the model said and what it used."""

    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class LineFailure:
    """A request the provider did not answer: transient ones (429, 5xx, an expired or
    cancelled batch) go again in a later batch; permanent ones fail the item."""

    error: str
    transient: bool


LineResult = Answer | LineFailure

#: What a request of a batch that ended without answering it gets (expired, cancelled, failed).
UNANSWERED = LineFailure("the provider's batch ended without answering this request", True)


def parse_results(content: bytes | str) -> dict[str, LineResult]:
    """The results of an output or error file by custom_id. Lines that are not results (not
    JSON, no custom_id) are skipped; a custom_id seen twice keeps its first result."""
    results: dict[str, LineResult] = {}
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    for raw in text.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("custom_id"), str):
            continue
        results.setdefault(record["custom_id"], result_of(record))
    return results


def result_of(record: dict[str, Any]) -> LineResult:
    """One result line: `{"custom_id", "response": {"status_code", "body"}, "error"}`."""
    response = record.get("response") if isinstance(record.get("response"), dict) else None
    status = response.get("status_code") if response else None
    body = response.get("body") if response else None
    status = status if isinstance(status, int) else None
    if status == 200 and isinstance(body, dict):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message") or {}
            usage = body.get("usage") or {}
            return Answer(
                message.get("content") if isinstance(message, dict) else None,
                choices[0].get("finish_reason"),
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
            )
        return LineFailure("the provider answered 200 without a choice", True)
    error = _error_message(body) or _error_message(record) or "no message"
    code = f" {status}" if status is not None else ""
    return LineFailure(f"provider answered{code}: {error}", is_transient(status))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _error_message(holder: Any) -> str | None:
    error = holder.get("error") if isinstance(holder, dict) else None
    if isinstance(error, dict):
        message = error.get("message") or error.get("code")
        return str(message)[:300] if message else None
    return str(error)[:300] if error else None


# --- what an answer means for its item -------------------------------------------------------


def decide(
    request: Request,
    result: LineResult | None,
    limits: protocol.AnswerLimits = protocol.DEFAULT_LIMITS,
    redact: protocol.Redact | None = None,
) -> Claims | Verdicts | AskAgain | Relevant | AskAgainPassages | Repair | Failed | ResendLater:
    """What a request's result means for its item (None: the batch did not answer it), by
    the pipeline's rules (recallq.pipeline), as online: within the answer limits, with
    secrets out of the answer (`redact`)."""
    if result is None:
        result = UNANSWERED
    if isinstance(result, LineFailure):
        return pipeline.line_failed(result.error, result.transient)
    schema = SCHEMA[request.stage]
    data = pipeline.read_answer(
        schema, result.content, result.finish_reason, request.is_repair, limits, redact
    )
    if not isinstance(data, dict):
        return data
    if request.stage == Stage.EXTRACTION:
        return Claims(list(data["claims"]))
    if request.stage == Stage.RELEVANCE:
        return pipeline.relevance_found(
            data.get("verdicts"),
            request.asked_indices(),
            len(request.contexts),
            kept_relevance(request.carry),
            request.reask,
        )
    return pipeline.verdicts_found(
        data.get("verdicts"),
        request.asked_indices(),
        len(request.contexts),
        kept_verdicts(request.carry),
        request.reask,
    )


def answer_usage(answer: Answer, price: Price) -> Usage:
    """What one answered request used, at the batch price."""
    cost = price.cost(answer.prompt_tokens, answer.completion_tokens)
    return Usage(1, answer.prompt_tokens, answer.completion_tokens, cost, 1, 0)


#: What a request the provider did not answer counts: sent, and failed.
FAILED_REQUEST = Usage(call_attempts=1, failed_calls=1)


# --- what a line carries over -----------------------------------------------------------------


def carry_verdicts(verdicts: dict[int, scoring.Verdict]) -> dict[str, Any]:
    """Verdicts as a line's `carry` stores them (JSON: string keys)."""
    return {
        str(index): {
            "verdict": verdict.verdict,
            "context_indices": list(verdict.context_indices),
            "reason": verdict.reason,
        }
        for index, verdict in verdicts.items()
    }


def kept_verdicts(carry: dict[str, Any] | None) -> dict[int, scoring.Verdict]:
    """The verdicts a line carries over from an earlier answer."""
    stored = (carry or {}).get("verdicts") or {}
    return {
        int(index): scoring.Verdict(
            int(index), v["verdict"], list(v.get("context_indices") or []), v.get("reason", "")
        )
        for index, v in stored.items()
    }


def carry_relevance(relevance: dict[int, precision_rules.Relevance]) -> dict[str, Any]:
    """Passage verdicts as a relevance line's `carry` stores them (JSON: string keys)."""
    return {
        str(index): {"relevant": verdict.relevant, "reason": verdict.reason}
        for index, verdict in relevance.items()
    }


def kept_relevance(carry: dict[str, Any] | None) -> dict[int, precision_rules.Relevance]:
    """The passage verdicts a relevance line carries over from an earlier answer."""
    stored = (carry or {}).get("relevance") or {}
    return {
        int(index): precision_rules.Relevance(int(index), bool(v["relevant"]), v.get("reason", ""))
        for index, v in stored.items()
    }


def repair_carry(request: Request, repair: Repair) -> dict[str, Any]:
    """What the repair request of `request` carries: what it carried over (kept verdicts),
    the bad answer and what was wrong with it."""
    kept = {
        key: value
        for key, value in (request.carry or {}).items()
        if key not in ("answer", "problem") and value
    }
    return kept | {"answer": repair.answer, "problem": repair.problem}
