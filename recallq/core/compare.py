"""Comparing two runs over the same items (an A/B test of retrievers): pure maths, no I/O.

Items pair by key (the item id). A pair counts when both runs scored it; the comparison is
about the paired differences ``candidate - base``, because the items are the same and the
per-item difference removes the items' own difficulty from the noise.

The 95% interval of the mean difference is a paired percentile bootstrap (resampling pairs,
``BOOTSTRAP_RESAMPLES`` times, seeded so a comparison reads the same every time). Above
``BOOTSTRAP_MAX_PAIRS`` pairs it is the normal interval ``mean ± 1.96·sd/√n`` instead: the
bootstrap distribution of a mean converges to that normal, and with thousands of pairs the two
differ in the third decimal while the bootstrap costs about 0.1 s of pure Python per thousand
pairs (the API answers a comparison while the caller waits).

The statistics (:func:`summarise`) read a :class:`Pairing`: how many items paired, the scored
pairs counted by (base score, candidate score), every scored pair only when the bootstrap
needs them, the largest changes and the flipped claims. :func:`pair` builds it from items in
memory; recallq.runs.comparisons builds the same from the database, where a 100k-item comparison
moves a few hundred rows instead of every item and claim.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from recallq.core.groups import MISSING_GROUP, group_value
from recallq.core.scoring import validate_scale

BOOTSTRAP_RESAMPLES = 2_000
BOOTSTRAP_MAX_PAIRS = 5_000
# Scores are rounded to 2 decimals of the scale; anything within this of zero is no change
# (float noise such as 0.67 - 0.33 - 0.34), anything beyond it is a real step.
TOLERANCE_PER_SCALE = 1e-9
__all__ = [
    "BOOTSTRAP_MAX_PAIRS",
    "MISSING_GROUP",
    "Change",
    "ItemScores",
    "Pairing",
    "ScoredPairs",
    "bootstrap_interval",
    "compare",
    "even_positions",
    "flipped_claims",
    "group_name",
    "mean_interval",
    "normal_interval",
    "pair",
    "summarise",
    "tolerance",
]
_Z95 = 1.959963984540054
_DECIMALS = 4

Claims = Sequence[tuple[str, str]]  # (text, "yes" | "no") of an item's attributed claims


@dataclass(frozen=True)
class ItemScores:
    """One item of one run, as the comparison needs it. `claims` are its attributed claims as
    (text, verdict) in order, or a mapping of text to verdict."""

    key: str
    score: float | None  # None: the item was not scored (failed, cancelled, pending)
    claims: Claims | Mapping[str, str] = ()
    metadata: dict[str, Any] | None = None

    def claim_verdicts(self) -> Claims:
        claims = self.claims
        return list(claims.items()) if isinstance(claims, Mapping) else claims


@dataclass(frozen=True)
class ScoredPairs:
    """`count` pairs scored in both runs with these scores (and, by a metadata field, this
    group)."""

    base: float
    candidate: float
    count: int
    group: str | None = None


@dataclass(frozen=True)
class Change:
    """A pair among the largest changes, with the claims whose verdict flipped."""

    key: str
    base: float
    candidate: float
    flipped: list[dict[str, str]]


@dataclass(frozen=True)
class Pairing:
    """Two runs' items paired by key: what the statistics read."""

    base_only: int
    candidate_only: int
    unscored: int  # in both runs, not scored in at least one
    scores: Sequence[ScoredPairs]  # the pairs scored in both, counted by their scores
    # every scored pair as (key, base, candidate) in key order when there are at most
    # BOOTSTRAP_MAX_PAIRS (the bootstrap resamples them in that order), else None
    keyed: Sequence[tuple[str, float, float]] | None
    largest: Sequence[Change]  # the `top` changed pairs by |difference|, ties by key
    claims_flipped: dict[str, int]  # over every scored pair


def tolerance(scale: float) -> float:
    """A difference within this of zero is no change."""
    return TOLERANCE_PER_SCALE * scale


def compare(
    base: Iterable[ItemScores],
    candidate: Iterable[ItemScores],
    *,
    scale: float,
    seed: int = 0,
    top: int = 10,
    by: str | None = None,
) -> dict[str, Any]:
    """Compare a candidate run with a base run (the contract's ``/v1/compare`` body).

    Returns ``matched``, ``unmatched`` (``base_only``, ``candidate_only``, and ``unscored``:
    in both runs but not scored in at least one), ``base_mean``, ``candidate_mean``,
    ``mean_difference`` (candidate - base), ``ci95`` ([low, high] of the mean difference),
    ``improved`` / ``regressed`` / ``unchanged`` counts, ``largest_changes`` (the ``top``
    changed pairs by absolute difference, with the claims whose verdict flipped),
    ``claims_flipped`` (over every scored pair: claims of the same text whose verdict went
    ``no_to_yes`` or ``yes_to_no``) and, when ``by`` names a metadata field, ``by_group``.
    Means and the interval are rounded to 4 decimals; they are ``None`` when nothing matched.

    Pairs are ordered by key before resampling, so the seeded result depends on the items,
    not on the order they arrive in.
    """
    scale = validate_scale(scale)
    pairing = pair(base, candidate, scale=scale, top=top, by=by)
    return summarise(pairing, scale=scale, seed=seed, by_group=by is not None)


def pair(
    base: Iterable[ItemScores],
    candidate: Iterable[ItemScores],
    *,
    scale: float,
    top: int = 10,
    by: str | None = None,
) -> Pairing:
    """Items in memory paired by key (what recallq.runs.comparisons asks the database for)."""
    if top < 0:
        raise ValueError("top must be 0 or more")
    base_items, candidate_items = _by_key(base, "base"), _by_key(candidate, "candidate")
    pairs: list[tuple[ItemScores, ItemScores]] = []
    unscored = 0
    for key in sorted(base_items.keys() & candidate_items.keys()):
        both = base_items[key], candidate_items[key]
        if both[0].score is None or both[1].score is None:
            unscored += 1
        else:
            pairs.append(both)
    counted = Counter(
        (_score(b), _score(c), None if by is None else group_name(b.metadata, c.metadata, by))
        for b, c in pairs
    )
    limit = tolerance(scale)
    changed = [(b, c) for b, c in pairs if abs(_score(c) - _score(b)) > limit]
    largest = heapq.nsmallest(
        top, changed, key=lambda p: (-abs(_score(p[1]) - _score(p[0])), p[0].key)
    )
    return Pairing(
        base_only=len(base_items.keys() - candidate_items.keys()),
        candidate_only=len(candidate_items.keys() - base_items.keys()),
        unscored=unscored,
        scores=[ScoredPairs(b, c, n, g) for (b, c, g), n in counted.items()],
        keyed=(
            [(b.key, _score(b), _score(c)) for b, c in pairs]
            if len(pairs) <= BOOTSTRAP_MAX_PAIRS
            else None
        ),
        largest=[
            Change(
                b.key, _score(b), _score(c), flipped_claims(b.claim_verdicts(), c.claim_verdicts())
            )
            for b, c in largest
        ],
        claims_flipped=_flip_counts((b.claim_verdicts(), c.claim_verdicts()) for b, c in pairs),
    )


def summarise(
    pairing: Pairing, *, scale: float, seed: int = 0, by_group: bool = False
) -> dict[str, Any]:
    """The comparison's body (see :func:`compare`) from a pairing."""
    scale = validate_scale(scale)
    differences = Counter[float]()
    for scored in pairing.scores:
        differences[scored.candidate - scored.base] += scored.count
    matched = sum(differences.values())
    limit = tolerance(scale)
    result: dict[str, Any] = {
        "matched": matched,
        "unmatched": {
            "base_only": pairing.base_only,
            "candidate_only": pairing.candidate_only,
            "unscored": pairing.unscored,
        },
        **_means(pairing.scores),
        "ci95": _rounded_interval(pairing, differences, seed),
        "improved": sum(n for d, n in differences.items() if d > limit),
        "regressed": sum(n for d, n in differences.items() if d < -limit),
        "unchanged": sum(n for d, n in differences.items() if abs(d) <= limit),
        "largest_changes": [
            {
                "key": change.key,
                "base": change.base,
                "candidate": change.candidate,
                "difference": _round(change.candidate - change.base),
                "flipped": change.flipped,
            }
            for change in pairing.largest
        ],
        "claims_flipped": dict(pairing.claims_flipped),
    }
    if by_group:
        result["by_group"] = _by_group(pairing.scores)
    return result


def bootstrap_interval(
    differences: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the mean of ``differences`` (not rounded)."""
    if not differences:
        raise ValueError("no differences to resample")
    rng, n = random.Random(seed), len(differences)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    return _quantile(means, 0.025), _quantile(means, 0.975)


def normal_interval(differences: Sequence[float] | Mapping[float, int]) -> tuple[float, float]:
    """Normal 95% interval of the mean: ``mean ± 1.96·sd/√n`` (not rounded), of the
    differences or of each difference counted (computed exactly, then rounded once).

    ``sd`` divides by n, not n - 1: that is the spread the bootstrap resamples from, so this is
    the interval the bootstrap converges to.
    """
    counted = differences if isinstance(differences, Mapping) else Counter(differences)
    n = sum(counted.values())
    if not n:
        raise ValueError("no differences")
    exact_mean = sum(Fraction(d) * count for d, count in counted.items()) / n
    squares = sum((Fraction(d) - exact_mean) ** 2 * count for d, count in counted.items())
    mean = float(exact_mean)
    half = _half_width(math.sqrt(squares / n), n)
    return mean - half, mean + half


def mean_interval(
    count: int, mean: float | None, mean_square: float | None, scale: float
) -> list[float] | None:
    """Normal 95% interval of a run's mean score from its moments (what one aggregate query
    reads: the count, the mean and the mean of the squared scores), within [0, scale] and
    rounded to 4 decimals; None when nothing was scored. Same spread convention as
    normal_interval."""
    if count <= 0 or mean is None or mean_square is None:
        return None
    spread = math.sqrt(max(0.0, mean_square - mean * mean))  # rounding can dip below zero
    half = _half_width(spread, count)
    return [_round(max(0.0, mean - half)), _round(min(scale, mean + half))]


def _half_width(spread: float, n: int) -> float:
    return _Z95 * spread / math.sqrt(n)


def even_positions(total: int, limit: int) -> list[int]:
    """Positions of an even sample of at most `limit` of `total` ordered things."""
    if total <= limit:
        return list(range(total))
    step = total / limit
    return [int(i * step) for i in range(limit)]


def flipped_claims(base: Claims, candidate: Claims) -> list[dict[str, str]]:
    """Claims of the same text in both items whose verdict differs, in the base's order (a
    text an item has twice pairs with each claim of that text in the other)."""
    verdicts: dict[str, list[str]] = defaultdict(list)
    for text, verdict in candidate:
        verdicts[text].append(verdict)
    return [
        {"claim": text, "base": verdict, "candidate": other}
        for text, verdict in base
        for other in verdicts.get(text, ())
        if other != verdict
    ]


def _flip_counts(pairs: Iterable[tuple[Claims, Claims]]) -> dict[str, int]:
    """Flipped claims over these pairs of items: ``no_to_yes`` and ``yes_to_no``."""
    counts = {"no_to_yes": 0, "yes_to_no": 0}
    for base, candidate in pairs:
        for flip in flipped_claims(base, candidate):
            if flip["base"] == "no" and flip["candidate"] == "yes":
                counts["no_to_yes"] += 1
            elif flip["base"] == "yes" and flip["candidate"] == "no":
                counts["yes_to_no"] += 1
    return counts


def group_name(base: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None, by: str) -> str:
    """A pair's group: the base item's metadata value (the candidate's when the base has
    none), as recallq.core.groups names groups."""
    for metadata in (base, candidate):
        value = group_value(metadata, by)
        if value is not None:
            return value
    return MISSING_GROUP


# --- parts -----------------------------------------------------------------------------------


def _by_key(items: Iterable[ItemScores], run: str) -> dict[str, ItemScores]:
    found: dict[str, ItemScores] = {}
    for item in items:
        if item.key in found:
            raise ValueError(f"{run} run has item {item.key!r} twice")
        found[item.key] = item
    return found


def _score(item: ItemScores) -> float:
    assert item.score is not None  # only scored items are paired
    return item.score


def _round(value: float) -> float:
    return round(value, _DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def _means(scores: Iterable[ScoredPairs]) -> dict[str, float | None]:
    base: list[float] = []
    candidate: list[float] = []
    for scored in scores:
        base.extend([scored.base] * scored.count)
        candidate.extend([scored.candidate] * scored.count)
    if not base:
        return {"base_mean": None, "candidate_mean": None, "mean_difference": None}
    base_mean = math.fsum(base) / len(base)
    candidate_mean = math.fsum(candidate) / len(candidate)
    return {
        "base_mean": _round(base_mean),
        "candidate_mean": _round(candidate_mean),
        "mean_difference": _round(candidate_mean - base_mean),
    }


def _rounded_interval(
    pairing: Pairing, differences: Mapping[float, int], seed: int
) -> list[float] | None:
    if not differences:
        return None
    if pairing.keyed is None:
        low, high = normal_interval(differences)
    else:
        ordered = sorted(pairing.keyed)
        low, high = bootstrap_interval([c - b for _, b, c in ordered], seed=seed)
    return [_round(low), _round(high)]


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _by_group(scores: Iterable[ScoredPairs]) -> dict[str, Any]:
    groups: dict[str, list[ScoredPairs]] = defaultdict(list)
    for scored in scores:
        groups[MISSING_GROUP if scored.group is None else scored.group].append(scored)
    return {
        name: {"matched": sum(s.count for s in members), **_means(members)}
        for name, members in sorted(groups.items())
    }
