"""The pure rules of context recall: no I/O, no model calls."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("yes", "no")


@dataclass(frozen=True)
class Verdict:
    claim_index: int
    verdict: str  # "yes" | "no"
    context_indices: list[int] = field(default_factory=list)
    reason: str = ""


@dataclass(frozen=True)
class Outcome:
    """What an item scored: the score is rounded; the counts are exact."""

    score: float
    claims_total: int
    claims_attributed: int
    reason: str


def ground_truth_text(value: Any) -> str | None:
    """Missing, null or blank -> None; a non-string ground truth is serialised as JSON text."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if text.strip() else None


#: A run's scale, as submitted: scores are reported to 2 decimals, so a smaller scale rounds
#: every score to 0 (5e-324 was accepted once); a larger one is no scale anyone means (and
#: 1.7e308 broke every sum over scores).
MIN_SCALE = 0.01
MAX_SCALE = 1_000_000.0


def validate_scale(scale: Any) -> float:
    """A finite scale above 0 (what scoring needs: stored runs are read with this)."""
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise ValueError("scale must be a number")
    try:
        value = float(scale)
    except OverflowError as exc:
        raise ValueError("scale is too large") from exc
    if not math.isfinite(value) or value <= 0:
        raise ValueError("scale must be a finite number greater than 0")
    return value


def submitted_scale(scale: Any) -> float:
    """The scale of a new run: from MIN_SCALE to MAX_SCALE."""
    value = validate_scale(scale)
    if not MIN_SCALE <= value <= MAX_SCALE:
        raise ValueError(f"scale must be from {MIN_SCALE:g} to {MAX_SCALE:g}")
    return value


def normalise_verdict(value: Any) -> str | None:
    """'Yes', ' yes ', 'yes.' -> 'yes'; anything that is not yes or no -> None."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, str):
        return None
    word = re.sub(r"[^a-z]", "", value.lower())
    return word if word in VERDICTS else None


def _context_indices(value: Any, n_contexts: int) -> list[int]:
    if not isinstance(value, list):
        return []
    found = {i for i in value if isinstance(i, int) and not isinstance(i, bool)}
    return sorted(i for i in found if 0 <= i < n_contexts)


def match_verdicts(
    raw: Any, n_claims: int, n_contexts: int
) -> tuple[dict[int, Verdict], list[int]]:
    """Tie the judge's verdicts to claims by claim_index.

    Out-of-range, duplicate (first one wins) and unreadable verdicts are ignored. Returns the
    verdict per claim index and the indices of claims left without one.
    """
    matched: dict[int, Verdict] = {}
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict):
            continue
        index = entry.get("claim_index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        verdict = normalise_verdict(entry.get("verdict"))
        if not 0 <= index < n_claims or index in matched or verdict is None:
            continue
        indices = _context_indices(entry.get("context_indices"), n_contexts)
        reason = entry.get("reason")
        matched[index] = Verdict(index, verdict, indices, reason if isinstance(reason, str) else "")
    missing = [i for i in range(n_claims) if i not in matched]
    return matched, missing


def recall_score(attributed: int, total: int, scale: float) -> float:
    if total <= 0:
        return 0.0
    return round(min(attributed, total) / total * scale, 2)


def format_score(score: float) -> str:
    """As reported: two decimals, without trailing zeros (1, 0.5, 0.67)."""
    return f"{score:.2f}".rstrip("0").rstrip(".")


def _quote(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return f'"{text if len(text) <= limit else text[: limit - 1] + "…"}"'


def score_claims(claims: list[str], verdicts: dict[int, Verdict], scale: float) -> Outcome:
    """Score claims that all have a verdict, and explain it without another model call."""
    supported = [i for i in range(len(claims)) if verdicts[i].verdict == "yes"]
    missing = [i for i in range(len(claims)) if verdicts[i].verdict != "yes"]
    score = recall_score(len(supported), len(claims), scale)
    parts = [
        f"The score is {format_score(score)} because {len(supported)} of {len(claims)} claims "
        "are supported by the context"
    ]
    if supported:
        parts.append(
            ": "
            + "; ".join(
                f"{_quote(claims[i])} (context {', '.join(map(str, verdicts[i].context_indices))})"
                if verdicts[i].context_indices
                else _quote(claims[i])
                for i in supported
            )
        )
    if missing:
        parts.append("; missing: " + "; ".join(_quote(claims[i]) for i in missing))
    return Outcome(score, len(claims), len(supported), "".join(parts) + ".")


def no_ground_truth() -> Outcome:
    return Outcome(0.0, 0, 0, "The score is 0 because the item has no ground truth to check.")


def no_claims() -> Outcome:
    return Outcome(
        0.0, 0, 0, "The score is 0 because no claims could be extracted from the ground truth."
    )


def no_context_verdicts(n_claims: int) -> dict[int, Verdict]:
    return {i: Verdict(i, "no", [], "no context was retrieved") for i in range(n_claims)}


def no_context(claims: list[str]) -> Outcome:
    return Outcome(
        0.0,
        len(claims),
        0,
        f"The score is 0 because no context was retrieved: none of the {len(claims)} "
        "claims can be supported.",
    )
