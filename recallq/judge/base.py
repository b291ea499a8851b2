"""What every judge speaks: judge protocol v1 shapes (what calls used is recallq.core.usage, their
errors recallq.core.errors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from recallq.core.usage import NO_USAGE, Usage


@dataclass(frozen=True)
class JudgeReply:
    """A judge's parsed JSON answer (protocol v1 shape) and what it used."""

    data: dict[str, Any]
    usage: Usage = field(default=NO_USAGE)


@dataclass(frozen=True)
class PackedReply:
    """Claims of several ground truths extracted in one call, by their index in the call; an
    index the answer left out (or answered badly) is missing. `usage` is the whole call's."""

    claims: dict[int, list[str]]
    usage: Usage = field(default=NO_USAGE)


@dataclass(frozen=True)
class Repair:
    """A malformed answer and what was wrong with it: the call goes again once, as the
    conversation with that answer and an instruction to repair it."""

    answer: str | None
    problem: str


class Judge(Protocol):
    """Judge protocol v1. `run_id` names the run a call is made for (a cancelled run's calls
    are refused). Each method is one call (with its retries); `repair` makes it the repair
    request of an earlier malformed answer. A judge that calls a model raises MalformedAnswer
    for an answer not in the schema's shape.

    extract_claims: data {"ground_truth": str} -> {"claims": [str, ...]}
    extract_claims_packed: data {"ground_truths": [{"index", "text"}]}
                           -> {"items": [{"index", "claims": [str, ...]}]}
    attribute: data {"claims": [{"index", "text"}], "contexts": [{"index", "text"}]}
               -> {"verdicts": [{"claim_index", "verdict", "context_indices", "reason"}]}
    judge_relevance: data {"ground_truth": str, "contexts": [{"index", "text"}]}
               -> {"verdicts": [{"context_index", "verdict", "reason"}]}  (context_relevance)
    """

    name: str

    def extract_claims(
        self, ground_truth: str, run_id: str, repair: Repair | None = None
    ) -> JudgeReply: ...

    def extract_claims_packed(self, ground_truths: list[str], run_id: str) -> PackedReply: ...

    def attribute(
        self, claims: list[str], contexts: list[str], run_id: str, repair: Repair | None = None
    ) -> JudgeReply: ...

    def judge_relevance(
        self,
        ground_truth: str,
        contexts: list[tuple[int, str]],
        run_id: str,
        repair: Repair | None = None,
    ) -> JudgeReply:
        """`contexts`: the passages asked, each with its index in the item's context."""
        ...
