"""What the pages draw, as plain numbers: histogram bars and scatter points in an SVG's
coordinates, and the passages of an item cut into spans marked with the claims they support.

Pure functions of the dicts the queries return (recallq.runs.reads), so the served pages and the
offline report draw the same figures.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recallq.core.compare import even_positions

#: Scatter points drawn at most; above this the pairs are thinned evenly (the page says so).
MAX_SCATTER_POINTS = 2_000

HISTOGRAM_WIDTH = 480
HISTOGRAM_HEIGHT = 180
SCATTER_SIZE = 320
_MARGIN = 28  # room for the axis labels, in the SVG's units
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+")
# words too common to say anything about which sentence a claim came from
# fmt: off
_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "been", "by", "for", "from", "has", "have", "in",
    "is", "it", "its", "of", "on", "or", "that", "the", "their", "this", "to", "was", "were",
    "which", "with",
})
# fmt: on


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    low: float
    high: float


@dataclass(frozen=True)
class Histogram:
    width: int
    height: int
    baseline: float
    bars: list[Bar]
    total: int


def histogram(summary_histogram: dict[str, Any]) -> Histogram:
    """Bars of a run's `summary.histogram` (`edges` in the run's scale, `counts` per bin), the
    tallest filling the plot; an empty bin keeps its place with no height."""
    edges: Sequence[float] = summary_histogram["edges"]
    counts: Sequence[int] = summary_histogram["counts"]
    if len(edges) != len(counts) + 1:
        raise ValueError("a histogram has one more edge than it has counts")
    plot_width = HISTOGRAM_WIDTH - 2 * _MARGIN
    plot_height = HISTOGRAM_HEIGHT - 2 * _MARGIN
    tallest = max(counts, default=0) or 1
    slot = plot_width / max(len(counts), 1)
    bars = []
    for i, count in enumerate(counts):
        height = plot_height * count / tallest
        bars.append(
            Bar(
                x=round(_MARGIN + i * slot + 2, 2),
                y=round(_MARGIN + plot_height - height, 2),
                width=round(slot - 4, 2),
                height=round(height, 2),
                count=int(count),
                low=edges[i],
                high=edges[i + 1],
            )
        )
    return Histogram(
        HISTOGRAM_WIDTH, HISTOGRAM_HEIGHT, _MARGIN + plot_height, bars, sum(map(int, counts))
    )


@dataclass(frozen=True)
class Point:
    key: str
    x: float
    y: float
    base: float
    candidate: float


@dataclass(frozen=True)
class Scatter:
    size: int
    margin: int
    points: list[Point]
    total: int  # pairs there are (more than len(points) when thinned)
    scale: float


def scatter(
    pairs: Sequence[tuple[str, float, float]], scale: float, total: int | None = None
) -> Scatter:
    """Points of (key, base score, candidate score) pairs: base across, candidate up. Above
    MAX_SCATTER_POINTS pairs, an even sample of them in key order (the same every time);
    `total` says how many pairs there are when `pairs` is already such a sample
    (recallq.runs.comparisons.compare_runs). Each point is nudged by a small offset derived from its
    key, so the many items sharing a score (scores are rounded) show as a cloud rather than
    one dot."""
    ordered = sorted(pairs)
    ordered = [ordered[i] for i in even_positions(len(ordered), MAX_SCATTER_POINTS)]
    plot = SCATTER_SIZE - 2 * _MARGIN
    points = []
    for key, base, candidate in ordered:
        dx, dy = _jitter(key)
        points.append(
            Point(
                key=key,
                x=round(_MARGIN + plot * base / scale + dx, 2),
                y=round(_MARGIN + plot * (1 - candidate / scale) + dy, 2),
                base=base,
                candidate=candidate,
            )
        )
    return Scatter(SCATTER_SIZE, _MARGIN, points, len(pairs) if total is None else total, scale)


def _jitter(key: str, spread: float = 6.0) -> tuple[float, float]:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=2).digest()
    return (digest[0] / 255 - 0.5) * spread, (digest[1] / 255 - 0.5) * spread


# --- supporting spans ------------------------------------------------------------------------


@dataclass
class Span:
    """A run of a passage's text and the claims (indices) it is marked for."""

    text: str
    claims: list[int] = field(default_factory=list)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def sentences(passage: str) -> list[str]:
    """The passage cut after each sentence's end mark; joined, the pieces are the passage."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(passage):
        pieces.append(passage[start : match.end()])
        start = match.end()
    pieces.append(passage[start:])
    return [piece for piece in pieces if piece]


def closest_sentences(passage_sentences: Sequence[str], claim: str) -> list[int]:
    """The sentences sharing the most words with the claim (all of them on a tie). Claims
    store only which passages support them, not where: this is the page's best guess. No
    shared word at all: every sentence (the judge cited the passage as a whole)."""
    claim_words = _words(claim)
    overlaps = [len(claim_words & _words(sentence)) for sentence in passage_sentences]
    best = max(overlaps, default=0)
    if best == 0:
        return list(range(len(passage_sentences)))
    return [i for i, overlap in enumerate(overlaps) if overlap == best]


def marked_passages(context: Sequence[str], claims: Sequence[dict[str, Any]]) -> list[list[Span]]:
    """Each passage as spans, a sentence marked with every claim (by `index`) that cites the
    passage in its `context_indices` and finds that sentence closest. A passage no claim
    cites is one unmarked span."""
    citing: dict[int, list[dict[str, Any]]] = {}
    for claim in claims:
        for j in claim.get("context_indices") or []:
            if isinstance(j, int) and 0 <= j < len(context):
                citing.setdefault(j, []).append(claim)
    marked = []
    for j, passage in enumerate(context):
        if j not in citing:
            marked.append([Span(passage)])
            continue
        pieces = sentences(passage)
        spans = [Span(piece.rstrip()) for piece in pieces]
        for claim in citing[j]:
            for i in closest_sentences(pieces, claim["text"]):
                spans[i].claims.append(claim["index"])
        # the space after a sentence stays outside its mark
        with_gaps = []
        for span, piece in zip(spans, pieces, strict=True):
            with_gaps.append(span)
            if len(piece) > len(span.text):
                with_gaps.append(Span(piece[len(span.text) :]))
        marked.append(with_gaps)
    return marked


def supporting_passages(claims: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of the passages some claim cites."""
    return {j for claim in claims for j in claim.get("context_indices") or []}
