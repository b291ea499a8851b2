"""The item pipeline's rules: from what is known about an item and the answer or error just
received, to what happens to the item next. Pure: no I/O, no clock, no model call.

    start(ground truth)              no ground truth ─► Scored (0, no call)
    inherited_claims (submission)    a `claims_from` run's item: its claims, stored with the
                                     new item, so no extraction call is made │ extracted
    claims_found(claims)             none ─► Scored (0) │ Claims: store them, attribute next
    before_attribution(claims, ctx)  no context ─► Scored (every claim "no", no call)
    read_answer / malformed          a malformed answer ─► Repair (once) ─► Failed; one
                                     over the answer limits ─► Failed (never repaired)
    packed_claims_found              a packed answer's items that it leaves out (all of them,
                                     if malformed) are extracted alone
    verdicts_found(answer, asked)    Verdicts (score) │ AskAgain (once, the claims left
                                     without one) │ Failed
    scored(claims, verdicts, ...)    Scored, with `cited` context precision from the verdicts
    relevance_found(answer, asked)   precision "judged": Relevant (every passage has a
                                     verdict) │ AskAgainPassages (once) │ Failed
    line_failed / after_error        ResendLater │ Failed; ResendLater ─► wait_or_give_up
                                     ─► Wait │ Failed
                                     (the run's retry deadline, in seconds)

Two drivers apply these decisions: the online engine (recallq.execution.engine) one call after the
other, the provider batch lane (recallq.batch.lane, recallq.batch.requests) one batch after
the other. The score and its reason are recallq.core.scoring's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recallq.core import precision as precision_rules
from recallq.core import scoring
from recallq.core.errors import JudgeError, MalformedAnswer, TryLater
from recallq.core.usage import Usage
from recallq.judge import protocol
from recallq.judge.base import PackedReply, Repair

__all__ = [
    "AskAgain",
    "AskAgainPassages",
    "Claims",
    "Decision",
    "Failed",
    "Relevant",
    "Repair",
    "ResendLater",
    "Scored",
    "Verdicts",
    "Wait",
]


# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claims:
    """Extraction answered: the item's claims (to store, then attribute; see claims_found)."""

    claims: list[str]


@dataclass(frozen=True)
class Scored:
    """The item ends with this outcome without another call; `verdicts`, when given, are
    stored with it."""

    outcome: scoring.Outcome
    verdicts: dict[int, scoring.Verdict] | None = None
    precision: precision_rules.Precision | None = None


@dataclass(frozen=True)
class Verdicts:
    """Attribution answered: a verdict for every claim (the item can be scored)."""

    verdicts: dict[int, scoring.Verdict]


@dataclass(frozen=True)
class AskAgain:
    """Claims left without a verdict: asked again once, keeping the verdicts given."""

    missing: list[int]
    verdicts: dict[int, scoring.Verdict]


@dataclass(frozen=True)
class Relevant:
    """A context_relevance answer: a verdict for every passage."""

    relevance: dict[int, precision_rules.Relevance]


@dataclass(frozen=True)
class AskAgainPassages:
    """Passages left without a relevance verdict: asked again once, keeping those given."""

    missing: list[int]
    relevance: dict[int, precision_rules.Relevance]


@dataclass(frozen=True)
class Failed:
    """The item fails with this error (and no further request)."""

    error: str


@dataclass(frozen=True)
class ResendLater:
    """A transient failure: the same request goes again later (see wait_or_give_up)."""

    error: str


@dataclass(frozen=True)
class Wait:
    """The item waits and the same request goes again: after `delay_s` seconds (None: at the
    driver's next chance, a later batch). `since_s` (unix seconds) is when the item started
    waiting out a provider problem, the start of its retry deadline; None when this wait does
    not count towards it."""

    since_s: float | None
    delay_s: float | None = None


Decision = (
    Claims
    | Scored
    | Verdicts
    | AskAgain
    | Relevant
    | AskAgainPassages
    | Repair
    | Failed
    | ResendLater
    | Wait
)


# --- what users read --------------------------------------------------------------------------


def no_verdict_error(missing: Sequence[int]) -> str:
    return f"the judge gave no verdict for claim(s) {', '.join(map(str, missing))}, asked twice"


def malformed_error(schema: str, problem: str) -> str:
    return f"{schema}: malformed answer after a repair request: {problem}"


def too_large_error(schema: str, problem: str) -> str:
    return f"{schema}: {problem}"


def deadline_error(deadline_s: float, error: str) -> str:
    return f"gave up after the run's retry deadline ({deadline_s:g} s) passed: {error}"


# --- before any call --------------------------------------------------------------------------


def start(ground_truth: str | None) -> Scored | None:
    """An item with no ground truth scores 0 without a call; None: extract its claims."""
    return Scored(scoring.no_ground_truth()) if ground_truth is None else None


def inherited_claims(
    ground_truth: str | None, earlier_ground_truth: str | None, earlier_claims: Sequence[str]
) -> list[str] | None:
    """A run with `claims_from`: an item takes the claims of the earlier run's item of the same
    id when that one has claims and the same ground truth (claims depend only on it); None:
    the item's claims are extracted as usual (no such item, no claims, another ground truth)."""
    if ground_truth is None or not earlier_claims or earlier_ground_truth != ground_truth:
        return None
    return list(earlier_claims)


def claims_found(claims: Sequence[str]) -> Claims | Scored:
    """Claims known (answered or from the claim cache): none scores 0, else store them."""
    return Claims(list(claims)) if claims else Scored(scoring.no_claims())


def before_attribution(claims: Sequence[str], contexts: Sequence[str]) -> Scored | None:
    """With no context every claim is "no" and no call is made; None: attribute."""
    if contexts:
        return None
    return Scored(scoring.no_context(list(claims)), scoring.no_context_verdicts(len(claims)))


# --- answers --------------------------------------------------------------------------------


def malformed(
    schema: str, answer: str | None, problem: str, repaired: bool, repairable: bool = True
) -> Repair | Failed:
    """A malformed answer is repaired once: asked again with the answer and the problem. One
    over the answer limits (not `repairable`) is never: the item fails with the problem."""
    if not repairable:
        return Failed(too_large_error(schema, problem))
    return Failed(malformed_error(schema, problem)) if repaired else Repair(answer, problem)


def malformed_answer(exc: MalformedAnswer, repaired: bool) -> Repair | Failed:
    return malformed(exc.schema, exc.answer, exc.problem, repaired, exc.repairable)


def read_answer(
    schema: str,
    content: str | None,
    finish_reason: str | None,
    repaired: bool,
    limits: protocol.AnswerLimits = protocol.DEFAULT_LIMITS,
    redact: protocol.Redact | None = None,
) -> dict[str, Any] | Repair | Failed:
    """A raw answer (a batch result line) in the schema's shape, within the answer limits and
    with secrets out of it (`redact`), or what its malformation means for the item."""
    try:
        return protocol.parse_answer(schema, content, finish_reason, limits, redact)
    except protocol.AnswerTooLarge as too_large:
        return malformed(schema, None, str(too_large), repaired, repairable=False)
    except protocol.ProtocolError as problem:
        return malformed(schema, content, str(problem), repaired)


def packed_claims_found(reply: PackedReply | None) -> dict[int, list[str]]:
    """Claims by index in the pack. A packed answer is never repaired: an item it leaves out,
    and every item of a malformed or refused one (None), is extracted alone."""
    return {} if reply is None else reply.claims


def verdicts_found(
    raw: Any,
    asked: Sequence[int],
    n_contexts: int,
    kept: dict[int, scoring.Verdict],
    reask: bool,
) -> Verdicts | AskAgain | Failed:
    """An attribution answer's verdicts, for the claims at `asked` (the answer numbers them
    0.., in that order), with those `kept` from an earlier answer. Claims left without one
    are asked again once (`reask`: this was that second asking)."""
    matched, missing_at = scoring.match_verdicts(raw, len(asked), n_contexts)
    verdicts = kept | {
        asked[j]: scoring.Verdict(asked[j], v.verdict, v.context_indices, v.reason)
        for j, v in matched.items()
    }
    missing = [asked[j] for j in missing_at]
    if not missing:
        return Verdicts(verdicts)
    if reask:
        return Failed(no_verdict_error(missing))
    return AskAgain(missing, verdicts)


def split_usage(usage: Usage, parts: int, weights: Sequence[int] | None = None) -> list[Usage]:
    """A packed call's usage as `parts` shares that add up to it exactly, each item's in
    proportion to its `weight` (its share of the prompt: the length of its ground truth;
    evenly without weights). The first share carries the call itself (llm_calls, attempts)
    and the tokens left by rounding down, so a run's totals count every call once. Every
    share is extraction's: the drivers book it under the stage of the call."""
    weights = [max(0, w) for w in weights] if weights is not None else [1] * parts
    total = sum(weights)
    if total == 0:
        weights, total = [1] * parts, parts
    prompts = [usage.prompt_tokens * w // total for w in weights]
    completions = [usage.completion_tokens * w // total for w in weights]
    costs = [usage.cost_usd * w / total for w in weights]
    prompts[0] += usage.prompt_tokens - sum(prompts)
    completions[0] += usage.completion_tokens - sum(completions)
    costs[0] = usage.cost_usd - sum(costs[1:])
    shares = [Usage(0, p, c, cost) for p, c, cost in zip(prompts, completions, costs, strict=True)]
    shares[0] = Usage(
        usage.llm_calls,
        prompts[0],
        completions[0],
        costs[0],
        usage.call_attempts,
        usage.failed_calls,
    )
    return shares


def scored(
    claims: Sequence[str],
    verdicts: dict[int, scoring.Verdict],
    scale: float,
    n_contexts: int = 0,
    precision: str = precision_rules.PrecisionMode.OFF,
) -> Scored:
    """The item's score and, for a run with precision `cited`, its context precision from the
    passages the verdicts cite (`judged` adds it after its own call: see judged_precision)."""
    cited = (
        precision_rules.cited(verdicts, n_contexts, scale)
        if precision == precision_rules.PrecisionMode.CITED
        else None
    )
    return Scored(scoring.score_claims(list(claims), verdicts, scale), verdicts, cited)


def needs_relevance(precision: str, n_contexts: int) -> bool:
    """Whether an item makes a context_relevance call: precision `judged`, with a context."""
    return precision == precision_rules.PrecisionMode.JUDGED and n_contexts > 0


def relevance_found(
    raw: Any,
    asked: Sequence[int],
    n_contexts: int,
    kept: dict[int, precision_rules.Relevance],
    reask: bool,
) -> Relevant | AskAgainPassages | Failed:
    """A context_relevance answer's verdicts for the passages at `asked` (sent with their own
    indices), with those `kept` from an earlier answer. Passages left without one are asked
    again once (`reask`: this was that second asking), then the item fails naming them."""
    matched, _ = precision_rules.match_relevance(raw, n_contexts)
    relevance = kept | {i: matched[i] for i in asked if i in matched}
    missing = [i for i in asked if i not in relevance]
    if not missing:
        return Relevant(relevance)
    if reask:
        return Failed(precision_rules.no_relevance_error(missing))
    return AskAgainPassages(missing, relevance)


def judged_precision(
    done: Scored, relevance: dict[int, precision_rules.Relevance], n_contexts: int, scale: float
) -> Scored:
    """A scored item with its `judged` context precision."""
    verdicts = done.verdicts or {}
    judged = precision_rules.judged(relevance, verdicts, n_contexts, scale)
    return Scored(done.outcome, done.verdicts, judged)


# --- failures -------------------------------------------------------------------------------


def line_failed(error: str, transient: bool) -> ResendLater | Failed:
    """A request the provider did not answer: transient ones go again, others fail."""
    return ResendLater(error) if transient else Failed(error)


def retry_deadline_s(run_deadline_s: float | None, default_s: float) -> float:
    """How long an item may wait out a provider problem: its run's deadline, else the
    setting."""
    return default_s if run_deadline_s is None else run_deadline_s


def wait_or_give_up(
    error: str,
    waiting_since_s: float | None,
    now_s: float,
    deadline_s: float,
    delay_s: float | None = None,
) -> Wait | Failed:
    """A transient failure waits and goes again, until the run's retry deadline has passed
    since the item started waiting (now, if it was not waiting); then the item fails. A
    wait ends at the deadline at the latest: the item has its last try then, instead of
    waiting past it only to give up."""
    since = now_s if waiting_since_s is None else waiting_since_s
    left = since + deadline_s - now_s
    if left <= 0:
        return Failed(deadline_error(deadline_s, error))
    return Wait(since, delay_s if delay_s is None else min(delay_s, left))


def after_error(
    exc: JudgeError, waiting_since_s: float | None, now_s: float, deadline_s: float
) -> Wait | Failed:
    """An online call that failed. One that cannot succeed now (TryLater) waits its delay:
    rate-limit room that is sure to come, outside the deadline; a provider incident, within
    it; an item that gives up reads its reason. Any other error fails the item with its
    message."""
    if not isinstance(exc, TryLater):
        return Failed(str(exc))
    if not exc.counts_towards_deadline:
        return Wait(waiting_since_s, exc.delay)
    return wait_or_give_up(exc.reason, waiting_since_s, now_s, deadline_s, exc.delay)
