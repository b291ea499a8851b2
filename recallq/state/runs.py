"""RunStore: the moves of runs, and of the items a run-wide action moves (the table of moves:
recallq.state)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from recallq.core.inputs import text_problem
from recallq.core.status import ITEM_ENDED, RUN_ENDED, ItemStatus, RunStatus
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.state.item_writes import (
    ITEM_IS_IN_FLIGHT,
    items,
    runs,
    update_items_in_id_order,
)
from recallq.state.items import ItemStore
from recallq.state.tables import Item, Run, RunMode, utcnow
from recallq.state.usage_spool import UsageSpool

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


class RunNotFound(LookupError):
    """No such run in the project (another project's run is not found either). Carries the
    id as asked; each front end words the message once ("run X not found")."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id[:80]} not found")
        self.run_id = run_id


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
                .where(items.c.run_id == run_id, ITEM_IS_IN_FLIGHT)
            ).scalar_one()
            return update_items_in_id_order(
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
        update_items_in_id_order(
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
            retried = update_items_in_id_order(
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
            resumed = update_items_in_id_order(
                conn,
                items.c.run_id == run_id,
                ITEM_IS_IN_FLIGHT,
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
            resumed = update_items_in_id_order(
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
            raise RunNotFound(run_id)
        return str(status)


def stores_for(
    database: Database, settings: Settings, spool: UsageSpool | None = None
) -> tuple[ItemStore, RunStore]:
    """The item and run stores of a database, set up as the settings say; `spool` keeps the
    usage the item store could not write (default: in this process's memory only)."""
    items = ItemStore(
        database,
        settings.lease_seconds,
        settings.queue_lease_seconds,
        settings.dispatch_window,
        settings.extraction_pack,
        spool,
    )
    return items, RunStore(database, items, settings.insert_batch_size)


def run_budget(database: Database, run_id: str) -> tuple[float | None, int | None] | None:
    """A run's budget (usd, tokens), or None when there is no such run."""
    with database.single_statement() as conn:
        row = conn.execute(
            select(Run.budget_usd, Run.budget_tokens).where(Run.id == run_id)
        ).one_or_none()
    return None if row is None else (row.budget_usd, row.budget_tokens)


def run_spent(database: Database, run_id: str) -> tuple[float, int]:
    """What a run's items have recorded as used: (usd, prompt + completion tokens)."""
    with database.single_statement() as conn:
        row = conn.execute(
            select(
                func.coalesce(func.sum(Item.cost_usd), 0.0),
                func.coalesce(func.sum(Item.prompt_tokens + Item.completion_tokens), 0),
            ).where(Item.run_id == run_id)
        ).one()
    return float(row[0]), int(row[1])


#: Item and run ids are at most this long (run ids are UUIDs).
MAX_ID_LENGTH = 200


def plausible_id(value: str) -> bool:
    """An id the database can hold: else it cannot name anything stored (not found)."""
    return len(value) <= MAX_ID_LENGTH and text_problem(value) is None


def find_run(session: Session, run_id: str, project: str) -> Run | None:
    """The project's run of this id; None for an unknown run and for another project's."""
    run = session.get(Run, run_id) if plausible_id(run_id) else None
    return run if run is not None and run.project == project else None
