"""Every write of item and run state: one named method per move (recallq.status lists the moves).

Items (ItemStore)                                  guard in the WHERE clause
    take            queued|running → running       status and owner as read; a live holder
                                                   keeps it (checked before the write)
    save_claims     running → running              owner token, status running
    hand_over       running → running (new owner)  owner token, status running
    succeed         running → succeeded            owner token, status running
    fail            running → failed               owner token, status running
    defer           running → queued (due later)   owner token, status running
    requeue_lost    queued|running → queued        status queued|running; rows others lock
                                                   right now are left for the next sweep
    expire_lease    running → running (due now)    status running, owned by the worker
    release_next    pending → queued               run running; rows nobody else locks;
                                                   as many as the dispatch window has room for
Runs (RunStore)
    create          → queued (with its items, pending)
    release_window  queued|running → running, and pending → queued items up to the window
    complete_if_done running → completed           no item of the run unended
    cancel          queued|running → cancelled, and unended items → cancelled (reason "user")
    cancel_for_budget  the same, reason "budget": the run's recorded usage reached its budget
    retry_failed    completed|running → running, and failed items → pending
    resume_cancelled  cancelled → running, and cancelled items → pending (a budget-cancelled
                    run only with a budget above what it spent)
    resume          queued|running items → pending (local mode, after the process stopped)
    forget_idempotency_key   the run no longer answers to its key (a fresh run takes it)
    delete          an ended run, with its items and their claims, is removed
    delete_expired  the same for ended runs older than the retention
Items of batch-mode runs (BatchedItemStore, written by the provider batch lane)
    adopt           pending → batched              run running in batch mode; rows nobody
                                                   else locks
    save_claims, charge, wait   batched → batched  status batched
    succeed / fail  batched → succeeded | failed   status batched

A stage writes only while its pass still owns the item: its owner token and status are checked
in the UPDATE itself, so a stale or duplicate copy of a stage writes nothing (no second set of
claims, no usage counted twice). When a pass lost the item because its run was cancelled, the
calls it made were still sent and billed: their usage counts on the cancelled item, and nothing
else of the pass is written.

The hot path uses Core statements built once, with bound parameters (building SQLAlchemy
expressions per call cost more CPU than running them); a statement that stands alone runs
without BEGIN and COMMIT (Database.single_statement).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Insert,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from recallq import metrics
from recallq.claim_cache import ClaimCache
from recallq.db import Database
from recallq.outcomes import Deferred, Ended, Skipped, SkipReason, Stage, Taken
from recallq.scoring import Outcome, Verdict
from recallq.settings import Settings
from recallq.status import ITEM_ENDED, ITEM_IN_FLIGHT, RUN_ENDED, ItemStatus, RunStatus
from recallq.tables import Claim, Item, Run, RunMode, as_utc, utcnow
from recallq.usage import Usage

log = logging.getLogger(__name__)

items, runs, claims_table = (
    cast(Table, Item.__table__),
    cast(Table, Run.__table__),
    cast(Table, Claim.__table__),
)

TAKE_READ = (
    select(
        items.c.key,
        items.c.status,
        items.c.owner,
        items.c.lease_until,
        items.c.started_at,
        items.c.ground_truth,
        items.c.run_id,
        items.c.waiting_since,
        runs.c.status.label("run_status"),
        runs.c.model,
        runs.c.scale,
        runs.c.retry_deadline_s,
        runs.c.project,
        exists().where(claims_table.c.item_id == items.c.id).label("has_claims"),
    )
    .join_from(items, runs, runs.c.id == items.c.run_id)
    .where(items.c.id == bindparam("item_id"))
)
STORED_CLAIMS = (
    select(claims_table.c.text)
    .where(claims_table.c.item_id == bindparam("item_id"))
    .order_by(claims_table.c.idx)
)
HAND_OVER = (
    update(items)
    .where(
        items.c.id == bindparam("b_id"),
        items.c.owner == bindparam("b_owner"),
        items.c.status == ItemStatus.RUNNING,
    )
    .values(owner=bindparam("b_new_owner"), lease_until=bindparam("b_lease"))
    .returning(items.c.contexts)
)
IN_FLIGHT = (
    select(func.count())
    .select_from(items)
    .where(items.c.run_id == bindparam("b_run"), items.c.status.in_(ITEM_IN_FLIGHT))
)
RUN_CONTEXT = select(runs.c.context).where(runs.c.id == bindparam("run_id"))
# a worker keeps the static contexts of this many runs (each at most the context byte limit)
RUN_CONTEXTS_KEPT = 16
RELEASE_NEXT = (
    update(items)
    .where(
        items.c.id.in_(
            select(items.c.id)
            .where(items.c.run_id == bindparam("b_run"), items.c.status == ItemStatus.PENDING)
            .order_by(items.c.id)
            .limit(bindparam("b_limit"))
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        ),
        exists().where(runs.c.id == bindparam("b_run"), runs.c.status == RunStatus.RUNNING),
    )
    .values(status=ItemStatus.QUEUED, lease_until=bindparam("b_lease"))
    .returning(items.c.id)
)
COMPLETE_RUN = (
    update(runs)
    .where(
        runs.c.id == bindparam("b_run"),
        runs.c.status == RunStatus.RUNNING,
        ~exists().where(
            and_(items.c.run_id == bindparam("b_run"), items.c.status.not_in(ITEM_ENDED))
        ),
    )
    .values(status=RunStatus.COMPLETED, finished_at=bindparam("b_now"))
)
RETRYABLE = (RunStatus.COMPLETED, RunStatus.RUNNING)
# columns that an update adds to instead of setting
COUNTERS = (
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "cache_hits",
    "attempts",
    "call_attempts",
    "failed_calls",
    "deferrals",
    "extraction_calls",
    "extraction_prompt_tokens",
    "extraction_completion_tokens",
    "extraction_cost_usd",
)


@lru_cache
def _item_update(keys: frozenset[str], match_owner: str, match_status: bool) -> Update:
    """UPDATE items SET keys WHERE id [AND owner = / IS NULL] [AND status]; counters are
    increments."""
    values = {
        key: items.c[key] + bindparam(f"v_{key}") if key in COUNTERS else bindparam(f"v_{key}")
        for key in keys
    }
    where = [items.c.id == bindparam("b_id")]
    if match_owner == "value":
        where.append(items.c.owner == bindparam("b_owner"))
    elif match_owner == "null":
        where.append(items.c.owner.is_(None))
    if match_status:
        where.append(items.c.status == bindparam("b_status"))
    return update(items).where(*where).values(values)


def _update_item(
    conn: Connection,
    item_id: int,
    values: dict[str, Any],
    owner: str | None = None,
    status: str | None = None,
    unowned: bool = False,
) -> int:
    match_owner = "null" if unowned else "value" if owner is not None else ""
    statement = _item_update(frozenset(values), match_owner, status is not None)
    params = {f"v_{k}": v for k, v in values.items()} | {"b_id": item_id}
    if owner is not None:
        params["b_owner"] = owner
    if status is not None:
        params["b_status"] = status
    written: int = conn.execute(statement, params).rowcount
    if written and "status" in values:
        metrics.items_moved(values["status"], written)
    return written


def _update_items_in_id_order(
    conn: Connection | Session,
    *conditions: ColumnElement[bool],
    values: dict[str, Any],
    skip_locked: bool = False,
    limit: int | None = None,
) -> list[int]:
    """Lock the matching items in id order, then update them; returns their ids.

    Every writer of several items takes its row locks in the same order, so two of them
    (a cancel and the reaper, say) never wait on each other in a cycle. With skip_locked,
    items another transaction holds right now are left for a later pass.
    """
    locked = (
        select(items.c.id)
        .where(*conditions)
        .order_by(items.c.id)
        .limit(limit)
        .with_for_update(skip_locked=skip_locked)
    )
    # one statement whatever the count (a list of ids would hit the driver's parameter limit)
    statement = (
        update(items)
        .where(items.c.id.in_(locked.scalar_subquery()))
        .values(**values)
        .returning(items.c.id)
    )
    moved = list(conn.execute(statement).scalars())
    if moved and "status" in values:
        metrics.items_moved(values["status"], len(moved))
    return moved


def _insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """INSERT with the dialect's ON CONFLICT support (Postgres, or SQLite in local mode)."""
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table)


@lru_cache
def _claims_insert(dialect: str) -> Insert:
    return _insert(dialect, claims_table).on_conflict_do_nothing().returning(claims_table.c.idx)


@lru_cache
def _verdicts_upsert(dialect: str) -> Insert:
    statement = _insert(dialect, claims_table)
    return statement.on_conflict_do_update(
        index_elements=["item_id", "idx"],
        set_={
            "text": statement.excluded.text,
            "verdict": statement.excluded.verdict,
            "context_indices": statement.excluded.context_indices,
            "reason": statement.excluded.reason,
        },
    )


def _spent(usage: Usage, stage: Stage, cache_hits: int = 0) -> dict[str, Any]:
    """Increments of an item's usage counters (see COUNTERS). Extraction's usage is also
    counted apart, so a run's usage can be split by stage (attribution's is the rest). Every
    extraction share counts there, also those of a packed call that carry tokens but not the
    call itself: else their tokens would read as attribution's."""
    spent = {
        "llm_calls": usage.llm_calls,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": usage.cost_usd,
        "cache_hits": cache_hits,
        "call_attempts": usage.call_attempts,
        "failed_calls": usage.failed_calls,
    }
    if stage == Stage.EXTRACTION:
        spent |= {
            "extraction_calls": usage.llm_calls,
            "extraction_prompt_tokens": usage.prompt_tokens,
            "extraction_completion_tokens": usage.completion_tokens,
            "extraction_cost_usd": usage.cost_usd,
        }
    return spent


def _succeeded(outcome: Outcome, usage: Usage, stage: Stage, cache_hits: int) -> dict[str, Any]:
    """The values of an item that ends with a score."""
    return _spent(usage, stage, cache_hits) | {
        "status": ItemStatus.SUCCEEDED,
        "finished_at": utcnow(),
        "lease_until": None,
        "waiting_since": None,
        "score": outcome.score,
        "reason": outcome.reason,
        "error": None,
        "claims_total": outcome.claims_total,
        "claims_attributed": outcome.claims_attributed,
    }


def _failed(error: str, usage: Usage, stage: Stage) -> dict[str, Any]:
    """The values of an item that ends without a score."""
    return _spent(usage, stage) | {
        "status": ItemStatus.FAILED,
        "finished_at": utcnow(),
        "lease_until": None,
        "waiting_since": None,
        "error": error,
        "score": None,
    }


def _verdict_rows(
    item_id: int, claims: Sequence[str], verdicts: dict[int, Verdict]
) -> list[dict[str, Any]]:
    return [
        {
            "item_id": item_id,
            "idx": i,
            "text": text,
            "verdict": verdicts[i].verdict,
            "context_indices": verdicts[i].context_indices,
            "reason": verdicts[i].reason,
        }
        for i, text in enumerate(claims)
    ]


def _refused(item_id: int, move: str, owner: str) -> None:
    """A guarded write that found the item no longer its pass's: one line each, so that a stale
    pass's late writes (a worker back from a partition, a redelivered message) can be seen."""
    log.info("item %d: %s refused: no longer owned by %s", item_id, move, owner)


def _charge_cancelled(conn: Connection, item_id: int, values: dict[str, Any]) -> None:
    """A write that found the item no longer its own because its run was cancelled: the calls
    it made were still sent and billed, so their usage counts on the cancelled item."""
    spent = {k: v for k, v in values.items() if k in COUNTERS and k != "attempts" and v}
    if spent:
        _update_item(conn, item_id, spent, status=ItemStatus.CANCELLED)


class ItemStore:
    """The moves of one item through its stages (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        lease_seconds: float,
        queue_lease_seconds: float,
        dispatch_window: int,
        release_group: int,
    ) -> None:
        """`dispatch_window`: items of one run queued or running at once. `release_group`: how
        many places must be free before items are released into them, so that they travel
        (and are extracted) together."""
        self._db = database
        self.lease_seconds = lease_seconds
        self.queue_lease_seconds = queue_lease_seconds
        self.dispatch_window = dispatch_window
        self.release_group = min(release_group, dispatch_window)
        self._run_contexts: OrderedDict[str, list[str]] = OrderedDict()
        self._run_contexts_lock = threading.Lock()

    def _lease(self, seconds: float | None = None) -> datetime:
        """Lease of a stage at work (default), or of `seconds`."""
        return utcnow() + timedelta(seconds=self.lease_seconds if seconds is None else seconds)

    def queue_lease(self) -> datetime:
        """Lease of an item whose next message waits in the broker. If the message is lost (a
        worker died holding it unacknowledged), the reaper sends another when this runs out;
        a duplicate is harmless, the owner token sorts it out."""
        return self._lease(self.queue_lease_seconds)

    # --- take -------------------------------------------------------------------------------

    def take(
        self, item_id: int, owner: str, holder_alive: Callable[[str], bool]
    ) -> Taken | Skipped:
        """queued|running → running under `owner`, or why not. An item whose run was cancelled
        becomes cancelled here; one held by a live worker is left to it (a duplicate message).

        The read and the write need no common transaction: the write happens only if nobody
        moved the item on since the read (its WHERE checks owner and status again)."""
        now = utcnow()
        with self._db.single_statement() as conn:
            row = conn.execute(TAKE_READ, {"item_id": item_id}).one_or_none()
        if row is None or row.status in ITEM_ENDED:
            return Skipped(SkipReason.ENDED)
        if row.status == ItemStatus.PENDING:  # a stale message: dispatch releases it later
            return Skipped(SkipReason.NOT_RELEASED)
        if row.status == ItemStatus.BATCHED:  # a batch-mode run's item makes no online call
            return Skipped(SkipReason.IN_BATCH)
        if row.run_status == RunStatus.CANCELLED:
            cancelled = {"status": ItemStatus.CANCELLED, "finished_at": now, "lease_until": None}
            with self._db.single_statement() as conn:
                _update_item(conn, item_id, cancelled, status=row.status)
            return Skipped(SkipReason.RUN_CANCELLED)
        held = row.status == ItemStatus.RUNNING and row.owner and row.lease_until is not None
        if held and as_utc(row.lease_until) > now and holder_alive(row.owner):
            return Skipped(SkipReason.HELD)
        values: dict[str, Any] = {
            "status": ItemStatus.RUNNING,
            "owner": owner,
            "lease_until": self._lease(),
            "attempts": 1,
        }
        if row.started_at is None:  # first taking; a retaken item keeps when it started
            values["started_at"] = now
        unchanged = {"owner": row.owner, "status": row.status, "unowned": row.owner is None}
        with self._db.single_statement() as conn:
            if not _update_item(conn, item_id, values, **unchanged):
                return Skipped(SkipReason.NOT_OWNED)
            known = self._stored_claims(conn, item_id) if row.has_claims else None
        waiting = as_utc(row.waiting_since).timestamp() if row.waiting_since else None
        return Taken(
            item_id,
            owner,
            row.run_id,
            row.model,
            row.scale,
            row.ground_truth,
            known,
            row.retry_deadline_s,
            waiting,
            row.project,
            row.key,
        )

    def cached_claims(self, key: str) -> list[str] | None:
        """Claims the claim cache holds for this key (ground truth, model, prompt version)."""
        with self._db.single_statement() as conn:
            return ClaimCache.read(conn, [key]).get(key)

    # --- while running ----------------------------------------------------------------------

    def save_claims(
        self,
        taken: Taken,
        claims: Sequence[str],
        usage: Usage,
        cache_hit: bool,
        cache_key: str,
    ) -> Taken | Skipped:
        """running → running: the item's claims (and, when freshly extracted, the claim cache)
        with what their extraction used. The item's next message is on its way: its lease
        becomes a queue lease. Returns the pass with the claims stored, which are an earlier
        pass's when that one stored its claims first. The item made progress: whatever it
        waited out is over."""
        with self._db.transaction() as conn:
            values = _spent(usage, Stage.EXTRACTION, int(cache_hit)) | {
                "lease_until": self.queue_lease(),
                "waiting_since": None,
            }
            if not self._write_owned(conn, taken, values, "save_claims"):
                return Skipped(SkipReason.NOT_OWNED)
            if not cache_hit:
                ClaimCache.write(conn, cache_key, claims)
            rows = [{"item_id": taken.item_id, "idx": i, "text": t} for i, t in enumerate(claims)]
            inserted = conn.execute(_claims_insert(conn.dialect.name), rows).all()
            stored = tuple(claims)
            if len(inserted) != len(claims):
                stored = self._stored_claims(conn, taken.item_id)
        return Taken(**{**taken.to_message(), "claims": stored, "waiting_since": None})

    def hand_over(self, taken: Taken, new_owner: str) -> tuple[Taken, list[str]] | Skipped:
        """running → running under the owner token of the worker running the next stage, so
        the reaper follows that worker's heartbeat and a duplicate of its message finds the
        item no longer its own. Returns the pass and the item's resolved contexts."""
        params = {
            "b_id": taken.item_id,
            "b_owner": taken.owner,
            "b_new_owner": new_owner,
            "b_lease": self._lease(),
        }
        with self._db.single_statement() as conn:
            row = conn.execute(HAND_OVER, params).one_or_none()
        if row is None:
            _refused(taken.item_id, "hand_over", taken.owner)
            return Skipped(SkipReason.NOT_OWNED)
        contexts = row.contexts
        if contexts is None:  # the run's static context, stored once on the run
            contexts = self.run_context(taken.run_id)
        return Taken(**{**taken.to_message(), "owner": new_owner}), list(contexts)

    def run_context(self, run_id: str) -> list[str]:
        """A run's static context ([] when it has none). It never changes, so a worker keeps
        the last few it read instead of reading a megabyte per item."""
        with self._run_contexts_lock:
            if run_id in self._run_contexts:
                self._run_contexts.move_to_end(run_id)
                return self._run_contexts[run_id]
        with self._db.single_statement() as conn:
            found = conn.execute(RUN_CONTEXT, {"run_id": run_id}).scalar()
        context = list(found or [])
        with self._run_contexts_lock:
            self._run_contexts[run_id] = context
            while len(self._run_contexts) > RUN_CONTEXTS_KEPT:
                self._run_contexts.popitem(last=False)
        return context

    # --- ending -----------------------------------------------------------------------------

    def succeed(
        self,
        taken: Taken,
        outcome: Outcome,
        usage: Usage,
        stage: Stage,
        verdicts: dict[int, Verdict] | None = None,
        cache_hits: int = 0,
    ) -> Ended | Skipped:
        """running → succeeded with its score, reason and the verdict of every claim; the next
        pending item of the run is queued in its place. `usage` is what `stage` spent last."""
        values = _succeeded(outcome, usage, stage, cache_hits)
        with self._db.transaction() as conn:
            if not self._write_owned(conn, taken, values, "succeed"):
                return Skipped(SkipReason.NOT_OWNED)
            if verdicts:
                rows = _verdict_rows(taken.item_id, taken.claims or (), verdicts)
                conn.execute(_verdicts_upsert(conn.dialect.name), rows)
            return Ended(taken.run_id, self._release_next(conn, taken.run_id))

    def fail(self, taken: Taken, error: str, usage: Usage, stage: Stage) -> Ended | Skipped:
        """running → failed with its error; the next pending item is queued in its place."""
        values = _failed(error, usage, stage)
        with self._db.transaction() as conn:
            if not self._write_owned(conn, taken, values, "fail"):
                return Skipped(SkipReason.NOT_OWNED)
            return Ended(taken.run_id, self._release_next(conn, taken.run_id))

    def defer(
        self,
        taken: Taken,
        delay: float,
        usage: Usage,
        stage: Stage,
        waiting_since: datetime | None,
    ) -> Deferred | Skipped:
        """running → queued, due in `delay` seconds, keeping its claims and usage: its worker
        slot is given back, and the reaper sends the item again when its lease runs out.
        `waiting_since` is when it started to wait out a provider incident (None: it waits
        for something sure to come, as rate-limit capacity)."""
        until = self._lease(delay)
        values = _spent(usage, stage) | {
            "status": ItemStatus.QUEUED,
            "owner": None,
            "lease_until": until,
            "deferrals": 1,
            "waiting_since": waiting_since,
        }
        with self._db.transaction() as conn:
            if not self._write_owned(conn, taken, values, "defer"):
                return Skipped(SkipReason.NOT_OWNED)
        return Deferred(until)

    # --- lost work --------------------------------------------------------------------------

    def requeue_lost(self, item_ids: list[int]) -> list[int]:
        """queued|running → queued for items whose message or worker is gone (the reaper's
        finding); returns those requeued, whose messages are the caller's to send."""
        if not item_ids:
            return []
        with self._db.transaction() as conn:
            return _update_items_in_id_order(
                conn,
                items.c.id.in_(item_ids),
                items.c.status.in_(ITEM_IN_FLIGHT),
                values={
                    "status": ItemStatus.QUEUED,
                    "owner": None,
                    "lease_until": self.queue_lease(),
                },
                skip_locked=True,
            )

    def expire_lease(self, item_id: int, worker_id: str) -> None:
        """running → running, due for the reaper now (its message may be lost in an outage),
        while a pass of `worker_id` still owns it: a worker back from a partition hands back
        only what nobody took over meanwhile (a live worker's item, made due, was taken from
        it at the next sweep)."""
        statement = (
            update(items)
            .where(
                items.c.id == item_id,
                items.c.status == ItemStatus.RUNNING,
                items.c.owner.startswith(f"{worker_id}/", autoescape=True),
            )
            .values(lease_until=self._lease(1))
        )
        with self._db.single_statement() as conn:
            if not conn.execute(statement).rowcount:
                _refused(item_id, "expire_lease", worker_id)

    # --- internals --------------------------------------------------------------------------

    def _write_owned(
        self, conn: Connection, taken: Taken, values: dict[str, Any], move: str
    ) -> bool:
        """Write only while this pass owns the running item (`move` names the write, for the
        line a refusal logs). If its run was cancelled meanwhile, the calls this pass made
        were still sent and billed: their usage counts on the cancelled item, and nothing else
        of the pass is written."""
        owned = _update_item(
            conn, taken.item_id, values, owner=taken.owner, status=ItemStatus.RUNNING
        )
        if not owned:
            _refused(taken.item_id, move, taken.owner)
            _charge_cancelled(conn, taken.item_id, values)
        return bool(owned)

    def _release_next(self, conn: Connection, run_id: str) -> tuple[int, ...]:
        """pending → queued: when a group's worth of places in a running run's dispatch
        window is free, that many of its pending items take them."""
        free = self.dispatch_window - conn.execute(IN_FLIGHT, {"b_run": run_id}).scalar_one()
        if free < self.release_group:
            return ()
        params = {"b_run": run_id, "b_lease": self.queue_lease(), "b_limit": free}
        released = tuple(conn.execute(RELEASE_NEXT, params).scalars())
        metrics.items_moved(ItemStatus.QUEUED, len(released))
        return released

    @staticmethod
    def _stored_claims(conn: Connection, item_id: int) -> tuple[str, ...]:
        return tuple(conn.execute(STORED_CLAIMS, {"item_id": item_id}).scalars())


class BatchedItemStore:
    """The moves of a batch-mode run's items, made by its provider batch lane
    (recallq.batch_lane): one item at a time, request by request.

    Each method writes through the caller's connection: the lane writes an item's move in the
    same transaction as the request line whose answer caused it (recallq.batch_store), so an
    answer is applied exactly once whatever crashes in between. Every write is guarded by
    status batched and returns whether it was made. When the item's run was cancelled
    meanwhile, only the usage of the answers that still came is written (they are billed).
    """

    def adopt(self, conn: Connection, run_id: str, limit: int) -> list[int]:
        """pending → batched: up to `limit` of the pending items of a running batch-mode run
        (rows another transaction locks are left for the next call). Returns their ids."""
        in_batch_mode = exists().where(
            runs.c.id == run_id, runs.c.status == RunStatus.RUNNING, runs.c.mode == RunMode.BATCH
        )
        return _update_items_in_id_order(
            conn,
            items.c.run_id == run_id,
            items.c.status == ItemStatus.PENDING,
            in_batch_mode,
            values={
                "status": ItemStatus.BATCHED,
                "owner": None,
                "lease_until": None,
                "waiting_since": None,
                "attempts": items.c.attempts + 1,
                "started_at": func.coalesce(items.c.started_at, utcnow()),
            },
            skip_locked=True,
            limit=limit,
        )

    def save_claims(
        self,
        conn: Connection,
        item_id: int,
        claims: Sequence[str],
        usage: Usage,
        cache_hit: bool,
        cache_key: str,
    ) -> bool:
        """batched → batched: its claims (and the claim cache, when freshly extracted) with what
        their extraction used. The item made progress: whatever it waited out is over."""
        values = _spent(usage, Stage.EXTRACTION, int(cache_hit)) | {"waiting_since": None}
        if not self._write(conn, item_id, values):
            return False
        if not cache_hit:
            ClaimCache.write(conn, cache_key, claims)
        rows = [{"item_id": item_id, "idx": i, "text": text} for i, text in enumerate(claims)]
        if rows:
            conn.execute(_claims_insert(conn.dialect.name), rows)
        return True

    def charge(self, conn: Connection, item_id: int, usage: Usage, stage: Stage) -> bool:
        """batched → batched: what an answered request used, when the item needs another
        request before it ends (a re-ask, a repair). It made progress: no more waiting."""
        return self._write(conn, item_id, _spent(usage, stage) | {"waiting_since": None})

    def wait(
        self, conn: Connection, item_id: int, usage: Usage, stage: Stage, since: datetime
    ) -> bool:
        """batched → batched: a request failed for a transient reason and goes again in a
        later batch. `since` is when the item started to wait (its run's retry deadline
        counts from then)."""
        return self._write(conn, item_id, _spent(usage, stage) | {"waiting_since": since})

    def succeed(
        self,
        conn: Connection,
        item_id: int,
        outcome: Outcome,
        usage: Usage,
        stage: Stage,
        claims: Sequence[str] = (),
        verdicts: dict[int, Verdict] | None = None,
        cache_hits: int = 0,
    ) -> bool:
        """batched → succeeded with its score, reason and the verdict of every claim."""
        if not self._write(conn, item_id, _succeeded(outcome, usage, stage, cache_hits)):
            return False
        if verdicts:
            rows = _verdict_rows(item_id, claims, verdicts)
            conn.execute(_verdicts_upsert(conn.dialect.name), rows)
        return True

    def fail(self, conn: Connection, item_id: int, error: str, usage: Usage, stage: Stage) -> bool:
        """batched → failed with its error."""
        return self._write(conn, item_id, _failed(error, usage, stage))

    @staticmethod
    def _write(conn: Connection, item_id: int, values: dict[str, Any]) -> bool:
        written = _update_item(conn, item_id, values, status=ItemStatus.BATCHED)
        if not written:
            _charge_cancelled(conn, item_id, values)
        return bool(written)


class RunNotFound(LookupError):
    """No such run in the project (another project's run is not found either)."""


class RunCancelledError(ValueError):
    """A cancelled run cannot be retried."""


class RunNotCancelledError(ValueError):
    """Only a cancelled run can be resumed."""


class RunBudgetSpentError(ValueError):
    """A run cancelled at its budget resumes only with a higher one."""


class RunActiveError(ValueError):
    """A run that is queued or running cannot be deleted (cancel it first)."""


#: why a run was cancelled (runs.cancel_reason)
CANCELLED_BY_USER = "user"
CANCELLED_FOR_BUDGET = "budget"


class RunStore:
    """The moves of runs, and of the items a run-wide action moves (see the module docstring)."""

    def __init__(self, database: Database, items: ItemStore, insert_batch_size: int) -> None:
        self._db = database
        self._items = items
        self._batch = insert_batch_size

    def create(self, session: Session, run: Run, item_rows: Iterable[dict[str, Any]]) -> int:
        """→ queued: the run with its items (pending), inserted in batches inside the caller's
        transaction, so a submission that fails half-way leaves nothing. Returns the count."""
        run.status = RunStatus.QUEUED
        session.add(run)
        session.flush()
        total, batch = 0, []
        for row in item_rows:
            batch.append({**row, "run_id": run.id, "status": ItemStatus.PENDING})
            total += 1
            if len(batch) >= self._batch:
                session.execute(insert(Item), batch)
                batch = []
        if batch:
            session.execute(insert(Item), batch)
        session.execute(update(runs).where(runs.c.id == run.id).values(total_items=total))
        return total

    def release_window(self, run_id: str) -> list[int] | None:
        """queued|running → running, and pending → queued for as many items as the run's
        dispatch window has room for; returns their ids (messages to send), or None when the
        run is gone or ended. A batch-mode run releases none: its provider batch lane adopts
        its pending items (BatchedItemStore.adopt)."""
        with self._db.transaction() as conn:
            run = conn.execute(
                select(runs.c.status, runs.c.mode).where(runs.c.id == run_id).with_for_update()
            ).one_or_none()
            if run is None or run.status in RUN_ENDED:
                return None
            if run.status == RunStatus.QUEUED:
                conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id)
                    .values(status=RunStatus.RUNNING, started_at=utcnow())
                )
            if run.mode == RunMode.BATCH:  # its items go to the provider batch lane instead
                return []
            in_flight = conn.execute(
                select(func.count())
                .select_from(items)
                .where(items.c.run_id == run_id, items.c.status.in_(ITEM_IN_FLIGHT))
            ).scalar_one()
            return _update_items_in_id_order(
                conn,
                items.c.run_id == run_id,
                items.c.status == ItemStatus.PENDING,
                values={"status": ItemStatus.QUEUED, "lease_until": self._items.queue_lease()},
                skip_locked=True,
                limit=max(0, self._items.dispatch_window - in_flight),
            )

    def complete_if_done(self, run_id: str) -> bool:
        """running → completed when no item of the run is unended. Called after the caller's
        item write has committed, so the last item to end sees all the others ended."""
        with self._db.single_statement() as conn:
            return bool(conn.execute(COMPLETE_RUN, {"b_run": run_id, "b_now": utcnow()}).rowcount)

    def cancel(self, run_id: str, project: str) -> bool:
        """queued|running → cancelled (reason "user"), and every unended item → cancelled, in
        one transaction; False when the run had ended already. Calls already in flight are
        the call gate's to stop (see coordination.gate)."""
        with self._db.transaction() as conn:
            status = self._lock(conn, run_id, project)
            if status in RUN_ENDED:
                return False
            self._cancel_locked(conn, run_id, CANCELLED_BY_USER)
        return True

    def cancel_for_budget(self, run_id: str) -> bool:
        """queued|running → cancelled (reason "budget"), and every unended item → cancelled:
        the run's recorded usage reached its budget, so the call gate refuses its calls. False
        when the run had ended already (or a user cancelled it first)."""
        with self._db.transaction() as conn:
            status = conn.execute(
                select(runs.c.status).where(runs.c.id == run_id).with_for_update()
            ).scalar()
            if status is None or status in RUN_ENDED:
                return False
            self._cancel_locked(conn, run_id, CANCELLED_FOR_BUDGET)
        return True

    @staticmethod
    def _cancel_locked(conn: Connection, run_id: str, reason: str) -> None:
        now = utcnow()
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status=RunStatus.CANCELLED, finished_at=now, cancel_reason=reason)
        )
        _update_items_in_id_order(
            conn,
            items.c.run_id == run_id,
            items.c.status.not_in(ITEM_ENDED),
            values={"status": ItemStatus.CANCELLED, "finished_at": now, "lease_until": None},
        )

    def delete(self, run_id: str, project: str) -> None:
        """Remove an ended run of the project with its items and their claims (the foreign
        keys cascade), in one transaction. RunNotFound for no such run in the project;
        RunActiveError for a queued or running one, whose workers would otherwise write to
        rows that are gone."""
        with self._db.transaction() as conn:
            status = self._lock(conn, run_id, project)
            if status not in RUN_ENDED:
                raise RunActiveError(f"run {run_id} is {status}; cancel it first")
            conn.execute(delete(runs).where(runs.c.id == run_id))

    def delete_expired(self, ended_before: datetime, limit: int = 100) -> list[str]:
        """Remove up to `limit` runs that ended before `ended_before`, each with its items
        and claims; returns their ids. Each run goes in its own transaction, so a sweep never
        holds locks on many runs at once; a run locked right now is left for the next one."""
        with self._db.single_statement() as conn:
            candidates = list(
                conn.execute(
                    select(runs.c.id)
                    .where(runs.c.status.in_(RUN_ENDED), runs.c.finished_at < ended_before)
                    .order_by(runs.c.finished_at)
                    .limit(limit)
                ).scalars()
            )
        deleted = []
        for run_id in candidates:
            with self._db.transaction() as conn:
                locked = conn.execute(
                    select(runs.c.id)
                    .where(
                        runs.c.id == run_id,
                        runs.c.status.in_(RUN_ENDED),
                        runs.c.finished_at < ended_before,
                    )
                    .with_for_update(skip_locked=True)
                ).scalar()
                if locked is not None:
                    conn.execute(delete(runs).where(runs.c.id == run_id))
                    deleted.append(run_id)
        return deleted

    def retry_failed(self, run_id: str, project: str) -> int:
        """failed → pending for the run's failed items (their claims are kept, so extraction
        is not paid twice), and completed|running → running when there were any. Returns how
        many items; raises RunCancelledError for a cancelled run."""
        with self._db.transaction() as conn:
            status = self._lock(conn, run_id, project)
            if status == RunStatus.CANCELLED:
                raise RunCancelledError(f"run {run_id} was cancelled")
            retried = _update_items_in_id_order(
                conn,
                items.c.run_id == run_id,
                items.c.status == ItemStatus.FAILED,
                values={"status": ItemStatus.PENDING, "error": None, "finished_at": None},
            )
            if retried:
                conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id, runs.c.status.in_(RETRYABLE))
                    .values(status=RunStatus.RUNNING, finished_at=None)
                )
        return len(retried)

    def resume(self, run_id: str, project: str) -> int:
        """queued|running → pending for the run's items that were handed out but not ended:
        in local mode the process that held them has stopped (Ctrl-C), so no message for them
        is on its way and nobody works on them; dispatch sends them again. Claims already
        extracted are kept, so extraction is not paid twice. Returns how many items.

        Only for a run no live process is scoring: two processes resuming one run would both
        score its items (the owner token keeps the stored results single, not the calls)."""
        with self._db.transaction() as conn:
            self._lock(conn, run_id, project)
            resumed = _update_items_in_id_order(
                conn,
                items.c.run_id == run_id,
                items.c.status.in_(ITEM_IN_FLIGHT),
                values={"status": ItemStatus.PENDING, "owner": None, "lease_until": None},
            )
        return len(resumed)

    def resume_cancelled(
        self, run_id: str, project: str, budget_usd: float | None, budget_tokens: int | None
    ) -> tuple[int, tuple[float | None, int | None] | None]:
        """cancelled → running, and the run's cancelled items → pending (claims already
        extracted are kept, so extraction is not paid twice); the budget fields given replace
        the run's. Returns how many items, and the run's budget when it has one. Raises
        RunNotCancelledError, and RunBudgetSpentError when the budget (raised or not) is
        already spent: the run would be cancelled again at its first call."""
        with self._db.transaction() as conn:
            status = self._lock(conn, run_id, project)
            if status != RunStatus.CANCELLED:
                raise RunNotCancelledError(
                    f"run {run_id} is {status}: only a cancelled run can be resumed"
                    + ("; `retry` re-queues failed items" if status == RunStatus.COMPLETED else "")
                )
            run = conn.execute(
                select(runs.c.budget_usd, runs.c.budget_tokens).where(runs.c.id == run_id)
            ).one()
            usd = budget_usd if budget_usd is not None else run.budget_usd
            tokens = budget_tokens if budget_tokens is not None else run.budget_tokens
            spent_usd, spent_tokens = conn.execute(
                select(
                    func.coalesce(func.sum(items.c.cost_usd), 0.0),
                    func.coalesce(func.sum(items.c.prompt_tokens + items.c.completion_tokens), 0),
                ).where(items.c.run_id == run_id)
            ).one()
            spent = []
            if usd is not None and spent_usd >= usd:
                spent.append(f"${spent_usd:.4f} of budget_usd {usd:g}")
            if tokens is not None and spent_tokens >= tokens:
                spent.append(f"{spent_tokens} tokens of budget_tokens {tokens}")
            if spent:
                raise RunBudgetSpentError(
                    f"run {run_id} has spent its budget ({', '.join(spent)}): resume it with "
                    "a higher budget_usd or budget_tokens"
                )
            resumed = _update_items_in_id_order(
                conn,
                items.c.run_id == run_id,
                items.c.status == ItemStatus.CANCELLED,
                values={
                    "status": ItemStatus.PENDING,
                    "finished_at": None,
                    "owner": None,
                    "lease_until": None,
                },
            )
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(
                    status=RunStatus.RUNNING,
                    finished_at=None,
                    cancel_reason=None,
                    budget_usd=usd,
                    budget_tokens=tokens,
                )
            )
        budget = None if usd is None and tokens is None else (usd, tokens)
        return len(resumed), budget

    def forget_idempotency_key(self, run_id: str) -> None:
        """The run keeps everything but its idempotency key, which a fresh run of the same
        submission then takes (`recallq run --fresh`, or after the run was cancelled)."""
        with self._db.single_statement() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(idempotency_key=None))

    @staticmethod
    def _lock(conn: Connection, run_id: str, project: str) -> str:
        """The run's status, its row locked until the transaction ends."""
        status = conn.execute(
            select(runs.c.status)
            .where(runs.c.id == run_id, runs.c.project == project)
            .with_for_update()
        ).scalar()
        if status is None:
            raise RunNotFound(f"run {run_id} not found")
        return str(status)


def stores_for(database: Database, settings: Settings) -> tuple[ItemStore, RunStore]:
    """The item and run stores of a database, set up as the settings say."""
    items = ItemStore(
        database,
        settings.lease_seconds,
        settings.queue_lease_seconds,
        settings.dispatch_window,
        settings.extraction_pack,
    )
    return items, RunStore(database, items, settings.insert_batch_size)
