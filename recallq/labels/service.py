"""The label service: every use case of human labels, once, for the HTTP API, the labelling
page and the CLI (local and remote ends alike), each in one short transaction.

    set / clear                one claim's label
    label_page, export         every label of a run, a page at a time (JSON, JSONL, CSV)
    import_file                a CSV or JSONL file: every row stored or reported by line
    draw_sample, sample,       the random sample to label, and its rows as the labelling CSV
    sample_rows
    agreement                  judge vs labels (or vs another run's judge), `corrected` for a
                               random sample; agreement_if_labelled for the run page
    item_labels, walk          what the item page and the labelling page show

Every method takes the caller's project: another project's run is not found, like a missing
one (RunNotFound). A request that cannot be done raises LabelError with its status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from recallq.labels import agreement, files, sampling, store
from recallq.labels.store import MAX_PROBLEMS, LabelError, Step
from recallq.state.db import Database
from recallq.state.runs import RunNotFound, find_run, plausible_id
from recallq.state.tables import Run

T = TypeVar("T")


class LabelService:
    """The use cases of labels over one database (see the module docstring)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def _in_run(self, run_id: str, project: str, work: Callable[[Session, Run], T]) -> T:
        """`work` on the project's run, in one transaction."""
        with self.database.session() as session:
            run = find_run(session, run_id, project)
            if run is None:
                raise RunNotFound(run_id)
            return work(session, run)

    # --- one label ---------------------------------------------------------------------------

    def set(
        self,
        run_id: str,
        project: str,
        item_id: str,
        claim_index: int,
        verdict: Any,
        note: Any = None,
        who: str | None = None,
    ) -> dict[str, Any]:
        """A person's verdict on one claim (replacing an earlier label of it); the judge's
        verdict is kept as it is."""
        _require_item(item_id)
        return self._in_run(
            run_id,
            project,
            lambda s, run: store.set_label(s, run.id, item_id, claim_index, verdict, note, who),
        )

    def clear(self, run_id: str, project: str, item_id: str, claim_index: int) -> bool:
        _require_item(item_id)
        return self._in_run(
            run_id, project, lambda s, run: store.clear_label(s, run.id, item_id, claim_index)
        )

    def check(self, run_id: str, project: str) -> str:
        """The run's id, once it is known to be the project's (before a stream starts)."""
        return self._in_run(run_id, project, lambda _, run: run.id)

    def label_page(
        self, run_id: str, after: tuple[int, int] | None, limit: int
    ) -> tuple[list[dict[str, Any]], tuple[int, int] | None]:
        """One page of the run's labels in item then claim order, in its own transaction (a
        stream reads page by page; the caller checked the project)."""
        with self.database.session() as session:
            return store.list_labels(session, run_id, after, limit)

    @staticmethod
    def export_lines(page: Sequence[dict[str, Any]], format: str, header: bool) -> Iterator[str]:
        return store.export_lines(page, format, header=header)

    # --- files -------------------------------------------------------------------------------

    def import_file(
        self, run_id: str, project: str, data: bytes, format: str | None, who: str | None
    ) -> dict[str, Any]:
        """Store the good rows of a labels file; every other row is a problem with its line
        (the first MAX_PROBLEMS listed, all counted). Rows with an empty verdict are skipped."""

        def work(session: Session, run: Run) -> dict[str, Any]:
            rows, unreadable = files.parse_file(data, format)
            result = files.import_rows(session, run.id, rows, who)
            problems = sorted([*unreadable, *result["problems"]], key=lambda p: int(p["line"]))
            return {
                "stored": result["stored"],
                "skipped": result["skipped"],
                "problems": problems[:MAX_PROBLEMS],
                "problems_total": len(problems),
            }

        return self._in_run(run_id, project, work)

    # --- the sample --------------------------------------------------------------------------

    def draw_sample(
        self, run_id: str, project: str, size: int, seed: int, who: str | None
    ) -> list[str]:
        """`size` of the run's scored items with claims, drawn at random with `seed` and kept
        (a new draw replaces the old one): their ids in the order drawn."""
        return self._in_run(
            run_id, project, lambda s, run: sampling.draw_sample(s, run, size, seed, who)
        )

    def sample(self, run_id: str, project: str) -> tuple[int, list[str]]:
        """The run's drawn sample: its seed and item ids (LabelError 404 when none was drawn)."""

        def read(session: Session, run: Run) -> tuple[int, list[str]]:
            drawn = sampling.sample_of(session, run.id)
            if drawn is None:
                raise LabelError(f"run {run.id} has no sample drawn", 404)
            return drawn.seed, list(drawn.item_keys)

        return self._in_run(run_id, project, read)

    def sample_rows(self, run_id: str, keys: Sequence[str]) -> list[dict[str, Any]]:
        """Every claim of these items of the sample, as rows of the labelling CSV, in their
        own transaction (the caller checked the project); none when the run was deleted."""
        with self.database.session() as session:
            run = session.get(Run, run_id)
            return [] if run is None else list(sampling.sample_rows(session, run, keys))

    @staticmethod
    def sample_lines(rows: Iterable[dict[str, Any]], header: bool = True) -> Iterator[str]:
        return sampling.sample_lines(rows, header=header)

    # --- agreement ---------------------------------------------------------------------------

    def agreement(
        self, run_id: str, project: str, by: str | None = None, against: str | None = None
    ) -> dict[str, Any]:
        """The judge against the labels, or with `against` against another run's judge on the
        same claims."""

        def read(session: Session, run: Run) -> dict[str, Any]:
            if against is None:
                return agreement.agreement_view(session, run, by)
            other = find_run(session, against, project)
            if other is None:
                raise LabelError(f"run {against[:80]} not found", 404)
            return agreement.against_view(session, run, other)

        return self._in_run(run_id, project, read)

    def agreement_if_labelled(self, run_id: str, project: str) -> dict[str, Any] | None:
        """The agreement view when the run has labels (the run page's panel), else None."""

        def read(session: Session, run: Run) -> dict[str, Any] | None:
            if not store.has_labels(session, run.id):
                return None
            return agreement.agreement_view(session, run)

        return self._in_run(run_id, project, read)

    # --- pages -------------------------------------------------------------------------------

    def item_labels(self, run_id: str, project: str, item_id: str) -> dict[int, dict[str, Any]]:
        """An item's labels by claim index (the item page)."""
        return self._in_run(run_id, project, lambda s, run: store.item_labels(s, run.id, item_id))

    def walk(self, run_id: str, project: str) -> Walk | None:
        """The run's sample, every claim of it in the order the labelling page walks them;
        None when no sample was drawn."""

        def read(session: Session, run: Run) -> Walk | None:
            drawn = sampling.sample_of(session, run.id)
            if drawn is None:
                return None
            keys = list(drawn.item_keys)
            return Walk(drawn.seed, keys, store.walk(session, run, keys))

        return self._in_run(run_id, project, read)


@dataclass(frozen=True)
class Walk:
    """A drawn sample as the labelling page walks it."""

    seed: int
    item_keys: list[str]
    steps: list[Step]


def _require_item(item_id: str) -> None:
    if not plausible_id(item_id):
        raise LabelError(f"item {item_id[:80]} not found", 404)
