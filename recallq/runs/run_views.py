"""The run view, once, for every front end: a run with its counts, summary, usage and failures
(aggregated over its items in one grouped scan, kept once the run completed), and runs newest
first with their cursors. recallq.runs.reads adds what only Redis knows (why a run waits)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    Text,
    and_,
    cast,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.orm import Session

from recallq.batch.store import run_lane_view
from recallq.core import compare as ab
from recallq.core.outcomes import Stage
from recallq.core.status import ITEM_IN_FLIGHT, RUN_ACTIVE, ItemStatus
from recallq.core.usage import NO_USAGE, Usage
from recallq.runs.item_views import no_context_condition
from recallq.runs.precision_views import (
    HISTOGRAM_BUCKETS,
    NO_PRECISION,
    PRECISION_HISTOGRAM,
    PrecisionAggregates,
    first_relevant_columns,
    histogram_columns,
    precision_columns,
    precision_summary,
)
from recallq.state import kept
from recallq.state.db import Database
from recallq.state.tables import Item, Run, utcnow

#: Failures grouped by error in a run view: the most frequent errors, up to this many.
FAILURE_GROUPS = 10
_STATUSES = list(ItemStatus)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


_COUNT = "count_"
_HISTOGRAM = "histogram_"


def _aggregate_columns(
    scale: Any, details: bool, no_static_context: ColumnElement[bool]
) -> list[ColumnElement[Any]]:
    """Counts, summary, usage and (with `details`) the score histogram of a run: one scan of
    its items (a 100k-item run is read by every status poll), each column labelled with the
    name RunAggregates reads it by. `scale` is the run's scale, and `no_static_context`
    whether the run has no static context, or the runs' columns when several runs are read
    at once."""
    ok = Item.status == ItemStatus.SUCCEEDED
    no_context = no_context_condition(no_static_context)

    def total(column: Any, zero: Any = 0) -> ColumnElement[Any]:
        return func.coalesce(func.sum(column), zero)

    columns: list[ColumnElement[Any]] = [
        *(
            func.count().filter(Item.status == status).label(_COUNT + status)
            for status in _STATUSES
        ),
        func.avg(Item.score).filter(ok).label("mean_score"),
        func.count(Item.score).filter(ok).label("scored"),
        func.avg(Item.score * Item.score).filter(ok).label("mean_square"),
        func.count().filter(ok, Item.ground_truth.is_(None)).label("no_ground_truth"),
        func.count().filter(ok, Item.ground_truth.is_not(None), no_context).label("no_context"),
        total(Item.claims_total).label("claims_total"),
        total(Item.claims_attributed).label("claims_attributed"),
        total(Item.llm_calls).label("llm_calls"),
        total(Item.prompt_tokens).label("prompt_tokens"),
        total(Item.completion_tokens).label("completion_tokens"),
        total(Item.cost_usd, 0.0).label("cost_usd"),
        total(Item.cache_hits).label("claim_cache_hits"),
        total(Item.call_attempts).label("call_attempts"),
        total(Item.failed_calls).label("failed_calls"),
        total(Item.deferrals).label("deferrals"),
        total(Item.extraction_calls).label("extraction_calls"),
        total(Item.extraction_prompt_tokens).label("extraction_prompt_tokens"),
        total(Item.extraction_completion_tokens).label("extraction_completion_tokens"),
        total(Item.extraction_cost_usd, 0.0).label("extraction_cost_usd"),
        total(Item.relevance_calls).label("relevance_calls"),
        total(Item.relevance_prompt_tokens).label("relevance_prompt_tokens"),
        total(Item.relevance_completion_tokens).label("relevance_completion_tokens"),
        total(Item.relevance_cost_usd, 0.0).label("relevance_cost_usd"),
        *precision_columns(ok),
    ]
    if details:
        columns += histogram_columns(Item.score, scale, ok, _HISTOGRAM)
        columns += histogram_columns(Item.context_precision, scale, ok, PRECISION_HISTOGRAM)
        columns += first_relevant_columns(ok)
    return columns


def _failures(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's failed items grouped by error, most frequent first, with one example id."""
    rows = session.execute(
        select(Item.error, func.count(), func.min(Item.key))
        .where(Item.run_id == run_id, Item.status == ItemStatus.FAILED)
        .group_by(Item.error)
        .order_by(func.count().desc(), Item.error)
        .limit(FAILURE_GROUPS)
    ).all()
    return [{"error": error or "", "count": n, "example_id": key} for error, n, key in rows]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class RunAggregates:
    """What a run view derives from the run's items, read from the aggregate row by column
    name, and with details the histogram and the failures by error. A completed run's is kept
    (recallq.state.kept) as `body()`, under RUN_VIEW_SHAPE."""

    counts: dict[ItemStatus, int]
    mean_score: float | None
    scored: int
    mean_square: float | None
    no_ground_truth: int
    no_context: int
    claims_total: int
    claims_attributed: int
    #: every stage's usage; `extraction` is the extraction stage's part of it
    usage: Usage
    extraction: Usage
    claim_cache_hits: int
    deferrals: int
    histogram: list[int] | None
    failures: list[dict[str, Any]] | None
    #: the relevance stage's part of `usage` (precision "judged")
    relevance: Usage = NO_USAGE
    precision: PrecisionAggregates = NO_PRECISION

    @classmethod
    def of_row(
        cls, row: RowMapping | None, failures: list[dict[str, Any]] | None, details: bool
    ) -> RunAggregates:
        """From an aggregate row (None: a run without items, which no store makes, but a view
        must not fail for it)."""
        if row is None:
            return cls(
                {status: 0 for status in _STATUSES}, None, 0, None, 0, 0, 0, 0, NO_USAGE, NO_USAGE,
                0, 0, [0] * HISTOGRAM_BUCKETS if details else None, [] if details else None,
            )  # fmt: skip
        return cls(
            counts={status: int(row[_COUNT + status]) for status in _STATUSES},
            mean_score=_float(row["mean_score"]),
            scored=int(row["scored"]),
            mean_square=_float(row["mean_square"]),
            no_ground_truth=int(row["no_ground_truth"]),
            no_context=int(row["no_context"]),
            claims_total=int(row["claims_total"]),
            claims_attributed=int(row["claims_attributed"]),
            usage=Usage(
                llm_calls=int(row["llm_calls"]),
                prompt_tokens=int(row["prompt_tokens"]),
                completion_tokens=int(row["completion_tokens"]),
                cost_usd=float(row["cost_usd"]),
                call_attempts=int(row["call_attempts"]),
                failed_calls=int(row["failed_calls"]),
            ),
            extraction=Usage(
                llm_calls=int(row["extraction_calls"]),
                prompt_tokens=int(row["extraction_prompt_tokens"]),
                completion_tokens=int(row["extraction_completion_tokens"]),
                cost_usd=float(row["extraction_cost_usd"]),
            ),
            claim_cache_hits=int(row["claim_cache_hits"]),
            deferrals=int(row["deferrals"]),
            histogram=(
                [int(row[f"{_HISTOGRAM}{i}"]) for i in range(HISTOGRAM_BUCKETS)]
                if details
                else None
            ),
            failures=failures,
            relevance=Usage(
                llm_calls=int(row["relevance_calls"]),
                prompt_tokens=int(row["relevance_prompt_tokens"]),
                completion_tokens=int(row["relevance_completion_tokens"]),
                cost_usd=float(row["relevance_cost_usd"]),
            ),
            precision=PrecisionAggregates.of_row(row, details),
        )

    def body(self) -> dict[str, Any]:
        """As kept: JSON, by name."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {
            "counts": {str(status): n for status, n in self.counts.items()},
            "usage": dataclasses.asdict(self.usage),
            "extraction": dataclasses.asdict(self.extraction),
            "relevance": dataclasses.asdict(self.relevance),
            "precision": dataclasses.asdict(self.precision),
        }

    @classmethod
    def of_body(cls, body: Any) -> RunAggregates:
        """Read back from `body()`. Raises kept.Misshapen for a body of another shape."""
        try:
            names = {f.name for f in dataclasses.fields(cls)}
            if not isinstance(body, dict) or set(body) != names:
                raise ValueError(f"fields {sorted(body) if isinstance(body, dict) else body!r}")
            counts = body["counts"]
            if set(counts) != {str(status) for status in _STATUSES}:
                raise ValueError(f"statuses {sorted(counts)}")
            histogram = body["histogram"]
            if histogram is not None and len(histogram) != HISTOGRAM_BUCKETS:
                raise ValueError(f"{len(histogram)} histogram buckets")
            return cls(
                **(
                    body
                    | {
                        "counts": {ItemStatus(status): int(n) for status, n in counts.items()},
                        "usage": Usage(**body["usage"]),
                        "extraction": Usage(**body["extraction"]),
                        "relevance": Usage(**body["relevance"]),
                        "precision": PrecisionAggregates(**body["precision"]),
                    }
                )  # fmt: skip
            )
        except (KeyError, TypeError, ValueError) as problem:
            raise kept.Misshapen(f"not a run view's aggregates: {problem}") from problem


def _no_static_context() -> ColumnElement[bool]:
    """Whether a run (the runs row of the statement) has no static context."""
    return or_(Run.context.is_(None), cast(Run.context, Text).in_(["null", "[]"]))


#: Bumped when a column counts differently (2: no_context counts the items without a context
#: of their own in a run without a static one).
RUN_VIEW_RULES = 2
#: The shape of a kept run view: the aggregate columns' names and the fields that hold them,
#: so adding a column, a field or a status gives kept views a new shape (computed again), and
#: the version of the rules that count them.
RUN_VIEW_SHAPE = kept.shape(
    "run",
    [str(column.key) for column in _aggregate_columns(1.0, True, false())],
    [f.name for f in dataclasses.fields(RunAggregates)],
    [f.name for f in dataclasses.fields(Usage)],
    [f.name for f in dataclasses.fields(PrecisionAggregates)],
    ["rules", RUN_VIEW_RULES],
)
_RUN_VIEW = kept.Kind("run", RUN_VIEW_SHAPE, RunAggregates.body, RunAggregates.of_body)
#: Kept comparisons and group summaries: their bodies are the answers' JSON, whose shape is
#: the contract's; the number is bumped when a body changes.


def _aggregates(session: Session, run: Run, row: RowMapping | None, details: bool) -> RunAggregates:
    failed = 0 if row is None else row[_COUNT + ItemStatus.FAILED]
    failures = (_failures(session, run.id) if failed else []) if details else None
    return RunAggregates.of_row(row, failures, details)


def _view(session: Session, run: Run, aggregates: RunAggregates, details: bool) -> dict[str, Any]:
    a = aggregates
    counts = a.counts
    summary: dict[str, Any] = {
        "mean_score": round(a.mean_score, 4) if a.mean_score is not None else None,
        "mean_ci95": ab.mean_interval(a.scored, a.mean_score, a.mean_square, run.scale),
        "scored_items": a.scored,
        "claims_total": a.claims_total,
        "claims_attributed": a.claims_attributed,
        # scored 0 because there was nothing to check, not because retrieval missed
        "no_ground_truth": a.no_ground_truth,
        # scored 0 because no passage was retrieved: usually the pipeline feeding recallq
        "no_context": a.no_context,
    }
    if details and a.histogram is not None:
        edges = [round(run.scale * i / HISTOGRAM_BUCKETS, 6) for i in range(HISTOGRAM_BUCKETS + 1)]
        summary["histogram"] = {"edges": edges, "counts": a.histogram}
    summary |= precision_summary(a.precision, run.scale, details)
    view: dict[str, Any] = {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "model": run.model,
        "scale": run.scale,
        "mode": run.mode,
        "precision": run.precision,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "retry_deadline_s": run.retry_deadline_s,
        "budget_usd": run.budget_usd,
        "budget_tokens": run.budget_tokens,
        "cancel_reason": run.cancel_reason,
        "counts": {
            "total": run.total_items,
            ItemStatus.PENDING: counts[ItemStatus.PENDING] + counts[ItemStatus.QUEUED],
            ItemStatus.RUNNING: counts[ItemStatus.RUNNING] + counts[ItemStatus.BATCHED],
            ItemStatus.SUCCEEDED: counts[ItemStatus.SUCCEEDED],
            ItemStatus.FAILED: counts[ItemStatus.FAILED],
            ItemStatus.CANCELLED: counts[ItemStatus.CANCELLED],
        },
        "summary": summary,
        "usage": a.usage.spent()
        | {
            "claim_cache_hits": a.claim_cache_hits,
            "call_attempts": a.usage.call_attempts,
            "failed_calls": a.usage.failed_calls,
            "deferrals": a.deferrals,
            "by_stage": {
                Stage.EXTRACTION: a.extraction.spent(),
                Stage.ATTRIBUTION: (a.usage - a.extraction - a.relevance).spent(),
            },
        },
    }
    if run.precision == "judged" or a.relevance.llm_calls:  # the stage of judged precision
        view["usage"]["by_stage"][Stage.RELEVANCE] = a.relevance.spent()
    # the provider batch lane: usage by lane and stage (additive), and a batch run's progress
    lane = run_lane_view(session, run, a.usage)
    view["usage"].update(lane["usage"])
    view["batch"] = lane["batch"]
    if a.failures is not None:
        view["failures"] = a.failures
    return view


def run_view(session: Session, run: Run, details: bool = True) -> dict[str, Any]:
    """The run object of the contract, plus `summary.no_ground_truth` and, with `details`,
    `summary.histogram` and `failures` (failed items grouped by error). Progress polls of a
    process that prints the details at the end pass details=False: a quarter less work. What
    it derives from a completed run's items is kept (recallq.state.kept)."""

    def aggregate() -> RunAggregates:
        row = session.execute(
            select(
                *_aggregate_columns(run.scale, details, false() if run.context else true())
            ).where(Item.run_id == run.id)
        ).one()
        return _aggregates(session, run, row._mapping, details)

    aggregates = kept.get_or_compute(session, _RUN_VIEW, [run], aggregate, details=details)
    return _view(session, run, aggregates, details)


def keep_view(database: Database, run_id: str) -> None:
    """A run has just completed: its run object, computed now and kept (Runtime.on_completed)."""
    with database.session() as session:
        run = session.get(Run, run_id)
        if run is not None:
            run_view(session, run)


def run_views(session: Session, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The views of several runs: those kept read back, the others' items read in one grouped
    scan (and kept, for completed runs)."""
    if not runs:
        return []
    keys = {run.id: kept.key(_RUN_VIEW, [run], details=True) for run in runs}
    found = kept.read(session, _RUN_VIEW, [key for key in keys.values() if key is not None])
    aggregates = {run.id: found[key] for run in runs if (key := keys[run.id]) in found}
    computing = [run for run in runs if run.id not in aggregates]
    if computing:
        rows = session.execute(
            select(
                Item.run_id.label("run_id"),
                *_aggregate_columns(Run.scale, True, _no_static_context()),
            )
            .join(Run, Run.id == Item.run_id)
            .where(Item.run_id.in_([run.id for run in computing]))
            .group_by(Item.run_id)
        ).all()
        scanned = {row.run_id: row._mapping for row in rows}
        keeping: list[kept.View] = []
        for run in computing:
            body = kept.as_json(_aggregates(session, run, scanned.get(run.id), True).body())
            aggregates[run.id] = RunAggregates.of_body(body)
            if (key := keys[run.id]) is not None:
                keeping.append(kept.View(key, run.id, None, body))
        kept.keep(session, _RUN_VIEW, keeping)
    return [_view(session, run, aggregates[run.id], True) for run in runs]


# --- runs, newest first ----------------------------------------------------------------------

RunCursor = tuple[datetime, str]


def list_runs(
    session: Session,
    project: str,
    *,
    status: str | None = None,
    name: str | None = None,
    limit: int = 20,
    after: RunCursor | None = None,
) -> tuple[list[dict[str, Any]], RunCursor | None]:
    """A page of the project's runs, newest first, and the cursor of the next page (None on
    the last). `name` matches exactly."""
    query = select(Run).where(Run.project == project)
    if status:
        query = query.where(Run.status == status)
    if name is not None:
        query = query.where(Run.name == name)
    if after is not None:
        created, run_id = after
        query = query.where(
            or_(Run.created_at < created, and_(Run.created_at == created, Run.id < run_id))
        )
    runs = list(
        session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1))
    )
    more = len(runs) > limit
    runs = runs[:limit]
    cursor = (runs[-1].created_at, runs[-1].id) if more else None
    return run_views(session, runs), cursor


#: A runs cursor: the last run's created_at in microseconds since the epoch, `u` (UTC) or `n`
#: (a naive time, SQLite), and its id. Every string of this pattern is one the database can
#: compare, so the served spec can say exactly which cursors are valid.
RUN_CURSOR_PATTERN = r"^[0-9]{1,16}[un]\.[A-Za-z0-9-]{1,64}$"
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def encode_run_cursor(cursor: RunCursor | None) -> str | None:
    if cursor is None:
        return None
    created, run_id = cursor
    aware = created.tzinfo is not None
    micros = (created - (_EPOCH.replace(tzinfo=UTC) if aware else _EPOCH)) // _MICROSECOND
    return f"{micros}{'u' if aware else 'n'}.{run_id}"


def decode_run_cursor(cursor: str) -> RunCursor:
    """Raises ValueError for a cursor this module did not make."""
    if re.fullmatch(RUN_CURSOR_PATTERN, cursor) is None:
        raise ValueError("not a runs cursor")
    time, run_id = cursor.split(".", 1)
    epoch = _EPOCH.replace(tzinfo=UTC) if time[-1] == "u" else _EPOCH
    return epoch + int(time[:-1]) * _MICROSECOND, run_id


def mark_interrupted(session: Session, views: Sequence[dict[str, Any]]) -> None:
    """Set `interrupted` on the views of local runs that are queued or running with no
    process scoring them. Nothing else scores a local run, and a scoring process holds a live
    lease on the items it handed out (queued or running); a Ctrl-C hands them back (`release`
    below), so an active run without a live lease was stopped. The run keeps its status."""
    active = [view["id"] for view in views if view["status"] in RUN_ACTIVE]
    if not active:
        return
    live = set(
        session.scalars(
            select(Item.run_id)
            .where(
                Item.run_id.in_(active),
                Item.status.in_(ITEM_IN_FLIGHT),
                Item.lease_until > utcnow(),
            )
            .distinct()
        )
    )
    for view in views:
        if view["id"] in active and view["id"] not in live:
            view["interrupted"] = True
