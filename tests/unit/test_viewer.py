"""The viewer's pure parts: supporting spans, histogram and scatter geometry, the mean's
interval, and the partials rendered from plain dicts (escaped, with the contract's selectors)."""

from __future__ import annotations

import math
import random
import re
import statistics

import pytest

from recallq.core import compare
from recallq.viewer import environment, figures, static_file, stylesheet


def test_sentences_cut_a_passage_without_losing_a_character() -> None:
    passage = "Paris is in France.  It is big! Is it old? Yes\nand no"
    pieces = figures.sentences(passage)
    assert "".join(pieces) == passage
    assert pieces == ["Paris is in France.  ", "It is big! ", "Is it old? ", "Yes\nand no"]


def test_the_closest_sentence_shares_the_most_words_with_the_claim() -> None:
    pieces = figures.sentences(
        "Berlin is the capital of Germany. The Eiffel Tower was completed in 1889. It is tall."
    )
    assert figures.closest_sentences(pieces, "The Eiffel Tower was finished in 1889") == [1]
    # stopwords alone do not make a sentence closer
    assert figures.closest_sentences(pieces, "the capital of the tower") == [0, 1]


def test_a_claim_sharing_no_word_marks_the_whole_cited_passage() -> None:
    pieces = figures.sentences("One. Two.")
    assert figures.closest_sentences(pieces, "zebra") == [0, 1]


def test_marked_passages_mark_only_cited_passages_and_keep_their_text() -> None:
    context = ["Lyon is old. Paris is in France. More.", "Berlin is in Germany."]
    claims = [
        {"index": 0, "text": "Paris is in France", "context_indices": [0]},
        {"index": 1, "text": "Lyon is old", "context_indices": [0, 7]},  # 7: out of range
        {"index": 2, "text": "missing claim", "context_indices": []},
    ]
    marked = figures.marked_passages(context, claims)
    assert ["".join(span.text for span in spans) for spans in marked] == context
    first = {span.text: span.claims for span in marked[0] if span.claims}
    assert first == {"Paris is in France.": [0], "Lyon is old.": [1]}
    assert [span.claims for span in marked[1]] == [[]]
    assert figures.supporting_passages(claims) == {0, 7}


def test_several_claims_on_one_sentence_nest_their_marks() -> None:
    claims = [
        {"index": 0, "text": "Paris France", "context_indices": [0]},
        {"index": 3, "text": "France Paris capital", "context_indices": [0]},
    ]
    (spans,) = figures.marked_passages(["Paris is the capital of France."], claims)
    assert spans[0].claims == [0, 3]


def test_histogram_bars_are_in_the_runs_scale_and_the_tallest_fills_the_plot() -> None:
    figure = figures.histogram({"edges": [0, 2, 4, 6, 8, 10], "counts": [1, 0, 4, 2, 0]})
    assert [bar.count for bar in figure.bars] == [1, 0, 4, 2, 0]
    assert [(bar.low, bar.high) for bar in figure.bars][:2] == [(0, 2), (2, 4)]
    assert figure.total == 7
    tallest = figure.bars[2]
    assert tallest.y + tallest.height == pytest.approx(figure.baseline)
    assert tallest.y == pytest.approx(figure.baseline - max(b.height for b in figure.bars))
    assert figure.bars[1].height == 0 and figure.bars[0].height == pytest.approx(
        tallest.height / 4, abs=0.01
    )
    xs = [bar.x for bar in figure.bars]
    assert xs == sorted(xs) and all(bar.x + bar.width <= figure.width for bar in figure.bars)


def test_an_empty_histogram_has_bars_of_no_height() -> None:
    figure = figures.histogram({"edges": [0, 0.5, 1], "counts": [0, 0]})
    assert [bar.height for bar in figure.bars] == [0, 0] and figure.total == 0


def test_a_histogram_needs_one_more_edge_than_counts() -> None:
    with pytest.raises(ValueError):
        figures.histogram({"edges": [0, 1], "counts": [1, 2]})


def test_scatter_points_stay_in_the_plot_and_are_capped_evenly() -> None:
    few = figures.scatter([("b", 0.0, 1.0), ("a", 1.0, 0.0)], scale=1.0)
    assert [p.key for p in few.points] == ["a", "b"] and few.total == 2
    a, b = few.points
    assert a.x > b.x and a.y > b.y  # base across, candidate up (SVG y grows downwards)
    many = [(f"k{i:06d}", random.random(), random.random()) for i in range(5_000)]
    capped = figures.scatter(many, scale=1.0)
    assert len(capped.points) == figures.MAX_SCATTER_POINTS and capped.total == 5_000
    assert capped.points == figures.scatter(list(reversed(many)), scale=1.0).points
    assert all(0 <= p.x <= capped.size and 0 <= p.y <= capped.size for p in capped.points)


def test_mean_interval_from_moments_is_the_normal_interval_of_the_scores() -> None:
    scores = [0.0, 0.33, 0.5, 0.67, 1.0, 1.0, 0.25]
    mean = statistics.fmean(scores)
    mean_square = statistics.fmean(s * s for s in scores)
    low, high = compare.normal_interval(scores)
    assert compare.mean_interval(len(scores), mean, mean_square, 1.0) == [
        round(max(0.0, low), 4),
        round(min(1.0, high), 4),
    ]


def test_mean_interval_stays_within_the_scale_and_is_none_without_scores() -> None:
    assert compare.mean_interval(0, None, None, 1.0) is None
    assert compare.mean_interval(2, 1.0, 1.0, 1.0) == [1.0, 1.0]
    low, high = compare.mean_interval(2, 0.5, 0.5, 1.0) or [math.nan, math.nan]
    assert 0.0 <= low < 0.5 < high <= 1.0
    # rounding may put the mean of squares a hair under the squared mean: no error
    assert compare.mean_interval(3, 0.1, 0.01 - 1e-12, 1.0) == [0.1, 0.1]


COUNTS = {"total": 3, "pending": 0, "running": 0, "succeeded": 2, "failed": 1}
RUN = {
    "id": "r1",
    "scale": 10.0,
    "counts": COUNTS,
    "summary": {
        "mean_score": 7.5,
        "mean_ci95": [2.6, 10.0],
        "scored_items": 2,
        "claims_total": 4,
        "claims_attributed": 3,
        "no_ground_truth": 0,
        "histogram": {"edges": [0, 2, 4, 6, 8, 10], "counts": [0, 0, 1, 0, 1]},
    },
    "usage": {
        "llm_calls": 4,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cost_usd": 0.001,
        "claim_cache_hits": 0,
        "call_attempts": 4,
        "failed_calls": 0,
    },
    "failures": [{"error": "<script>alert(1)</script>", "count": 1, "example_id": "q3"}],
}


def _render(source: str, **context: object) -> str:
    return environment().from_string(source).render(**context)


def test_the_run_summary_partial_carries_the_contracts_selectors() -> None:
    html = _render(
        '{% import "partials/run_summary.html" as s %}{{ s.run_summary(run) }}'
        "{{ s.usage(run) }}{{ s.failures(run) }}",
        run=RUN,
    )
    counts = dict(re.findall(r'data-count="(\w+)" data-value="(\d+)"', html))
    assert counts == {key: str(value) for key, value in COUNTS.items()}
    assert 'data-testid="mean-score" data-value="7.5"' in html
    assert 'data-low="2.6" data-high="10.0"' in html
    bars = re.findall(r'<rect class="bar"[^>]*data-count="(\d+)" data-low="(\d+)"', html)
    assert bars == [("0", "0"), ("0", "2"), ("1", "4"), ("0", "6"), ("1", "8")]
    assert 'data-error-group="0" data-count="1"' in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_the_claims_partial_marks_verdicts_and_supporting_spans() -> None:
    item = {
        "id": "a<b",
        "index": 4,
        "status": "succeeded",
        "score": 0.5,
        "claims_total": 2,
        "claims_attributed": 1,
        "reason": "r",
        "error": None,
        "ground_truth": "Paris is in France. It is <big>.",
        "claims": [
            {"index": 0, "text": "Paris is in France", "verdict": "yes",
             "context_indices": [1], "reason": "passage 1"},
            {"index": 1, "text": "It is big", "verdict": "no", "context_indices": [],
             "reason": "not found"},
        ],
        "context": ["Berlin.", "Lyon is old. Paris is a city in France!"],
    }  # fmt: skip
    html = _render(
        '{% import "partials/item.html" as i %}{{ i.item_block(item, item_url=url) }}',
        item=item,
        url=lambda key: "/items/" + key,
    )
    assert 'data-claim-index="0" data-verdict="supported"' in html
    assert 'data-claim-index="1" data-verdict="missing"' in html
    assert html.count("found in no passage") == 1
    assert re.search(r'class="passage supports"[^>]*data-passage-index="1"', html)
    assert re.search(r'class="passage"[^>]*data-passage-index="0"', html)
    assert re.search(r'<mark data-claim="0"[^>]*>Paris is a city in France!</mark>', html)
    assert "&lt;big&gt;" in html and "a&lt;b" in html


def test_claims_of_an_item_that_failed_before_attribution_read_not_judged() -> None:
    item = {
        "id": "q",
        "index": 0,
        "status": "failed",
        "score": None,
        "claims_total": 1,
        "claims_attributed": 0,
        "reason": None,
        "error": "BadRequestError: context window exceeded",
        "claims": [
            {"index": 0, "text": "c", "verdict": None, "context_indices": [], "reason": None}
        ],
        "context": [],
    }
    html = _render('{% import "partials/item.html" as i %}{{ i.claims(item) }}', item=item)
    assert 'data-verdict="pending"' in html
    assert '<span class="verdict">not judged</span>' in html
    item["status"] = "running"
    html = _render('{% import "partials/item.html" as i %}{{ i.claims(item) }}', item=item)
    assert '<span class="verdict">pending</span>' in html


def test_assets_ship_in_the_package_and_load_nothing_from_elsewhere() -> None:
    assert "font:" in stylesheet()
    for text in (stylesheet(), static_file("viewer.js")):
        assert "http://" not in text and "https://" not in text and "@import" not in text
    with pytest.raises(FileNotFoundError):
        static_file("../__init__.py")


def test_the_compare_partial_draws_one_point_per_pair_and_links_changes() -> None:
    result = {
        "matched": 2,
        "unmatched": {"base_only": 0, "candidate_only": 1, "unscored": 0},
        "base_mean": 0.5,
        "candidate_mean": 0.75,
        "mean_difference": 0.25,
        "ci95": [0.0, 0.5],
        "improved": 1,
        "regressed": 0,
        "unchanged": 1,
        "largest_changes": [
            {
                "key": "q/1",
                "base": 0.5,
                "candidate": 1.0,
                "difference": 0.5,
                "flipped": [{"claim": "c", "base": "no", "candidate": "yes"}],
            }
        ],
        "claims_flipped": {"no_to_yes": 1, "yes_to_no": 0},
        "pairs": [("q/1", 0.5, 1.0), ("q2", 1.0, 1.0)],
    }
    html = _render(
        '{% import "partials/compare.html" as c %}{{ c.compare_summary(result) }}'
        "{{ c.scatter_plot(result.pairs, 1.0) }}{{ c.largest_changes(result, item_url=url) }}",
        result=result,
        url=lambda key: "/compare/items/" + key,
    )
    assert 'data-testid="mean-difference" data-value="0.25"' in html
    assert 'data-testid="compare-interval" data-low="0.0" data-high="0.5"' in html
    assert 'data-count="improved" data-value="1"' in html
    assert html.count("<circle") == 2 and "scatter-note" not in html
    assert re.search(
        r'<tr data-item-id="q/1">\s*<td class="mono item-id"><a href="/compare/items/q/1">', html
    )


def test_numbers_and_times_read_as_the_api_rounds_them() -> None:
    from recallq.viewer import formatting

    assert formatting.mean(0.46824) == "0.4682" and formatting.mean(1.0) == "1"
    assert formatting.mean(None) == "–" and formatting.mean(0.0) == "0"
    assert formatting.signed(0.25) == "+0.25" and formatting.signed(-0.125) == "-0.125"
    assert formatting.signed(0.0) == "0" and formatting.signed(None) == "–"
    assert formatting.score(0.67) == "0.67" and formatting.cost(0.00123) == "$0.0012"
    # naive timestamps are UTC (SQLite hands them back so)
    assert formatting.when("2026-11-30T19:25:29.123") == "2026-11-30 19:25:29 UTC"
    assert formatting.when("2026-11-30T19:25:29+01:00") == "2026-11-30 18:25:29 UTC"
    assert formatting.when(None) == "–" and formatting.raw(None) == ""


def test_spend_says_not_priced_for_calls_that_cost_nothing() -> None:
    from recallq.viewer.formatting import spend

    assert spend({"llm_calls": 78, "cost_usd": 0.0}) == "not priced"
    assert spend({"llm_calls": 0, "cost_usd": 0.0}) == "no calls"  # local/lexical, a cached stage
    assert spend({"llm_calls": 3, "cost_usd": 0.0123}) == "$0.0123"
    assert spend({"llm_calls": 3, "cost_usd": 12.5}) == "$12.50"
    assert spend(None) == "–"
