"""recallq.core.agreement: known values, and the corrected interval's coverage on simulated runs."""

from __future__ import annotations

import random

import pytest

from recallq.core import agreement
from recallq.core.agreement import Confusion, JudgeTotals, LabelledClaim, LabelledItem


def _claims(pairs: list[tuple[str, str]]) -> list[LabelledClaim]:
    return [LabelledClaim(i, f"claim {i}", j, h) for i, (j, h) in enumerate(pairs)]


def test_confusion_kappa_precision_recall_known_values() -> None:
    pairs = [("yes", "yes")] * 20 + [("yes", "no")] * 5 + [("no", "yes")] * 10 + [("no", "no")] * 15
    c = Confusion.of(_claims(pairs))
    assert c.as_dict() == {
        "judge_yes_human_yes": 20,
        "judge_yes_human_no": 5,
        "judge_no_human_yes": 10,
        "judge_no_human_no": 15,
    }
    assert agreement.agreement(c) == pytest.approx(0.7)
    # chance agreement 0.5 x 0.6 + 0.5 x 0.4 = 0.5: kappa = (0.7 - 0.5) / 0.5
    assert agreement.kappa(c) == pytest.approx(0.4)
    assert agreement.precision(c) == pytest.approx(0.8)
    assert agreement.recall(c) == pytest.approx(20 / 30)


def test_perfect_agreement_is_kappa_one_even_with_one_verdict() -> None:
    assert agreement.kappa(Confusion(7, 0, 0, 0)) == 1.0
    assert agreement.kappa(Confusion(3, 0, 0, 4)) == 1.0
    assert agreement.kappa(Confusion()) is None
    assert agreement.precision(Confusion(0, 0, 3, 3)) is None


def test_summary_lists_disagreements_and_a_kappa_interval_around_kappa() -> None:
    rng = random.Random(3)
    items = []
    for i in range(60):
        pairs = []
        for _ in range(3):
            human = rng.choice(["yes", "no"])
            judge = human if rng.random() > 0.2 else ("no" if human == "yes" else "yes")
            pairs.append((judge, human))
        items.append(LabelledItem(f"q{i}", 3, sum(j == "yes" for j, _ in pairs), _claims(pairs)))
    summary = agreement.summarise(items, seed=1)
    assert summary["labelled_items"] == 60 and summary["labelled_claims"] == 180
    low, high = summary["kappa_ci95"]
    assert low < summary["kappa"] < high
    wrong = sum(summary["confusion"][k] for k in ("judge_yes_human_no", "judge_no_human_yes"))
    assert len(summary["disagreements"]) == wrong
    assert all(d["judge_verdict"] != d["human_verdict"] for d in summary["disagreements"])
    # seeded: the same labels give the same interval
    assert agreement.summarise(items, seed=1)["kappa_ci95"] == summary["kappa_ci95"]


def test_corrected_mean_known_value() -> None:
    # four items scored 1, 0.5, 0, 1 (two claims each); two of them labelled
    totals = JudgeTotals(
        items=4, score_sum=2.5, score_square_sum=2.25, claims=8, attributed=5,
        attributed_square_sum=9, claims_square_sum=16, cross_sum=10, items_with_claims=4,
    )  # fmt: skip
    sample = [
        # the judge said yes twice, the person once: human score 0.5, judge 1
        LabelledItem("a", 2, 2, _claims([("yes", "yes"), ("yes", "no")])),
        LabelledItem("b", 2, 1, _claims([("yes", "yes"), ("no", "no")])),
    ]
    score = agreement.corrected_mean_score(totals, sample, scale=1.0)
    assert score is not None
    assert score.judge == pytest.approx(0.625)
    assert score.correction == pytest.approx(-0.25)
    assert score.value == pytest.approx(0.375)
    assert score.ci95[0] <= score.value <= score.ci95[1]
    claims = agreement.corrected_claim_recall(totals, sample)
    assert claims is not None
    assert claims.judge == pytest.approx(5 / 8)
    assert claims.correction == pytest.approx(-1 / 4)  # one yes fewer over 4 sampled claims


def test_no_flips_means_no_correction() -> None:
    sample = [
        LabelledItem(f"q{i}", 2, 1, _claims([("yes", "yes"), ("no", "no")])) for i in range(20)
    ]
    totals = JudgeTotals(100, 50.0, 25.0, 200, 100, 100, 400, 200, 100)
    result = agreement.corrected(totals, sample, scale=1.0)
    assert result is not None
    assert result["mean_score"] == result["judge_mean_score"] == 0.5
    assert result["claim_recall"] == result["judge_claim_recall"] == 0.5
    assert agreement.summarise(sample)["kappa"] == 1.0


def test_scale_and_items_without_claims() -> None:
    # half the scored items have no claims (score 0): a sampled item's difference counts half
    sample = [LabelledItem("a", 1, 1, _claims([("yes", "no")]))]
    totals = JudgeTotals(10, 10.0, 20.0, 5, 5, 5, 5, 5, 5)
    score = agreement.corrected_mean_score(totals, sample, scale=2.0)
    assert score is not None
    assert score.correction == pytest.approx(0.5 * -2.0)


def _simulated_run(seed: int, items: int = 2000, sampled: int = 200, flip: float = 0.2) -> tuple:
    """A run whose true verdicts come from a per-item support rate (claims cluster in items)
    and a judge that flips each verdict with probability `flip`; a random sample labelled."""
    rng = random.Random(seed)
    truth, judged = [], []
    for _ in range(items):
        support = rng.betavariate(3, 1.5)
        k = rng.randint(1, 5)
        human = ["yes" if rng.random() < support else "no" for _ in range(k)]
        judge = [h if rng.random() >= flip else ("no" if h == "yes" else "yes") for h in human]
        truth.append(human)
        judged.append(judge)
    scores = [sum(v == "yes" for v in j) / len(j) for j in judged]
    attributed = [sum(v == "yes" for v in j) for j in judged]
    sizes = [len(j) for j in judged]
    totals = JudgeTotals(
        items=items,
        score_sum=sum(scores),
        score_square_sum=sum(s * s for s in scores),
        claims=sum(sizes),
        attributed=sum(attributed),
        attributed_square_sum=sum(a * a for a in attributed),
        claims_square_sum=sum(c * c for c in sizes),
        cross_sum=sum(a * c for a, c in zip(attributed, sizes, strict=True)),
        items_with_claims=items,
    )
    chosen = rng.sample(range(items), sampled)
    sample = [
        LabelledItem(
            str(i), sizes[i], attributed[i], _claims(list(zip(judged[i], truth[i], strict=True)))
        )
        for i in chosen
    ]
    true_mean = sum(sum(v == "yes" for v in t) / len(t) for t in truth) / items
    true_recall = sum(sum(v == "yes" for v in t) for t in truth) / sum(sizes)
    return totals, sample, true_mean, true_recall


def test_corrected_interval_covers_the_true_mean_where_the_judge_alone_misses() -> None:
    covered = recall_covered = judge_missed = 0
    seeds = 40
    for seed in range(seeds):
        totals, sample, true_mean, true_recall = _simulated_run(seed)
        score = agreement.corrected_mean_score(totals, sample, scale=1.0, seed=seed, resamples=400)
        claims = agreement.corrected_claim_recall(totals, sample, seed=seed, resamples=400)
        assert score is not None and claims is not None
        covered += score.ci95[0] <= true_mean <= score.ci95[1]
        recall_covered += claims.ci95[0] <= true_recall <= claims.ci95[1]
        judge = agreement.judge_interval(totals, scale=1.0)
        assert judge is not None
        judge_missed += not judge[0] <= true_mean <= judge[1]
    assert covered >= 0.9 * seeds, covered
    assert recall_covered >= 0.9 * seeds, recall_covered
    assert judge_missed > seeds / 2, judge_missed


def test_kappa_matches_the_flip_rate() -> None:
    # verdicts flipped at rate f around a truth with yes rate p: expected agreement 1 - f,
    # judge yes rate q = p(1-f) + (1-p)f, kappa = (1 - f - pe) / (1 - pe)
    totals, sample, _, _ = _simulated_run(7)
    summary = agreement.summarise(sample, seed=7)
    c = summary["confusion"]
    n = summary["labelled_claims"]
    p = (c["judge_yes_human_yes"] + c["judge_no_human_yes"]) / n
    f = 0.2
    q = p * (1 - f) + (1 - p) * f
    pe = p * q + (1 - p) * (1 - q)
    expected = (1 - f - pe) / (1 - pe)
    low, high = summary["kappa_ci95"]
    assert low <= expected <= high
    flips = agreement.flip_rate(sample, seed=7)
    assert flips["rate_ci95"][0] <= f <= flips["rate_ci95"][1]


def _judged_pair(seed: int, items: int = 1500, sampled: int = 150) -> tuple:
    """Two runs of the same items, the candidate's retrieval better (a higher true support),
    judged with different error rates (the base's judge flips 30%, the candidate's 10%), so
    the judges' difference is biased; each run has its own random labelled sample."""
    rng = random.Random(seed)
    runs: list[tuple[list[list[str]], list[list[str]]]] = []
    supports = [rng.betavariate(2, 2) for _ in range(items)]
    sizes = [rng.randint(1, 5) for _ in range(items)]
    for lift, flip in ((0.0, 0.3), (0.15, 0.1)):
        truth, judged = [], []
        for support, k in zip(supports, sizes, strict=True):
            human = ["yes" if rng.random() < min(1.0, support + lift) else "no" for _ in range(k)]
            truth.append(human)
            judged.append([h if rng.random() >= flip else ("no", "yes")[h == "no"] for h in human])
        runs.append((truth, judged))

    def score(verdicts: list[str]) -> float:
        return sum(v == "yes" for v in verdicts) / len(verdicts)

    out = []
    for truth, judged in runs:
        scores = [score(j) for j in judged]
        attributed = [sum(v == "yes" for v in j) for j in judged]
        cross = sum(a * c for a, c in zip(attributed, sizes, strict=True))
        totals = JudgeTotals(
            items,
            sum(scores),
            sum(s * s for s in scores),
            sum(sizes),
            sum(attributed),
            sum(a * a for a in attributed),
            sum(c * c for c in sizes),
            cross,
            items,
        )
        sample = [
            LabelledItem(
                str(i),
                sizes[i],
                attributed[i],
                _claims(list(zip(judged[i], truth[i], strict=True))),
            )
            for i in rng.sample(range(items), sampled)
        ]
        out.append((totals, sample, scores, sum(score(t) for t in truth) / items))
    (base_totals, base_sample, base_scores, base_true) = out[0]
    (cand_totals, cand_sample, cand_scores, cand_true) = out[1]
    differences = [c - b for b, c in zip(base_scores, cand_scores, strict=True)]
    mean = sum(differences) / items
    error = (sum((d - mean) ** 2 for d in differences) / items / items) ** 0.5
    return (
        mean,
        error,
        agreement.score_corrections(base_totals, base_sample, scale=1.0),
        agreement.score_corrections(cand_totals, cand_sample, scale=1.0),
        cand_true - base_true,
    )


def test_the_corrected_difference_covers_the_true_difference_where_the_judges_miss() -> None:
    covered = judge_missed = 0
    seeds = 40
    for seed in range(seeds):
        judge_difference, error, base, candidate, truth = _judged_pair(seed)
        found = agreement.corrected_difference(
            judge_difference, error, base, candidate, scale=1.0, seed=seed, resamples=400
        )
        assert found is not None and found["method"] == "ppi"
        low, high = found["ci95"]
        covered += low <= truth <= high
        judge_missed += not (
            judge_difference - 1.96 * error <= truth <= judge_difference + 1.96 * error
        )
    assert covered >= 0.9 * seeds, covered
    assert judge_missed > seeds / 2, judge_missed


def test_no_corrected_difference_without_enough_labels_on_both_sides() -> None:
    few = [0.0] * (agreement.MIN_CORRECTED_ITEMS - 1)
    enough = [0.0] * agreement.MIN_CORRECTED_ITEMS
    assert agreement.corrected_difference(0.1, 0.01, few, enough, scale=1.0) is None
    found = agreement.corrected_difference(0.1, 0.01, enough, enough, scale=1.0)
    assert found is not None and found["mean_difference"] == found["judge_mean_difference"] == 0.1
