"""`recallq report`: a run's page, its lowest-scoring items with their claims and, optionally,
a comparison, as one HTML file that opens from disk: the viewer's stylesheet inlined, figures
as inline SVG, no script and nothing fetched (its Content-Security-Policy forbids both)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from recallq.viewer import environment, stylesheet


def render(
    run: dict[str, Any],
    lowest_items: Sequence[dict[str, Any]],
    comparison: dict[str, Any] | None = None,
    pairs: Sequence[tuple[str, float, float]] = (),
    generated_at: datetime | None = None,
    agreement: dict[str, Any] | None = None,
) -> str:
    """The report's HTML. `run` is a run object (GET /v1/runs/{id}), `lowest_items` item objects
    with item data, `comparison` a compare result with this run as the candidate, and `pairs`
    (item id, base score, candidate score) for its scatter, `agreement` the run's judge-human
    agreement (GET /v1/runs/{id}/agreement), shown when a claim is labelled."""
    moment = generated_at or datetime.now(UTC)
    return (
        environment()
        .get_template("report.html")
        .render(
            run=run,
            lowest_items=lowest_items,
            comparison=comparison,
            pairs=list(pairs),
            agreement=agreement,
            css=stylesheet(),
            anchor=anchor,
            generated_at=moment.isoformat(timespec="seconds"),
        )
    )


def anchor(item_id: str) -> str:
    """The in-file link of an item of the report: one per id (`_` is escaped too, so `a/b`
    and `a_2fb` stay apart)."""
    return "#item-" + "".join(c if c.isalnum() or c == "-" else f"_{ord(c):x}_" for c in item_id)
