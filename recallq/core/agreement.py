"""How far to trust the judge: its agreement with human labels, and a corrected mean. Pure.

    labelled claims (judge verdict, human verdict), grouped by item
        -> confusion matrix, raw agreement, Cohen's kappa [95%], precision / recall on "yes"
    every scored item's judge score and claim counts + a random sample's labels
        -> prediction-powered (PPI) mean score and claim-level recall [95%]

The corrected estimate is the judge's estimate over every item plus the mean human-minus-judge
difference over the labelled random sample. Its interval accounts for both parts: the
sample's difference is bootstrapped over items (claims of one item share a ground truth and a
context, so they are not independent) and the all-items part adds its own normal error.
A claim of a sampled item that nobody labelled counts as the judge said (difference 0).

Samples are drawn among items with claims (recallq.labels.sampling): an item without claims has no
verdict a person could correct, so its difference is exactly 0, and the sample's mean
difference is scaled by the share of scored items that have claims.

Every bootstrap is seeded, so the same labels give the same numbers. The same statistics
compare two judges (`against`): the second judge's verdicts take the human's place.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from typing import Any

RESAMPLES = 2_000
# below this many labelled items of a sample a bootstrap interval says little (with one item
# the correction's spread is 0), so no corrected estimate is given
MIN_CORRECTED_ITEMS = 5
MAX_DISAGREEMENTS = 100  # claims listed where judge and person differ (the counts cover all)
Z95 = 1.959963984540054
_DECIMALS = 4
YES, NO = "yes", "no"


@dataclass(frozen=True)
class LabelledClaim:
    """One claim with two verdicts: the judge's and the reference's (a person, or a second
    judge when two runs are compared)."""

    index: int
    text: str
    judge: str  # "yes" | "no"
    human: str  # "yes" | "no"


@dataclass(frozen=True)
class LabelledItem:
    """An item with labels: its claim count and the judge's attributed count (the whole
    item), and the claims that carry a label."""

    key: str
    claims_total: int
    claims_attributed: int
    labels: Sequence[LabelledClaim]
    group: str | None = None


@dataclass(frozen=True)
class JudgeTotals:
    """What the judge says over every scored item (of a group): how many items, the sum and
    sum of squares of their scores, and the claims and attributed claims summed; plus the
    claim-level sums the ratio's error needs (sum of attributed², claims², attributed·claims
    per item), and how many of the items have claims."""

    items: int
    score_sum: float
    score_square_sum: float
    claims: int
    attributed: int
    attributed_square_sum: float = 0.0
    claims_square_sum: float = 0.0
    cross_sum: float = 0.0
    items_with_claims: int = 0


@dataclass(frozen=True)
class Confusion:
    judge_yes_human_yes: int = 0
    judge_yes_human_no: int = 0
    judge_no_human_yes: int = 0
    judge_no_human_no: int = 0

    @classmethod
    def of(cls, claims: Iterable[LabelledClaim]) -> Confusion:
        counts = [0, 0, 0, 0]
        for claim in claims:
            counts[(claim.judge != YES) * 2 + (claim.human != YES)] += 1
        return cls(*counts)

    def __add__(self, other: Confusion) -> Confusion:
        return Confusion(
            self.judge_yes_human_yes + other.judge_yes_human_yes,
            self.judge_yes_human_no + other.judge_yes_human_no,
            self.judge_no_human_yes + other.judge_no_human_yes,
            self.judge_no_human_no + other.judge_no_human_no,
        )

    @property
    def total(self) -> int:
        return (
            self.judge_yes_human_yes
            + self.judge_yes_human_no
            + self.judge_no_human_yes
            + self.judge_no_human_no
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "judge_yes_human_yes": self.judge_yes_human_yes,
            "judge_yes_human_no": self.judge_yes_human_no,
            "judge_no_human_yes": self.judge_no_human_yes,
            "judge_no_human_no": self.judge_no_human_no,
        }


def agreement(c: Confusion) -> float | None:
    """The share of claims where both verdicts are the same."""
    if not c.total:
        return None
    return (c.judge_yes_human_yes + c.judge_no_human_no) / c.total


def kappa(c: Confusion) -> float | None:
    """Cohen's kappa: agreement beyond what two raters with these yes rates reach by chance.
    Perfect agreement is 1 even when both say only one thing (chance would be 1 too)."""
    n = c.total
    if not n:
        return None
    observed = (c.judge_yes_human_yes + c.judge_no_human_no) / n
    judge_yes = (c.judge_yes_human_yes + c.judge_yes_human_no) / n
    human_yes = (c.judge_yes_human_yes + c.judge_no_human_yes) / n
    chance = judge_yes * human_yes + (1 - judge_yes) * (1 - human_yes)
    if observed == 1.0:
        return 1.0
    return (observed - chance) / (1 - chance)


def precision(c: Confusion) -> float | None:
    """Of the claims the judge calls supported, the share the person calls supported."""
    said_yes = c.judge_yes_human_yes + c.judge_yes_human_no
    return c.judge_yes_human_yes / said_yes if said_yes else None


def recall(c: Confusion) -> float | None:
    """Of the claims the person calls supported, the share the judge calls supported."""
    are_yes = c.judge_yes_human_yes + c.judge_no_human_yes
    return c.judge_yes_human_yes / are_yes if are_yes else None


def kappa_interval(
    items: Sequence[Sequence[LabelledClaim]], *, seed: int = 0, resamples: int = RESAMPLES
) -> list[float] | None:
    """Percentile bootstrap 95% interval of kappa, resampling items (clusters of claims)."""
    per_item = [astuple(Confusion.of(claims)) for claims in items if claims]
    if not per_item:
        return None
    rng = random.Random(seed)
    values: list[float] = []
    for _ in range(resamples):
        yy = yn = ny = nn = 0
        for a, b, c, d in rng.choices(per_item, k=len(per_item)):
            yy, yn, ny, nn = yy + a, yn + b, ny + c, nn + d
        value = kappa(Confusion(yy, yn, ny, nn))
        if value is not None:
            values.append(value)
    values.sort()
    return [_round(_quantile(values, 0.025)), _round(_quantile(values, 0.975))]


def summarise(
    items: Sequence[LabelledItem],
    *,
    seed: int = 0,
    disagreements: int = MAX_DISAGREEMENTS,
) -> dict[str, Any]:
    """Agreement of the judge with the labels: counts, agreement, kappa with its interval,
    the confusion matrix, precision and recall on "yes", and the claims where they differ."""
    labelled = [item for item in items if item.labels]
    confusion = Confusion()
    for item in labelled:
        confusion = confusion + Confusion.of(item.labels)
    differing = [
        {
            "item_id": item.key,
            "claim_index": claim.index,
            "claim": claim.text,
            "judge_verdict": claim.judge,
            "human_verdict": claim.human,
        }
        for item in labelled
        for claim in item.labels
        if claim.judge != claim.human
    ]
    return {
        "labelled_items": len(labelled),
        "labelled_claims": confusion.total,
        "agreement": _maybe_round(agreement(confusion)),
        "kappa": _maybe_round(kappa(confusion)),
        "kappa_ci95": kappa_interval([item.labels for item in labelled], seed=seed),
        "confusion": confusion.as_dict(),
        "precision": _maybe_round(precision(confusion)),
        "recall": _maybe_round(recall(confusion)),
        "disagreements": differing[:disagreements],
    }


@dataclass(frozen=True)
class Corrected:
    """A prediction-powered estimate: the judge's value, the correction, the corrected value
    and its 95% interval."""

    judge: float
    correction: float
    value: float
    ci95: tuple[float, float]


def corrected_mean_score(
    totals: JudgeTotals,
    sample: Sequence[LabelledItem],
    *,
    scale: float,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Corrected | None:
    """The run's mean score corrected by a random sample of items with claims.

    judge mean over all N items + (share of items with claims) x mean over the sample of
    (human score - judge score); None without a scored item or a labelled sampled item.
    """
    if totals.items <= 0 or not sample:
        return None
    judge_mean = totals.score_sum / totals.items
    judge_variance = max(0.0, totals.score_square_sum / totals.items - judge_mean**2)
    judge_error = math.sqrt(judge_variance / totals.items)
    differences = score_corrections(totals, sample, scale=scale)
    correction = math.fsum(differences) / len(differences)
    rng = random.Random(seed)
    draws = [
        rng.gauss(0.0, judge_error)
        + math.fsum(rng.choices(differences, k=len(differences))) / len(differences)
        for _ in range(resamples)
    ]
    return _corrected(judge_mean, correction, draws, upper=scale)


def corrected_claim_recall(
    totals: JudgeTotals,
    sample: Sequence[LabelledItem],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Corrected | None:
    """The run's claim-level recall (attributed claims / claims, over every item) corrected
    by a random sample: the judge's ratio + sum of (human - judge) yes over the sample's
    claims / the sample's claims. The judge ratio's error is the delta method's, with items
    as clusters."""
    sampled = [item for item in sample if item.claims_total > 0]
    if totals.claims <= 0 or not sampled:
        return None
    ratio = totals.attributed / totals.claims
    n = totals.items
    mean_claims = totals.claims / n
    # variance of (attributed_i - ratio * claims_i) over items, from the stored sums
    residual = (
        totals.attributed_square_sum
        - 2 * ratio * totals.cross_sum
        + ratio**2 * totals.claims_square_sum
    ) / n
    judge_error = math.sqrt(max(0.0, residual) / n) / mean_claims
    pairs = [(_yes_difference(item), item.claims_total) for item in sampled]
    correction = sum(d for d, _ in pairs) / sum(c for _, c in pairs)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        chosen = rng.choices(pairs, k=len(pairs))
        draws.append(
            rng.gauss(0.0, judge_error) + sum(d for d, _ in chosen) / sum(c for _, c in chosen)
        )
    return _corrected(ratio, correction, draws, upper=1.0)


def corrected(
    totals: JudgeTotals,
    sample: Sequence[LabelledItem],
    *,
    scale: float,
    seed: int = 0,
) -> dict[str, Any] | None:
    """The contract's `corrected` object, or None when nothing can be corrected (fewer than
    MIN_CORRECTED_ITEMS labelled items of the sample)."""
    if len(sample) < MIN_CORRECTED_ITEMS:
        return None
    score = corrected_mean_score(totals, sample, scale=scale, seed=seed)
    claims = corrected_claim_recall(totals, sample, seed=seed)
    if score is None or claims is None:
        return None
    return {
        "judge_mean_score": _round(score.judge),
        "mean_score": _round(score.value),
        "mean_score_ci95": [_round(v) for v in score.ci95],
        "judge_claim_recall": _round(claims.judge),
        "claim_recall": _round(claims.value),
        "claim_recall_ci95": [_round(v) for v in claims.ci95],
        "labelled_items": len(sample),
        "method": "ppi",
    }


def score_corrections(
    totals: JudgeTotals, sample: Sequence[LabelledItem], *, scale: float
) -> list[float]:
    """Each sampled item's term of the mean score's correction (corrected_mean_score)."""
    share = totals.items_with_claims / totals.items if totals.items_with_claims else 1.0
    return [share * _score_difference(item, scale) for item in sample]


def corrected_difference(
    judge_difference: float,
    judge_error: float,
    base: Sequence[float],
    candidate: Sequence[float],
    *,
    scale: float,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Any] | None:
    """Candidate minus base mean score, both corrected by their own random sample: the judge's
    paired difference (with its standard error `judge_error`) + the candidate's mean
    correction - the base's (`score_corrections` of each sample). The interval draws the
    judge part from its normal and bootstraps each sample's items apart (the samples are
    drawn independently). None with fewer than MIN_CORRECTED_ITEMS items in either."""
    if min(len(base), len(candidate)) < MIN_CORRECTED_ITEMS:
        return None
    correction = math.fsum(candidate) / len(candidate) - math.fsum(base) / len(base)
    rng = random.Random(seed)
    draws = sorted(
        rng.gauss(0.0, judge_error)
        + math.fsum(rng.choices(candidate, k=len(candidate))) / len(candidate)
        - math.fsum(rng.choices(base, k=len(base))) / len(base)
        for _ in range(resamples)
    )
    value = max(-scale, min(scale, judge_difference + correction))
    low = max(-scale, judge_difference + _quantile(draws, 0.025))
    high = min(scale, judge_difference + _quantile(draws, 0.975))
    return {
        "judge_mean_difference": _round(judge_difference),
        "mean_difference": _round(value),
        "ci95": [_round(low), _round(high)],
        "labelled_items": {"base": len(base), "candidate": len(candidate)},
        "method": "ppi",
    }


def judge_interval(totals: JudgeTotals, *, scale: float) -> tuple[float, float] | None:
    """The judge-only normal 95% interval of the mean score (what the run page shows)."""
    if totals.items <= 0:
        return None
    mean = totals.score_sum / totals.items
    spread = math.sqrt(max(0.0, totals.score_square_sum / totals.items - mean**2))
    half = Z95 * spread / math.sqrt(totals.items)
    return max(0.0, mean - half), min(scale, mean + half)


def flip_rate(items: Sequence[LabelledItem], *, seed: int = 0) -> dict[str, Any]:
    """The share of claims whose verdict differs between the two verdicts, with a percentile
    bootstrap interval over items (the ratio of flipped to compared claims)."""
    pairs = [
        (sum(c.judge != c.human for c in item.labels), len(item.labels))
        for item in items
        if item.labels
    ]
    claims = sum(n for _, n in pairs)
    if not claims:
        return {"claims": 0, "flipped": 0, "rate": None, "rate_ci95": None}
    flipped = sum(f for f, _ in pairs)
    rng = random.Random(seed)
    draws = []
    for _ in range(RESAMPLES):
        chosen = rng.choices(pairs, k=len(pairs))
        draws.append(sum(f for f, _ in chosen) / sum(n for _, n in chosen))
    draws.sort()
    return {
        "claims": claims,
        "flipped": flipped,
        "rate": _round(flipped / claims),
        "rate_ci95": [_round(_quantile(draws, 0.025)), _round(_quantile(draws, 0.975))],
    }


# --- parts -----------------------------------------------------------------------------------


def _score_difference(item: LabelledItem, scale: float) -> float:
    if item.claims_total <= 0:
        return 0.0
    return _yes_difference(item) / item.claims_total * scale


def _yes_difference(item: LabelledItem) -> int:
    """Human yes minus judge yes over the item's labelled claims."""
    return sum((c.human == YES) - (c.judge == YES) for c in item.labels)


def _corrected(judge: float, correction: float, draws: list[float], *, upper: float) -> Corrected:
    draws.sort()
    low = judge + _quantile(draws, 0.025)
    high = judge + _quantile(draws, 0.975)
    value = judge + correction
    return Corrected(
        judge, correction, min(upper, max(0.0, value)), (max(0.0, low), min(upper, high))
    )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _round(value: float) -> float:
    return round(value, _DECIMALS) + 0.0


def _maybe_round(value: float | None) -> float | None:
    return None if value is None else _round(value)
