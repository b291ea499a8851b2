"""BatchedItemStore: the moves of a batch-mode run's items, made by the provider batch lane."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    exists,
    func,
)

from recallq.core.outcomes import Stage
from recallq.core.precision import Precision
from recallq.core.scoring import Outcome, Verdict
from recallq.core.status import ItemStatus, RunStatus
from recallq.core.usage import Usage
from recallq.observability import metrics
from recallq.state.claim_cache import ClaimCache
from recallq.state.item_writes import (
    charge_cancelled,
    claims_insert,
    failed_values,
    items,
    runs,
    spent_values,
    succeeded_values,
    update_item,
    update_items_in_id_order,
    verdict_rows,
    verdicts_upsert,
)
from recallq.state.tables import RunMode, utcnow


class BatchedItemStore:
    """The moves of a batch-mode run's items, made by its provider batch lane
    (recallq.batch.lane): one item at a time, request by request.

    Each method writes through the caller's connection: the lane writes an item's move in the
    same transaction as the request line whose answer caused it (recallq.batch.store), so an
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
        return update_items_in_id_order(
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
        values = spent_values(usage, Stage.EXTRACTION, int(cache_hit)) | {"waiting_since": None}
        if not self._write(conn, item_id, values):
            return False
        if not cache_hit:
            ClaimCache.write(conn, cache_key, claims)
        rows = [{"item_id": item_id, "idx": i, "text": text} for i, text in enumerate(claims)]
        if rows:
            conn.execute(claims_insert(conn.dialect.name), rows)
        return True

    def charge(self, conn: Connection, item_id: int, usage: Usage, stage: Stage) -> bool:
        """batched → batched: what an answered request used, when the item needs another
        request before it ends (a re-ask, a repair). It made progress: no more waiting."""
        return self._write(conn, item_id, spent_values(usage, stage) | {"waiting_since": None})

    def wait(
        self, conn: Connection, item_id: int, usage: Usage, stage: Stage, since: datetime
    ) -> bool:
        """batched → batched: a request failed for a transient reason and goes again in a
        later batch. `since` is when the item started to wait (its run's retry deadline
        counts from then)."""
        return self._write(conn, item_id, spent_values(usage, stage) | {"waiting_since": since})

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
        precision: Precision | None = None,
    ) -> bool:
        """batched → succeeded with its score, reason, the verdict of every claim and its
        context precision."""
        values = succeeded_values(outcome, usage, stage, cache_hits, precision)
        if not self._write(conn, item_id, values):
            return False
        if precision is not None:
            metrics.precision_scored(precision.mode)
        if verdicts:
            rows = verdict_rows(item_id, claims, verdicts)
            conn.execute(verdicts_upsert(conn.dialect.name), rows)
        return True

    def fail(self, conn: Connection, item_id: int, error: str, usage: Usage, stage: Stage) -> bool:
        """batched → failed with its error."""
        return self._write(conn, item_id, failed_values(error, usage, stage))

    @staticmethod
    def _write(conn: Connection, item_id: int, values: dict[str, Any]) -> bool:
        written = update_item(conn, item_id, values, status=ItemStatus.BATCHED)
        if not written:
            charge_cancelled(conn, item_id, values)
        return bool(written)
