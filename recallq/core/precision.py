"""The pure rules of context precision: which passages of an item are relevant to its ground
truth, and how well the retriever ranked them. No I/O, no model calls.

- `average_precision`: Σ_k precision@k · rel_k / R over the passages in retrieved order, × scale.
  No epsilon: every relevant passage first scores exactly `scale`; no relevant passage, 0.
- `cited`: relevance from the attribution verdicts (a passage a "yes" claim cites).
- `judged`: relevance from a `context_relevance` answer (`match_relevance`).
- ids: `id_precision` / `id_recall` from `retrieved_context_ids` / `reference_context_ids`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from recallq.core.scoring import Verdict, normalise_verdict


class PrecisionMode(StrEnum):
    """How a run knows which passages are relevant (the run field `precision`)."""

    #: from the attribution verdicts' context_indices: no call beyond recall's
    CITED = "cited"
    #: one context_relevance call per item with a context
    JUDGED = "judged"
    #: no context precision
    OFF = "off"


DEFAULT_MODE = PrecisionMode.CITED
MODE_ERROR = 'precision must be "cited", "judged" or "off"'


def validate_mode(value: Any) -> PrecisionMode:
    """A run's `precision` field: None is the default (`cited`). ValueError otherwise."""
    if value is None:
        return DEFAULT_MODE
    if not isinstance(value, str) or value not in tuple(PrecisionMode):
        raise ValueError(MODE_ERROR)
    return PrecisionMode(value)


@dataclass(frozen=True)
class Passage:
    """One passage's relevance: its index (0-based, in retrieved order), the claims of the
    ground truth it supports (a "yes" verdict cites it) and, judged, the judge's reason."""

    index: int
    relevant: bool
    claims: list[int]
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "relevant": self.relevant,
            "claims": list(self.claims),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Precision:
    """An item's context precision: the score (× scale, rounded to 4 decimals), each passage,
    and the rank (1-based) of the first relevant one (None: no relevant passage)."""

    context_precision: float
    passages: list[Passage]
    first_relevant_rank: int | None
    mode: str = PrecisionMode.CITED

    def passages_json(self) -> list[dict[str, Any]]:
        return [p.as_json() for p in self.passages]


def average_precision(relevant: Sequence[bool], scale: float = 1.0) -> float:
    """Σ_k (relevant in 1..k / k) · rel_k / R, × scale; 0 when R = 0. Exact: a ranking with
    every relevant passage first sums k/k terms, so it is exactly `scale`. Duplicated passages
    count at each rank (the caller gives one flag per rank)."""
    hits = 0
    total = 0.0
    for k, rel in enumerate(relevant, start=1):
        if rel:
            hits += 1
            total += hits / k
    if hits == 0:
        return 0.0
    if total == hits:  # every relevant passage first: exactly the scale, whatever the floats
        return float(scale)
    return round(total / hits * scale, 4)


def first_relevant_rank(relevant: Sequence[bool]) -> int | None:
    return next((k for k, rel in enumerate(relevant, start=1) if rel), None)


def _of(passages: list[Passage], scale: float, mode: str) -> Precision:
    flags = [p.relevant for p in passages]
    return Precision(
        average_precision(flags, scale), passages, first_relevant_rank(flags), PrecisionMode(mode)
    )


def supporting_claims(verdicts: Mapping[int, Verdict], n_contexts: int) -> list[list[int]]:
    """For each passage, the claims judged "yes" that cite it (sorted)."""
    claims: list[list[int]] = [[] for _ in range(n_contexts)]
    for index in sorted(verdicts):
        verdict = verdicts[index]
        if verdict.verdict != "yes":
            continue
        for c in verdict.context_indices:
            if 0 <= c < n_contexts and index not in claims[c]:
                claims[c].append(index)
    return claims


def cited(verdicts: Mapping[int, Verdict], n_contexts: int, scale: float) -> Precision | None:
    """`cited` precision: a passage is relevant when a "yes" claim cites it. None with no
    context (the item counts as no_context, never as 0)."""
    if n_contexts <= 0:
        return None
    claims = supporting_claims(verdicts, n_contexts)
    passages = [Passage(i, bool(claims[i]), claims[i]) for i in range(n_contexts)]
    return _of(passages, scale, PrecisionMode.CITED)


@dataclass(frozen=True)
class Relevance:
    """One passage's verdict in a context_relevance answer."""

    context_index: int
    relevant: bool
    reason: str


def match_relevance(raw: Any, n_contexts: int) -> tuple[dict[int, Relevance], list[int]]:
    """Tie a context_relevance answer's verdicts to passages by context_index. Out-of-range,
    duplicate (first wins) and unreadable verdicts are ignored. Returns the verdict per
    passage and the passages left without one."""
    matched: dict[int, Relevance] = {}
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict):
            continue
        index = entry.get("context_index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        verdict = normalise_verdict(entry.get("verdict"))
        if not 0 <= index < n_contexts or index in matched or verdict is None:
            continue
        reason = entry.get("reason")
        matched[index] = Relevance(
            index, verdict == "yes", reason if isinstance(reason, str) else ""
        )
    return matched, [i for i in range(n_contexts) if i not in matched]


def judged(
    relevance: Mapping[int, Relevance],
    verdicts: Mapping[int, Verdict],
    n_contexts: int,
    scale: float,
) -> Precision | None:
    """`judged` precision: relevance from the judge's context_relevance verdicts (one per
    passage), with the claims that cite each passage from attribution."""
    if n_contexts <= 0:
        return None
    claims = supporting_claims(verdicts, n_contexts)
    passages = [
        Passage(i, relevance[i].relevant, claims[i], relevance[i].reason) for i in range(n_contexts)
    ]
    return _of(passages, scale, PrecisionMode.JUDGED)


def no_relevance_error(missing: Sequence[int]) -> str:
    return (
        f"the judge gave no relevance verdict for passage(s) {', '.join(map(str, missing))}, "
        "asked twice"
    )


# --- ids (no call) ---------------------------------------------------------------------------

RETRIEVED_IDS = "retrieved_context_ids"
REFERENCE_IDS = "reference_context_ids"


def _ids(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"{name} must be a list of ids (strings or integers)")
    return [str(v) for v in value]


def id_scores(retrieved: Any, reference: Any, scale: float) -> tuple[float | None, float | None]:
    """`id_precision` (average precision over the retrieved order, relevance = a reference id)
    and `id_recall` (share of reference ids retrieved), × scale. None for each without ids
    to compute it from (both without a reference id, precision without a retrieved one):
    never NaN. ValueError for ids that are not a list of ids."""
    got, want = _ids(retrieved, RETRIEVED_IDS), _ids(reference, REFERENCE_IDS)
    if got is None or want is None:
        return None, None
    wanted = set(want)
    if not wanted:
        # nothing is relevant without a reference id: like no ground truth, null (never a 0
        # that would count the retriever wrong for an item it could not get right)
        return None, None
    # no retrieved id is like no context: precision null, recall 0 (every reference missed)
    precision = average_precision([i in wanted for i in got], scale) if got else None
    found = wanted & set(got)
    recall = float(scale) if found == wanted else round(len(found) / len(wanted) * scale, 4)
    return precision, recall


# --- comparing two runs ----------------------------------------------------------------------


def compare(pairs: Sequence[tuple[str, float, float]], top: int = 10) -> dict[str, Any]:
    """Context precision of two runs' items paired by id (`(key, base, candidate)` of the
    pairs with a precision in both): `paired`, the means, the mean difference with its normal
    95% interval, and the `largest_changes` (`{id, base, candidate, difference}`, largest first).
    Nulls when no pair has a precision in both."""
    from recallq.core.compare import normal_interval

    if not pairs:
        return {
            "paired": 0,
            "base_mean": None,
            "candidate_mean": None,
            "mean_difference": None,
            "ci95": None,
            "largest_changes": [],
        }
    n = len(pairs)
    base = math.fsum(b for _, b, _ in pairs) / n
    candidate = math.fsum(c for _, _, c in pairs) / n
    low, high = normal_interval([c - b for _, b, c in pairs])
    changed = sorted(
        (p for p in pairs if abs(p[2] - p[1]) > 1e-9), key=lambda p: (-abs(p[2] - p[1]), p[0])
    )
    return {
        "paired": n,
        "base_mean": _round4(base),
        "candidate_mean": _round4(candidate),
        "mean_difference": _round4(candidate - base),
        "ci95": [_round4(low), _round4(high)],
        "largest_changes": [
            {"id": key, "base": b, "candidate": c, "difference": _round4(c - b)}
            for key, b, c in changed[:top]
        ],
    }


def _round4(value: float) -> float:
    return round(value, 4) + 0.0
