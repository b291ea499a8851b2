"""The eval sets the browser tests submit: two retrievers over the same questions.

Each ground truth holds three facts (three claims for the stub judge, which splits on
sentences). A passage supports a claim when it holds every content word of it (the stub's
rule), so which facts a retriever found decides the score: retriever A finds i % 4 of item
i's facts (none, one, two or all three), retriever B finds (i + 1) % 4. Every item
carries metadata (`category`, `source`) so the run page shows means by a metadata field.
"""

from __future__ import annotations

from typing import Any

# (subject, three facts, each fact with a passage that states it in other words around it)
TOPICS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Marie Curie",
        [
            (
                "Marie Curie was born in Warsaw in 1867.",
                "Born in Warsaw in 1867, Marie Curie moved to Paris to study physics.",
            ),
            (
                "Marie Curie won the Nobel Prize in Physics in 1903.",
                "In 1903 Marie Curie won the Nobel Prize in Physics with Pierre Curie.",
            ),
            (
                "Marie Curie discovered polonium and radium.",
                "In her laboratory in Paris, Marie Curie discovered polonium, then radium.",
            ),
        ],
    ),
    (
        "The Eiffel Tower",
        [
            (
                "The Eiffel Tower was completed in 1889.",
                "Completed in 1889, the Eiffel Tower was the entrance arch of a World's Fair.",
            ),
            (
                "The Eiffel Tower stands 330 metres tall.",
                "Today the Eiffel Tower stands 330 metres tall with its antennas.",
            ),
            (
                "Gustave Eiffel's company built the Eiffel Tower.",
                "The company of Gustave Eiffel designed and built the Eiffel Tower.",
            ),
        ],
    ),
    (
        "The Amazon",
        [
            (
                "The Amazon River flows through Brazil.",
                "Most of the Amazon River flows through Brazil before reaching the Atlantic.",
            ),
            (
                "The Amazon River carries more water than any other river.",
                "No other river carries more water than the Amazon River does.",
            ),
            (
                "The Amazon rainforest covers seven million square kilometres.",
                "Its rainforest covers about seven million square kilometres around the Amazon.",
            ),
        ],
    ),
    (
        "Ada Lovelace",
        [
            (
                "Ada Lovelace wrote the first published algorithm.",
                "Ada Lovelace wrote what is called the first published algorithm for a machine.",
            ),
            (
                "Ada Lovelace worked with Charles Babbage.",
                "For years Ada Lovelace worked with Charles Babbage on his engines.",
            ),
            (
                "Ada Lovelace was the daughter of Lord Byron.",
                "The poet Lord Byron was the father: Ada Lovelace was his only daughter.",
            ),
        ],
    ),
]
CATEGORIES = ("science", "history", "geography")
DISTRACTOR = "An unrelated passage about the weather in {place} during the spring of {year}."


def _item(i: int, found: int, extra: str | None = None) -> dict[str, Any]:
    subject, facts = TOPICS[i // 2 % len(TOPICS)]  # each topic found in all four ways
    passages = [passage for _, passage in facts[: min(found, 3)]]
    passages.insert(i % 2, DISTRACTOR.format(place=subject, year=1900 + i))
    if extra is not None:
        passages.append(extra)
    return {
        "id": f"q{i}",
        "question": f"What do we know about {subject}? (question {i})",
        "ground_truth": " ".join(fact for fact, _ in facts),
        "contexts": passages,
        "category": CATEGORIES[i % len(CATEGORIES)],
        "source": "wiki" if i % 2 else "textbook",
    }


def retriever_a(n: int, failing: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Items q0..q{n-1}; those in `failing` carry a passage the stub answers with a 400, so
    they fail for good (a permanent provider error) and show up among the run's failures."""
    return [
        _item(
            i,
            i % 4,
            "STUB_HTTP_400: this passage makes the judge refuse." if i in failing else None,
        )
        for i in range(n)
    ]


def retriever_b(n: int) -> list[dict[str, Any]]:
    return [_item(i, (i + 1) % 4) for i in range(n)]


def plain(n: int, prefix: str) -> list[dict[str, Any]]:
    """Small items of one fact each, all of them found."""
    return [
        {
            "id": f"{prefix}{i}",
            "ground_truth": f"Sample {prefix}{i} weighs {i + 10} grams.",
            "contexts": [f"Sample {prefix}{i} weighs {i + 10} grams on the lab scale."],
        }
        for i in range(n)
    ]
