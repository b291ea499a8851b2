"""The provider batch lane's state in Postgres: its batches and their request lines.

A batch's state is written *before* the provider call it announces, so that a worker killed
anywhere leaves a state the next poll finishes from, and nothing is sent twice:

    building ──upload──► uploaded ──► creating ──create_batch──► submitted ──► done
        (lines taken)    (file id)    (intent: the call     (provider       (every answer
                                       may have gone out)    batch id)       applied)
    building | uploaded | creating (not found at the provider) ──► dropped

A `creating` batch whose create call lost its answer is found again at the provider by the
metadata it was created with (our batch id) before anything is created again. A batch whose
run was cancelled or deleted is dropped before the provider sees it, or cancelled there.

A request line is `ready` until a batch takes it, `sent` while in one, then `answered`,
`failed` (the provider did not answer it) or `dropped` (its batch never reached the
provider). Closing a line is guarded by its state, and the lane closes it in the same
transaction as the item write its answer causes (recallq.state.batched_items), so an
answer is applied exactly once, whatever crashes, however often a poll starts again.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, exists, func, insert, select, update
from sqlalchemy.orm import Session

from recallq.batch.requests import Request
from recallq.core.outcomes import Stage
from recallq.core.status import ItemStatus, RunStatus
from recallq.core.usage import NO_USAGE, Usage
from recallq.state.claim_cache import ClaimCache
from recallq.state.db import Database
from recallq.state.tables import (
    BatchLine,
    Claim,
    Item,
    ProviderBatch,
    Run,
    RunMode,
    as_utc,
    utcnow,
)

batches, lines = cast(Table, ProviderBatch.__table__), cast(Table, BatchLine.__table__)
items, runs = cast(Table, Item.__table__), cast(Table, Run.__table__)
claims = cast(Table, Claim.__table__)

#: pg_try_advisory_lock key of the one poller ("recallq" in ASCII).
POLLER_LOCK = 0x7265_6361_6C6C_71


class BatchState(StrEnum):
    BUILDING = "building"  # lines taken; nothing sent yet
    UPLOADED = "uploaded"  # its input file is at the provider
    CREATING = "creating"  # the create call may have gone out: look for it before another
    SUBMITTED = "submitted"  # the provider has it
    DONE = "done"  # every answer applied
    DROPPED = "dropped"  # never reached the provider (its lines go again, or its run ended)


class LineState(StrEnum):
    READY = "ready"
    SENT = "sent"
    ANSWERED = "answered"
    FAILED = "failed"
    DROPPED = "dropped"


OPEN_LINES = (LineState.READY, LineState.SENT)
PENDING_BATCHES = (
    BatchState.BUILDING,
    BatchState.UPLOADED,
    BatchState.CREATING,
    BatchState.SUBMITTED,
)


#: An item's context passages: its own, or (NULL) the run's static context, stored once.
CONTEXTS = func.coalesce(items.c.contexts, runs.c.context).label("contexts")


@dataclass(frozen=True)
class LaneRun:
    """A batch-mode run as the lane sees it."""

    id: str
    project: str
    model: str
    scale: float
    retry_deadline_s: float | None
    precision: str = "cited"  # cited | judged (a relevance request after attribution) | off


@dataclass(frozen=True)
class BatchRow:
    """A batch the lane has to move on, with its run's status (None: the run was deleted)."""

    id: str
    run_id: str | None
    run_status: str | None
    model: str
    stage: str
    state: str
    provider_status: str | None
    provider_batch_id: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    created_at: datetime
    creating_at: datetime | None
    waiting_since: datetime | None
    retry_deadline_s: float | None
    scale: float | None
    project: str | None
    precision: str | None = None

    @property
    def run_gone(self) -> bool:
        """Its run was cancelled or deleted: nothing of it is to be scored."""
        return self.run_id is None or self.run_status == RunStatus.CANCELLED


@dataclass(frozen=True)
class LineRow:
    """A request line with what its item needs to render and to apply it."""

    request: Request
    item_id: int
    ground_truth: str | None
    waiting_since: datetime | None


@dataclass(frozen=True)
class Unplanned:
    """A batched item without a request on its way: its next step is the lane's to plan."""

    item_id: int
    ground_truth: str | None
    contexts: tuple[str, ...]
    claims: tuple[str, ...] | None  # known already (a retried item keeps its claims)


@dataclass(frozen=True)
class NewLine:
    """A request to add, ready for the next batch. `claim_indices` are the indices it asks:
    claims for an attribution, passages for a relevance request (None: all)."""

    run_id: str
    item_id: int
    stage: Stage
    claim_indices: list[int] | None = None
    reask: bool = False
    carry: dict[str, Any] | None = None


class LaneStore:
    """Reads and writes of the lane's batches and lines (see the module docstring)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Whether this process is the one poller now (Postgres: a session advisory lock,
        released when the connection closes, so a killed worker never holds it; SQLite: one
        process, always). Held for the whole poll: the Redis lock that spaces polls out is
        lost with a Redis restart, this one is not."""
        if self._db.dialect != "postgresql":
            yield True
            return
        with self._db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            held = bool(conn.execute(select(func.pg_try_advisory_lock(POLLER_LOCK))).scalar())
            try:
                yield held
            finally:
                if held:
                    conn.execute(select(func.pg_advisory_unlock(POLLER_LOCK)))

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self._db.transaction() as conn:
            yield conn

    # --- runs and planning ------------------------------------------------------------------

    def running_runs(self) -> list[LaneRun]:
        """The batch-mode runs being scored."""
        with self._db.single_statement() as conn:
            rows = conn.execute(
                select(
                    runs.c.id,
                    runs.c.project,
                    runs.c.model,
                    runs.c.scale,
                    runs.c.retry_deadline_s,
                    runs.c.precision,
                )
                .where(runs.c.status == RunStatus.RUNNING, runs.c.mode == RunMode.BATCH)
                .order_by(runs.c.created_at)
            ).all()
        return [
            LaneRun(r.id, r.project, r.model, r.scale, r.retry_deadline_s, r.precision)
            for r in rows
        ]

    def unplanned(self, run_id: str, limit: int) -> list[Unplanned]:
        """Batched items of the run with no request ready or sent: adopted just now, or left
        by a poll that crashed between adopting and planning them."""
        open_line = exists().where(lines.c.item_id == items.c.id, lines.c.state.in_(OPEN_LINES))
        with self._db.single_statement() as conn:
            rows = conn.execute(
                select(items.c.id, items.c.ground_truth, CONTEXTS)
                .join_from(items, runs, runs.c.id == items.c.run_id)
                .where(
                    items.c.run_id == run_id,
                    items.c.status == ItemStatus.BATCHED,
                    ~open_line,
                )
                .order_by(items.c.id)
                .limit(limit)
            ).all()
            known = _claims_of(conn, [r.id for r in rows])
        return [
            Unplanned(r.id, r.ground_truth, tuple(r.contexts or ()), known.get(r.id)) for r in rows
        ]

    def cached_claims(self, keys: list[str]) -> dict[str, list[str]]:
        """What the claim cache holds for these keys (ground truth, model, prompt version)."""
        with self._db.single_statement() as conn:
            return ClaimCache.read(conn, keys)

    @staticmethod
    def add_lines(conn: Connection, new: Sequence[NewLine]) -> None:
        """Requests ready for the next batch."""
        if not new:
            return
        now = utcnow()
        conn.execute(
            insert(lines),
            [
                {
                    "run_id": line.run_id,
                    "item_id": line.item_id,
                    "stage": line.stage,
                    "state": LineState.READY,
                    "claim_indices": line.claim_indices,
                    "reask": line.reask,
                    "carry": line.carry,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "cost_usd": 0.0,
                    "created_at": now,
                }
                for line in new
            ],
        )

    # --- requests ---------------------------------------------------------------------------

    def ready(self, run_id: str, stage: Stage, limit: int) -> list[LineRow]:
        """Requests of the run's stage waiting for a batch, oldest first."""
        where = and_(
            lines.c.run_id == run_id, lines.c.stage == stage, lines.c.state == LineState.READY
        )
        return self._line_rows(where, limit)

    def sent(self, batch_id: str, after: int = 0, limit: int | None = None) -> list[LineRow]:
        """The requests a batch carries that have no answer applied yet (line ids above
        `after`, at most `limit`)."""
        where = and_(
            lines.c.batch_id == batch_id, lines.c.state == LineState.SENT, lines.c.id > after
        )
        return self._line_rows(where, limit)

    def _line_rows(self, where: Any, limit: int | None) -> list[LineRow]:
        with self._db.single_statement() as conn:
            rows = conn.execute(
                select(
                    lines.c.id,
                    lines.c.item_id,
                    lines.c.stage,
                    lines.c.claim_indices,
                    lines.c.reask,
                    lines.c.carry,
                    items.c.ground_truth,
                    CONTEXTS,
                    items.c.waiting_since,
                )
                .join_from(lines, items, items.c.id == lines.c.item_id)
                .join(runs, runs.c.id == items.c.run_id)
                .where(where)
                .order_by(lines.c.id)
                .limit(limit)
            ).all()
            attributing = [r.item_id for r in rows if r.stage != Stage.EXTRACTION]
            known = _claims_of(conn, attributing)
        return [
            LineRow(
                Request(
                    line_id=r.id,
                    stage=Stage(r.stage),
                    ground_truth=r.ground_truth,
                    claims=known.get(r.item_id, ()),
                    contexts=tuple(r.contexts or ()),
                    asked=None if r.claim_indices is None else tuple(r.claim_indices),
                    reask=bool(r.reask),
                    carry=r.carry,
                ),
                r.item_id,
                r.ground_truth,
                None if r.waiting_since is None else as_utc(r.waiting_since),
            )
            for r in rows
        ]

    @staticmethod
    def close_line(
        conn: Connection,
        line_id: int,
        batch_id: str,
        state: LineState,
        usage: Usage,
        error: str | None = None,
    ) -> bool:
        """sent → answered | failed, with what it used; False when it was closed before
        (its answer was applied already, by a poll that crashed after this commit)."""
        written = conn.execute(
            update(lines)
            .where(
                lines.c.id == line_id,
                lines.c.batch_id == batch_id,
                lines.c.state == LineState.SENT,
            )
            .values(
                state=state,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cost_usd=usage.cost_usd,
                error=error,
            )
        ).rowcount
        return bool(written)

    # --- batches ----------------------------------------------------------------------------

    def open_batch(self, run_id: str, model: str, stage: Stage, line_ids: Sequence[int]) -> str:
        """A new batch (building) that takes these ready lines (→ sent); returns its id."""
        batch_id = str(uuid.uuid4())
        with self._db.transaction() as conn:
            conn.execute(
                insert(batches).values(
                    id=batch_id,
                    run_id=run_id,
                    model=model,
                    stage=stage,
                    state=BatchState.BUILDING,
                    requests=len(line_ids),
                    bytes=0,
                    completed=0,
                    failed=0,
                    created_at=utcnow(),
                )
            )
            taken = conn.execute(
                update(lines)
                .where(lines.c.id.in_(list(line_ids)), lines.c.state == LineState.READY)
                .values(state=LineState.SENT, batch_id=batch_id)
            ).rowcount
            if taken != len(line_ids):  # another poller took some: give this batch up whole
                raise RuntimeError(f"batch {batch_id}: {len(line_ids) - taken} line(s) taken")
        return batch_id

    def batch(self, batch_id: str) -> BatchRow | None:
        found = self._batch_rows(batches.c.id == batch_id)
        return found[0] if found else None

    def batches(self, states: Sequence[BatchState]) -> list[BatchRow]:
        """Batches in these states, oldest first, with their runs' status."""
        return self._batch_rows(batches.c.state.in_(list(states)))

    def _batch_rows(self, where: Any) -> list[BatchRow]:
        with self._db.single_statement() as conn:
            rows = conn.execute(
                select(
                    batches,
                    runs.c.status.label("run_status"),
                    runs.c.retry_deadline_s,
                    runs.c.scale,
                    runs.c.project,
                    runs.c.precision,
                )
                .join_from(batches, runs, runs.c.id == batches.c.run_id, isouter=True)
                .where(where)
                .order_by(batches.c.created_at)
            ).all()
        return [
            BatchRow(
                id=r.id,
                run_id=r.run_id,
                run_status=r.run_status,
                model=r.model,
                stage=r.stage,
                state=r.state,
                provider_status=r.provider_status,
                provider_batch_id=r.provider_batch_id,
                input_file_id=r.input_file_id,
                output_file_id=r.output_file_id,
                error_file_id=r.error_file_id,
                created_at=as_utc(r.created_at),
                creating_at=None if r.creating_at is None else as_utc(r.creating_at),
                waiting_since=None if r.waiting_since is None else as_utc(r.waiting_since),
                retry_deadline_s=r.retry_deadline_s,
                scale=r.scale,
                project=r.project,
                precision=r.precision,
            )
            for r in rows
        ]

    def _move(self, batch_id: str, from_states: Sequence[BatchState], **values: Any) -> bool:
        """One guarded move of a batch; False when it was no longer in `from_states`."""
        with self._db.single_statement() as conn:
            return bool(
                conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id, batches.c.state.in_(list(from_states)))
                    .values(**values)
                ).rowcount
            )

    def uploaded(self, batch_id: str, input_file_id: str, size: int) -> bool:
        """building → uploaded: its input file is at the provider."""
        return self._move(
            batch_id,
            [BatchState.BUILDING],
            state=BatchState.UPLOADED,
            input_file_id=input_file_id,
            bytes=size,
            waiting_since=None,
            error=None,
        )

    def creating(self, batch_id: str) -> bool:
        """uploaded → creating, committed before the create call: from now on a crash may
        leave a provider batch we have no id of, to be found by its metadata."""
        return self._move(
            batch_id, [BatchState.UPLOADED], state=BatchState.CREATING, creating_at=utcnow()
        )

    def creating_again(self, batch_id: str) -> bool:
        """creating → creating, its call time renewed: the provider has no batch of it, so
        the create call goes again."""
        return self._move(batch_id, [BatchState.CREATING], creating_at=utcnow())

    def submitted(self, batch_id: str, provider_batch_id: str, status: str) -> bool:
        """creating → submitted: the provider has it."""
        return self._move(
            batch_id,
            [BatchState.CREATING],
            state=BatchState.SUBMITTED,
            provider_batch_id=provider_batch_id,
            provider_status=status,
            submitted_at=utcnow(),
            waiting_since=None,
            error=None,
        )

    def observed(
        self,
        batch_id: str,
        status: str,
        completed: int,
        failed: int,
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> None:
        """What the provider says of a submitted batch now."""
        self._move(
            batch_id,
            [BatchState.SUBMITTED],
            provider_status=status,
            completed=completed,
            failed=failed,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
        )

    def waiting(self, batch_id: str, error: str) -> None:
        """Sending it failed for a transient reason: it waits (since the first such failure)
        and goes again at the next poll."""
        with self._db.single_statement() as conn:
            conn.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(waiting_since=func.coalesce(batches.c.waiting_since, utcnow()), error=error)
            )

    def done(self, batch_id: str) -> bool:
        """submitted → done: every answer it brought is applied."""
        return self._move(
            batch_id, [BatchState.SUBMITTED], state=BatchState.DONE, finished_at=utcnow()
        )

    @staticmethod
    def drop(conn: Connection, batch_id: str, error: str | None) -> bool:
        """building | uploaded | creating → dropped, and its sent lines with it: the provider
        never had it (the caller settles the items)."""
        dropped = conn.execute(
            update(batches)
            .where(
                batches.c.id == batch_id,
                batches.c.state.in_(
                    [BatchState.BUILDING, BatchState.UPLOADED, BatchState.CREATING]
                ),
            )
            .values(state=BatchState.DROPPED, error=error, finished_at=utcnow())
        ).rowcount
        if dropped:
            conn.execute(
                update(lines)
                .where(lines.c.batch_id == batch_id, lines.c.state == LineState.SENT)
                .values(state=LineState.DROPPED, error=error)
            )
        return bool(dropped)

    @staticmethod
    def drop_ready(conn: Connection, line_id: int, error: str) -> bool:
        """ready → dropped: a request that cannot be sent (the caller fails its item)."""
        dropped = conn.execute(
            update(lines)
            .where(lines.c.id == line_id, lines.c.state == LineState.READY)
            .values(state=LineState.DROPPED, error=error)
        ).rowcount
        return bool(dropped)


def _claims_of(conn: Connection, item_ids: list[int]) -> dict[int, tuple[str, ...]]:
    """The stored claims of these items, in claim order (items without any are absent)."""
    found: dict[int, list[str]] = defaultdict(list)
    for start in range(0, len(item_ids), 1000):
        chunk = item_ids[start : start + 1000]
        for item_id, text in conn.execute(
            select(claims.c.item_id, claims.c.text)
            .where(claims.c.item_id.in_(chunk))
            .order_by(claims.c.item_id, claims.c.idx)
        ):
            found[item_id].append(text)
    return {item_id: tuple(texts) for item_id, texts in found.items()}


# --- what the run view shows ------------------------------------------------------------------


def _usage(calls: Any, prompt: Any, completion: Any, cost: Any) -> Usage:
    return Usage(int(calls or 0), int(prompt or 0), int(completion or 0), float(cost or 0.0))


def run_lane_view(session: Session, run: Run, usage: Usage) -> dict[str, Any]:
    """The run view's lane figures: usage split by lane (an additive key of `usage`), and
    for a batch-mode run the lane's progress (`batch`).

    The batch lane's usage is what its answered requests used; the online lane's is the rest
    of the items' usage."""
    answered = lines.c.state == LineState.ANSWERED
    by_stage = session.execute(
        select(
            lines.c.stage,
            func.count().filter(answered),
            func.coalesce(func.sum(lines.c.prompt_tokens), 0),
            func.coalesce(func.sum(lines.c.completion_tokens), 0),
            func.coalesce(func.sum(lines.c.cost_usd), 0.0),
            func.count().filter(lines.c.state == LineState.FAILED),
        )
        .where(lines.c.run_id == run.id)
        .group_by(lines.c.stage)
    ).all()
    stages = {row[0]: _usage(*row[1:5]) for row in by_stage}
    batch = sum(stages.values(), NO_USAGE)
    online = Usage(usage.llm_calls, usage.prompt_tokens, usage.completion_tokens, usage.cost_usd)
    view: dict[str, Any] = {"by_lane": {"online": (online - batch).spent(), "batch": batch.spent()}}
    progress = None
    if run.mode == RunMode.BATCH:
        requests = session.execute(
            select(
                func.coalesce(
                    func.sum(batches.c.requests).filter(batches.c.provider_batch_id.is_not(None)),
                    0,
                ),
                func.count().filter(batches.c.state.in_(list(PENDING_BATCHES))),
            ).where(batches.c.run_id == run.id)
        ).one()
        progress = {
            "requests_submitted": int(requests[0]),
            "completed": sum(int(row[1]) for row in by_stage),
            "failed": sum(int(row[5]) for row in by_stage),
            "batches_pending": int(requests[1]),
        }
    return {"usage": view, "batch": progress}
