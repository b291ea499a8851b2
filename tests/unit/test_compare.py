import random

import pytest

from recallq.core.compare import (
    BOOTSTRAP_MAX_PAIRS,
    MISSING_GROUP,
    ItemScores,
    bootstrap_interval,
    compare,
    normal_interval,
)

CONTRACT_KEYS = {
    "matched",
    "unmatched",
    "base_mean",
    "candidate_mean",
    "mean_difference",
    "ci95",
    "improved",
    "regressed",
    "unchanged",
    "largest_changes",
}


def runs(base_scores, candidate_scores, **metadata):
    """Two runs over keys k0, k1, ... with the given scores."""
    base = [ItemScores(f"k{i}", s, metadata=metadata or None) for i, s in enumerate(base_scores)]
    candidate = [ItemScores(f"k{i}", s) for i, s in enumerate(candidate_scores)]
    return base, candidate


def noisy_runs(n: int, true_difference: float, seed: int):
    """Paired scores whose differences are drawn around a known mean."""
    rng = random.Random(seed)
    base = [rng.uniform(0.2, 0.8) for _ in range(n)]
    candidate = [b + true_difference + rng.gauss(0, 0.15) for b in base]
    return runs(base, candidate)


def test_result_has_the_contract_shape_and_counts_of_flipped_claims():
    result = compare(*runs([0.5], [0.7]), scale=1)
    assert set(result) == CONTRACT_KEYS | {"claims_flipped"}
    assert set(result["unmatched"]) == {"base_only", "candidate_only", "unscored"}
    assert set(compare(*runs([0.5], [0.7]), scale=1, by="topic")) == CONTRACT_KEYS | {
        "claims_flipped",
        "by_group",
    }


def test_known_shift():
    rng = random.Random(7)
    base_scores = [round(rng.uniform(0, 0.9), 2) for _ in range(200)]
    result = compare(*runs(base_scores, [s + 0.1 for s in base_scores]), scale=1)
    assert result["matched"] == 200
    assert result["mean_difference"] == 0.1
    low, high = result["ci95"]
    assert low <= 0.1 <= high
    assert result["candidate_mean"] == round(result["base_mean"] + 0.1, 4)
    assert (result["improved"], result["regressed"], result["unchanged"]) == (200, 0, 0)


def test_noise_around_a_known_difference():
    # Noise in +e/-e pairs: the sample's mean difference is exactly the true one, 0.05.
    rng = random.Random(1)
    base = [rng.uniform(0.2, 0.8) for _ in range(500)]
    noise = [rng.gauss(0, 0.15) for _ in range(250)]
    noise += [-e for e in noise]
    result = compare(*runs(base, [b + 0.05 + e for b, e in zip(base, noise, strict=True)]), scale=1)
    assert result["mean_difference"] == 0.05
    low, high = result["ci95"]
    assert low < 0.05 < high
    assert low < result["mean_difference"] < high
    # Half-width near 1.96 * 0.15 / sqrt(500) = 0.013, not a degenerate or a huge interval.
    assert 0.009 < (high - low) / 2 < 0.017


def test_interval_covers_the_true_difference_about_95_percent_of_the_time():
    covered = 0
    for data_seed in range(40):
        low, high = compare(*noisy_runs(200, -0.03, seed=data_seed), scale=1)["ci95"]
        covered += low <= -0.03 <= high
    assert 34 <= covered <= 40


def test_seeded_result_is_reproducible_and_independent_of_item_order():
    base, candidate = noisy_runs(500, 0.05, seed=2)
    first = compare(base, candidate, scale=1, seed=11)
    assert compare(base, candidate, scale=1, seed=11) == first
    shuffled_base, shuffled_candidate = base[:], candidate[:]
    random.Random(0).shuffle(shuffled_base)
    random.Random(1).shuffle(shuffled_candidate)
    assert compare(shuffled_base, shuffled_candidate, scale=1, seed=11) == first
    other = compare(base, candidate, scale=1, seed=12)
    assert other["ci95"] != first["ci95"]
    assert other["mean_difference"] == first["mean_difference"]


def test_unmatched_counts():
    base = [
        ItemScores("both", 0.5),
        ItemScores("base-only", 0.5),
        ItemScores("base-unscored", None),
        ItemScores("both-unscored", None),
    ]
    candidate = [
        ItemScores("both", 1.0),
        ItemScores("cand-only-1", 0.5),
        ItemScores("cand-only-2", None),
        ItemScores("base-unscored", 0.5),
        ItemScores("both-unscored", None),
    ]
    result = compare(base, candidate, scale=1)
    assert result["matched"] == 1
    assert result["unmatched"] == {"base_only": 1, "candidate_only": 2, "unscored": 2}
    assert (result["base_mean"], result["candidate_mean"], result["mean_difference"]) == (
        0.5,
        1.0,
        0.5,
    )


def test_nothing_matched():
    result = compare([ItemScores("a", None)], [ItemScores("a", 0.5)], scale=1)
    assert result["matched"] == 0
    assert result["base_mean"] is result["mean_difference"] is result["ci95"] is None
    assert result["largest_changes"] == []
    assert compare([], [], scale=1, by="topic")["by_group"] == {}


def test_flipped_claims():
    base = [
        ItemScores("q1", 0.5, {"Paris is in France.": "yes", "It has 2M people.": "no"}),
        ItemScores("q2", 1.0, {"Water boils at 100 C.": "yes"}),
    ]
    candidate = [
        ItemScores(
            "q1",
            1.0,
            {"It has 2M people.": "yes", "Paris is in France.": "yes", "New claim.": "no"},
        ),
        ItemScores("q2", 0.0, {"Water boils at 100 C.": "no"}),
    ]
    changes = {c["key"]: c for c in compare(base, candidate, scale=1)["largest_changes"]}
    assert changes["q1"]["flipped"] == [
        {"claim": "It has 2M people.", "base": "no", "candidate": "yes"}
    ]
    assert changes["q2"]["flipped"] == [
        {"claim": "Water boils at 100 C.", "base": "yes", "candidate": "no"}
    ]
    counts = compare(base, candidate, scale=1, top=0)["claims_flipped"]
    assert counts == {"no_to_yes": 1, "yes_to_no": 1}  # over every pair, not only those listed


def test_unchanged_score_can_still_flip_claims():
    base = [ItemScores("q", 0.5, {"a": "yes", "b": "no"})]
    candidate = [ItemScores("q", 0.5, {"a": "no", "b": "yes"})]
    result = compare(base, candidate, scale=1)
    assert result["unchanged"] == 1 and result["largest_changes"] == []
    assert result["claims_flipped"] == {"no_to_yes": 1, "yes_to_no": 1}


def test_largest_changes_order_limit_and_rounding():
    base_scores = [0.5, 0.5, 0.5, 0.5, 0.33, 0.5]
    candidate_scores = [0.5, 0.9, 0.1, 0.7, 0.67, 0.1]
    result = compare(*runs(base_scores, candidate_scores), scale=1, top=4)
    assert [(c["key"], c["difference"]) for c in result["largest_changes"]] == [
        ("k1", 0.4),
        ("k2", -0.4),
        ("k5", -0.4),
        ("k4", 0.34),
    ]
    first = result["largest_changes"][0]
    assert first == {"key": "k1", "base": 0.5, "candidate": 0.9, "difference": 0.4, "flipped": []}
    assert compare(*runs(base_scores, candidate_scores), scale=1, top=0)["largest_changes"] == []
    # Unchanged pairs are not changes, however large top is.
    all_changes = compare(*runs(base_scores, candidate_scores), scale=1, top=100)
    assert "k0" not in [c["key"] for c in all_changes["largest_changes"]]


def test_float_noise_is_unchanged_within_the_tolerance():
    # 0.67 - 0.33 is 0.34000000000000002 in floats; 0.34 + that noise is no change.
    result = compare(*runs([0.34, 0.1, 0.2], [0.67 - 0.33, 0.1 + 1e-12, 0.2 - 2e-9]), scale=1)
    assert (result["improved"], result["regressed"], result["unchanged"]) == (0, 1, 2)
    # On a 0-100 scale the tolerance is 1e-7: the 2e-9 step is noise there.
    scaled = compare(*runs([34.0, 20.0], [34.0 + 2e-9, 20.5]), scale=100)
    assert (scaled["improved"], scaled["regressed"], scaled["unchanged"]) == (1, 0, 1)
    assert scaled["mean_difference"] == 0.25


def test_by_group():
    base = [
        ItemScores("a", 0.5, metadata={"topic": "billing"}),
        ItemScores("b", 0.7, metadata={"topic": "billing"}),
        ItemScores("c", 0.2, metadata={"topic": "security"}),
        ItemScores("d", 0.4, metadata={"level": 2}),
        ItemScores("e", 0.6),
        ItemScores("f", 0.6, metadata={"topic": 3}),
    ]
    candidate = [
        ItemScores("a", 0.6),
        ItemScores("b", 0.9),
        ItemScores("c", 0.2),
        ItemScores("d", 0.4),
        ItemScores("e", 0.1, metadata={"topic": "security"}),
        ItemScores("f", 0.6, metadata={"topic": "ignored: the base has one"}),
    ]
    groups = compare(base, candidate, scale=1, by="topic")["by_group"]
    assert list(groups) == sorted(groups)
    assert groups == {
        MISSING_GROUP: {
            "matched": 1,
            "base_mean": 0.4,
            "candidate_mean": 0.4,
            "mean_difference": 0.0,
        },
        "3": {"matched": 1, "base_mean": 0.6, "candidate_mean": 0.6, "mean_difference": 0.0},
        "billing": {
            "matched": 2,
            "base_mean": 0.6,
            "candidate_mean": 0.75,
            "mean_difference": 0.15,
        },
        "security": {
            "matched": 2,
            "base_mean": 0.4,
            "candidate_mean": 0.15,
            "mean_difference": -0.25,
        },
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": 0}, "scale must be a finite number greater than 0"),
        ({"scale": 1, "top": -1}, "top must be 0 or more"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare([], [], **kwargs)


def test_duplicate_key_in_a_run():
    with pytest.raises(ValueError, match="candidate run has item 'a' twice"):
        compare([ItemScores("a", 1.0)], [ItemScores("a", 1.0), ItemScores("a", 0.0)], scale=1)


def test_normal_interval_agrees_with_the_bootstrap():
    rng = random.Random(5)
    differences = [rng.choice([-0.5, -0.25, 0.0, 0.0, 0.25, 0.33, 0.5]) for _ in range(5_000)]
    boot_low, boot_high = bootstrap_interval(differences, seed=0)
    normal_low, normal_high = normal_interval(differences)
    # A 2.5% percentile of 2,000 resamples has a Monte-Carlo sd of about 3% of the half-width.
    half_width = (normal_high - normal_low) / 2
    assert abs(boot_low - normal_low) < 0.15 * half_width
    assert abs(boot_high - normal_high) < 0.15 * half_width


def test_large_comparisons_use_the_normal_interval():
    """(How fast: `python -m bench --sections bounds`.)"""
    rng = random.Random(9)
    base_scores = [round(rng.random(), 2) for _ in range(50_000)]
    candidate_scores = [round(min(1.0, max(0.0, s + rng.gauss(0.02, 0.2))), 2) for s in base_scores]
    base, candidate = runs(base_scores, candidate_scores)
    result = compare(base, candidate, scale=1)
    differences = [c - b for b, c in zip(base_scores, candidate_scores, strict=True)]
    assert result["ci95"] == [round(bound, 4) for bound in normal_interval(differences)]
    assert result["matched"] > BOOTSTRAP_MAX_PAIRS


def test_up_to_the_threshold_the_bootstrap_is_used():
    base, candidate = noisy_runs(300, 0.0, seed=4)
    differences = [c.score - b.score for b, c in zip(base, candidate, strict=True)]
    # compare() resamples pairs in key order; these keys sort as k0, k1, k10, k100, ...
    order = sorted(range(300), key=lambda i: f"k{i}")
    expected = bootstrap_interval([differences[i] for i in order], seed=0)
    assert compare(base, candidate, scale=1)["ci95"] == [round(bound, 4) for bound in expected]


def test_single_pair_and_identical_differences():
    assert bootstrap_interval([0.25]) == (0.25, 0.25)
    assert normal_interval([0.1, 0.1, 0.1]) == pytest.approx((0.1, 0.1))
    with pytest.raises(ValueError):
        bootstrap_interval([])
