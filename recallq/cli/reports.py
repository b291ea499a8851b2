"""`recallq report`: a run's self-contained HTML report, from the API or the local database."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from recallq.core.exits import CommandError

if TYPE_CHECKING:
    from recallq.cli.backends import Backend

REPORT_LOWEST = 25
MAX_REPORT_LOWEST = 500  # each shown item is read in full: a bound on the report's size


def write_report(
    backend: Backend, run_id: str, out: Path | None, *, base: str | None, lowest: int
) -> Path:
    """Gather what a report shows through `backend` (the API or the local database: the same
    answers as `recallq status` and `recallq compare`) and write it to `out`."""
    from recallq.cli.output import output_file
    from recallq.viewer import report as html_report  # here: jinja2 is for reports only

    target = out or Path(f"recallq-report-{run_id}.html")
    if not target.parent.is_dir():
        raise CommandError(f"cannot write {target}: {target.parent} is not a directory")
    view = backend.view(run_id)
    comparison = backend.compare(base, run_id, None) if base is not None else None
    # Scores come from the results stream without item data (one pass, even over a 100k-item
    # run); only the items shown are then read in full.
    scores = _scores(backend, run_id)
    picked = heapq.nsmallest(lowest, ((s, i, key) for key, (i, s) in scores.items()))
    items = [backend.item(run_id, key) for _, _, key in picked]
    pairs: list[tuple[str, float, float]] = []
    if base is not None:
        base_scores = _scores(backend, base)
        pairs = [
            (key, base_scores[key][1], score)
            for key, (_, score) in scores.items()
            if key in base_scores
        ]
    agreement = backend.agreement(run_id)
    page = html_report.render(view, items, comparison, pairs, agreement=agreement)
    with output_file(target) as written:
        written.write(page.encode("utf-8"))
    return target


def _scores(backend: Backend, run_id: str) -> dict[str, tuple[int, float]]:
    """Item id -> (index, score) of a run's scored items."""
    scores = {}
    for line in _lines(backend.results(run_id, "jsonl", item_data=False)):
        item = json.loads(line)
        if item["score"] is not None:
            scores[item["id"]] = (item["index"], item["score"])
    return scores


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The non-blank lines of a stream whose chunks end anywhere."""
    rest = b""
    for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest
