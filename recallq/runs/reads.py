"""Every read of a run, once, for every front end: the HTTP routes, the web pages, the CLI
(local and remote) and `recallq.evaluate` read runs, items, comparisons and slices here, so a
run looks the same wherever it is read.

    view          the run object (recallq.runs.run_views), and why an active run waits
                  (its provider's incident, or no live worker: what Redis knows); when
                  Redis cannot be reached, what Postgres knows with `waiting_unknown`
    list_runs     a page of the project's runs, newest first
    brief         what a page about a run's items shows of the run (no scan of its items)
    items, item, items_table, metadata_fields, results
    group_summary, compare (with the labels' corrected difference)

Every method takes the caller's project: another project's run is not found, like a missing
one (RunNotFound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recallq.core import inputs
from recallq.core.errors import SharedStateUnavailable
from recallq.core.status import RUN_ACTIVE
from recallq.labels import agreement as label_agreement
from recallq.runs import comparisons, item_views, run_views
from recallq.state.db import Database
from recallq.state.runs import RunNotFound, find_run, plausible_id
from recallq.state.tables import Run

if TYPE_CHECKING:
    from recallq.execution.runtime import Runtime


#: Runs an ambiguous id prefix names, at most, in its error.
AMBIGUOUS_SHOWN = 5


class AmbiguousRunId(LookupError):
    """A run id prefix that more than one run's id starts with."""

    def __init__(self, prefix: str, matches: list[str]) -> None:
        shown = ", ".join(matches[:AMBIGUOUS_SHOWN])
        more = " ..." if len(matches) > AMBIGUOUS_SHOWN else ""
        super().__init__(f"run id {prefix!r} is the start of several runs' ids: {shown}{more}")


class RunReads:
    """The reads of runs in one database (see the module docstring). `waiting` says why runs
    of a model cannot make progress now (Runtime.waiting: it asks Redis); without it, as for
    the CLI reading a local database, no run is said to wait. `local`: the database is local
    mode's, where an active run that no process scores is `interrupted`."""

    def __init__(
        self,
        database: Database,
        *,
        waiting: Callable[[str], dict[str, Any] | None] | None = None,
        local: bool = False,
    ) -> None:
        self.database = database
        self._waiting = waiting
        self._local = local

    @classmethod
    def of(cls, runtime: Runtime, *, local: bool = False) -> RunReads:
        """The reads of a process's runtime, with why its runs wait."""
        return cls(runtime.database, waiting=runtime.waiting, local=local)

    # --- runs --------------------------------------------------------------------------------

    def run(self, run_id: str, project: str) -> Run:
        """The project's run (RunNotFound for another project's or none)."""
        with self.database.session() as session:
            return self._run(session, run_id, project)

    def expand_id(self, prefix: str, project: str) -> str:
        """The id of the project's one run whose id is `prefix` or starts with it (what a
        person copies from `recallq runs`: the first 8 characters). `prefix` itself when no
        run matches (the read that follows says it is not found); AmbiguousRunId, naming
        them, when several do."""
        if not plausible_id(prefix) or not prefix:
            return prefix
        with self.database.session() as session:
            if find_run(session, prefix, project) is not None:
                return prefix
            pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            found = list(
                session.scalars(
                    select(Run.id)
                    .where(Run.project == project, Run.id.like(pattern, escape="\\"))
                    .order_by(Run.id)
                    .limit(AMBIGUOUS_SHOWN + 1)
                )
            )
        if len(found) > 1:
            raise AmbiguousRunId(prefix, found)
        return found[0] if found else prefix

    def view(
        self, run_id: str, project: str, *, by: str | None = None, details: bool = True
    ) -> dict[str, Any]:
        """The run object; with `by`, its summary by that metadata field (`by_group`;
        recallq.core.groups.UnknownField when no item has it)."""
        with self.database.session() as session:
            view = self.view_of(session, self._run(session, run_id, project), details)
            if by is not None:
                view["by_group"] = comparisons.group_summary(session, run_id, by)
        return view

    def view_of(self, session: Session, run: Run, details: bool = True) -> dict[str, Any]:
        """The one definition of a run object: what Postgres knows (run_views.run_view), and
        for an active run why it waits, which only Redis knows. Redis unreachable: `waiting`
        is None and `waiting_unknown` true; the rest still answers."""
        view = run_views.run_view(session, run, details)
        view["waiting"], view["waiting_unknown"] = None, False
        if run.status in RUN_ACTIVE and self._waiting is not None:
            try:
                view["waiting"] = self._waiting(run.model)
            except SharedStateUnavailable:
                view["waiting_unknown"] = True
        if self._local:
            run_views.mark_interrupted(session, [view])
        return view

    def list_runs(
        self,
        project: str,
        *,
        status: str | None = None,
        name: str | None = None,
        limit: int = 20,
        after: run_views.RunCursor | None = None,
    ) -> tuple[list[dict[str, Any]], run_views.RunCursor | None]:
        """A page of the project's runs, newest first, and the next page's cursor. A name
        no run can have (a text problem: NUL, a lone surrogate) matches none."""
        if name is not None and inputs.text_problem(name) is not None:
            return [], None
        with self.database.session() as session:
            views, cursor = run_views.list_runs(
                session, project, status=status, name=name, limit=limit, after=after
            )
            if self._local:
                run_views.mark_interrupted(session, views)
        return views, cursor

    def choices(self, project: str, limit: int) -> list[dict[str, Any]]:
        """The project's newest runs, as a form offers them: id, name, created_at."""
        with self.database.session() as session:
            rows = session.execute(
                select(Run.id, Run.name, Run.created_at)
                .where(Run.project == project)
                .order_by(Run.created_at.desc(), Run.id.desc())
                .limit(limit)
            )
            return [
                {"id": run_id, "name": name, "created_at": created.isoformat()}
                for run_id, name, created in rows
            ]

    def brief(self, run_id: str, project: str) -> dict[str, Any]:
        """What a page about a run's items shows of the run (no aggregate over its items)."""
        return brief_of(self.run(run_id, project))

    # --- items -------------------------------------------------------------------------------

    def items(
        self,
        run_id: str,
        project: str,
        *,
        status: str | None = None,
        limit: int = 100,
        after: int | None = None,
        item_data: bool = True,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of the run's items by index, and the index the next page starts after."""
        with self.database.session() as session:
            self._run(session, run_id, project)
            return item_views.items_page(session, run_id, status, limit, after, item_data)

    def item(
        self, run_id: str, project: str, item_id: str, item_data: bool = True
    ) -> dict[str, Any] | None:
        """One item of the run with its claims; None when the run has no such item."""
        with self.database.session() as session:
            self._run(session, run_id, project)
            if not plausible_id(item_id):
                return None
            return item_views.get_item(session, run_id, item_id, item_data)

    def items_table(
        self,
        run_id: str,
        project: str,
        where: item_views.ItemFilter,
        limit: int,
        after: item_views.ItemsCursor | None,
    ) -> item_views.ItemsTable:
        with self.database.session() as session:
            self._run(session, run_id, project)
            return item_views.items_table(session, run_id, where, limit, after)

    def metadata_fields(self, run_id: str, project: str, every: bool = False) -> list[str]:
        """The metadata fields of the run's first items (`every`: of all its items)."""
        with self.database.session() as session:
            self._run(session, run_id, project)
            return item_views.metadata_fields(session, run_id, None if every else 200)

    def results(
        self, run_id: str, after: int | None, limit: int, item_data: bool = True
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One page of every result, in its own short transaction (a result stream reads page
        by page, holding nothing while its reader is slow). The caller checked the project."""
        with self.database.session() as session:
            return item_views.items_page(session, run_id, None, limit, after, item_data)

    def iter_results(self, run_id: str, project: str) -> Iterator[dict[str, Any]]:
        """Every item of the run with its claims, in index order."""
        self.run(run_id, project)
        after: int | None = None
        while True:
            page, after = self.results(run_id, after, 500)
            yield from page
            if after is None:
                return

    # --- comparing and slicing ---------------------------------------------------------------

    def group_summary(self, run_id: str, project: str, by: str) -> dict[str, dict[str, Any]]:
        """The run's items by the value of metadata field `by` (UnknownField when none has it)."""
        with self.database.session() as session:
            self._run(session, run_id, project)
            return comparisons.group_summary(session, run_id, by)

    def compare(
        self,
        base: str,
        candidate: str,
        project: str,
        *,
        by: str | None = None,
        top: int = 10,
        pairs: int = 0,
    ) -> dict[str, Any]:
        """`candidate` against `base` (comparisons.compare_runs; IncomparableRuns for runs of
        different scales), with `corrected`: the mean difference corrected by both runs'
        labels of random samples (None unless both have them). Computed on every read, not
        kept with the comparison: labels change after runs end."""
        with self.database.session() as session:
            base_run = self._run(session, base, project)
            candidate_run = self._run(session, candidate, project)
            comparison = comparisons.compare_runs(
                session, base_run, candidate_run, by=by, top=top, pairs=pairs
            )
            corrected = label_agreement.corrected_comparison(
                session, base_run, candidate_run, comparison
            )
        return {**comparison, "corrected": corrected}

    @staticmethod
    def _run(session: Session, run_id: str, project: str) -> Run:
        run = find_run(session, run_id, project)
        if run is None:
            raise RunNotFound(run_id)
        return run


def brief_of(run: Run) -> dict[str, Any]:
    """What a page about a run's items shows of the run (no aggregate over its items)."""
    return {
        "id": run.id,
        "name": run.name,
        "model": run.model,
        "scale": run.scale,
        "status": run.status,
        "counts": {"total": run.total_items},
    }
