"""Puts work back when its worker or its broker message vanished, and keeps runs flowing.

One worker at a time sweeps (a Redis lock), every `reaper_interval` seconds:
- Redis lost its data (restarted without persistence): every queued or running item of a
  running run lost its message, so all of them go back to the queue;
- running items whose worker stopped heart-beating (SIGKILL, OOM) or whose lease ran out;
- queued items whose lease ran out (a lost message, or a rate-limit deferral now due);
- every queued or running run is dispatched again, which refills its window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis import Redis
from sqlalchemy import Row, and_, or_, select

from recallq.db import session_scope
from recallq.locking import update_items
from recallq.models import Item, ItemStatus, Run, RunStatus, as_utc, utcnow
from worker import liveness
from worker.pipeline import Enqueue, queue_lease

log = logging.getLogger(__name__)

EPOCH_KEY = "recallq:broker-epoch"
LOCK_KEY = "recallq:reaper-lock"
BATCH = 1000


def items_to_requeue(redis: Redis, broker_lost: bool) -> list[int]:
    """Items of running runs whose broker message or worker is gone."""
    now = utcnow()
    with session_scope() as session:
        rows = session.execute(
            select(Item.id, Item.status, Item.owner, Item.lease_until)
            .join(Run, Run.id == Item.run_id)
            .where(Run.status == RunStatus.RUNNING)
            .where(
                or_(
                    Item.status == ItemStatus.RUNNING,
                    and_(
                        Item.status == ItemStatus.QUEUED,
                        or_(broker_lost, Item.lease_until < now),
                    ),
                )
            )
            .limit(BATCH * 10)
        ).all()
    if broker_lost:
        # Every message is gone, including the next link of chains in progress. Taking the
        # items over (new owner tokens) makes any answer still in flight for them void.
        return [row.id for row in rows][:BATCH]
    owners = sorted({liveness.worker_of(r.owner) for r in rows if r.owner})
    alive = liveness.alive(redis, owners)

    def lost(row: Row) -> bool:
        if row.status == ItemStatus.QUEUED:
            return True
        expired = row.lease_until is None or as_utc(row.lease_until) < now
        return expired or not row.owner or liveness.worker_of(row.owner) not in alive

    return [row.id for row in rows if lost(row)][:BATCH]


def requeue(item_ids: list[int], enqueue: Enqueue) -> int:
    if not item_ids:
        return 0
    with session_scope() as session:
        item_ids = update_items(
            session,
            Item.id.in_(item_ids),
            Item.status.in_((ItemStatus.QUEUED, ItemStatus.RUNNING)),
            values={"status": ItemStatus.QUEUED, "owner": None, "lease_until": queue_lease()},
            skip_locked=True,
        )
    enqueue(item_ids)
    return len(item_ids)


def sweep(redis: Redis, enqueue: Enqueue, dispatch_run: Callable[[str], object]) -> int:
    """One pass. Returns how many items went back to the queue."""
    broker_lost = bool(redis.set(EPOCH_KEY, "1", nx=True))
    lost = items_to_requeue(redis, broker_lost)
    if lost:
        log.warning("requeueing %d item(s)%s", len(lost), " (broker lost its data)" * broker_lost)
    count = requeue(lost, enqueue)
    with session_scope() as session:
        runs = list(
            session.scalars(
                select(Run.id).where(Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)))
            )
        )
    for run_id in runs:
        dispatch_run(run_id)
    return count


def try_sweep(
    redis: Redis, interval: float, enqueue: Enqueue, dispatch_run: Callable[[str], object]
) -> None:
    """Sweep if no other worker did within the interval."""
    if redis.set(LOCK_KEY, liveness.WORKER_ID, nx=True, px=max(100, int(interval * 900))):
        sweep(redis, enqueue, dispatch_run)
