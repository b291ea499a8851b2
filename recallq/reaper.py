"""Puts work back when its worker or its broker message vanished, and keeps runs flowing.

One worker at a time sweeps (a Redis lock), every `reaper_interval` seconds:
- Redis lost its data (restarted without persistence): every queued or running item of a
  running run lost its message, so all of them go back to the queue;
- running items whose worker stopped heart-beating (SIGKILL, OOM) or whose lease ran out;
- queued items whose lease ran out (a lost message, or a deferred item now due);
- every queued or running run is dispatched again, which refills its window.
"""

from __future__ import annotations

import logging
from typing import Any

from redis import Redis
from sqlalchemy import and_, or_, select

from recallq.coordination import keys
from recallq.coordination.liveness import Heartbeat, worker_of
from recallq.db import Database
from recallq.engine import WorkQueue
from recallq.status import RUN_ACTIVE, ItemStatus, RunStatus
from recallq.store import ItemStore
from recallq.tables import Item, Run, as_utc, utcnow

log = logging.getLogger(__name__)

BATCH = 1000


class Reaper:
    def __init__(
        self,
        redis: Redis,
        database: Database,
        items: ItemStore,
        heartbeat: Heartbeat,
        queue: WorkQueue,
        interval: float,
    ) -> None:
        self._redis = redis
        self._db = database
        self._items = items
        self.heartbeat = heartbeat
        self._queue = queue
        self.interval = interval

    def mark_broker_fresh(self) -> None:
        """A broker seen for the first time has lost nothing (see sweep)."""
        self._redis.set(keys.BROKER_EPOCH, "1", nx=True)

    def try_sweep(self) -> None:
        """Sweep if no other worker did within the interval."""
        lock_ms = max(100, int(self.interval * 900))
        if self._redis.set(keys.REAPER_LOCK, self.heartbeat.worker_id, nx=True, px=lock_ms):
            self.sweep()

    def sweep(self) -> int:
        """One pass. Returns how many items went back to the queue."""
        broker_lost = bool(self._redis.set(keys.BROKER_EPOCH, "1", nx=True))
        lost = self.items_to_requeue(broker_lost)
        if lost:
            log.warning(
                "requeueing %d item(s)%s", len(lost), " (broker lost its data)" * broker_lost
            )
        requeued = self._items.requeue_lost(lost)
        if requeued:
            self._queue.send_items(requeued)
        with self._db.session() as session:
            active = list(session.scalars(select(Run.id).where(Run.status.in_(RUN_ACTIVE))))
        for run_id in active:
            self._queue.send_dispatch(run_id)
        return len(requeued)

    def items_to_requeue(self, broker_lost: bool) -> list[int]:
        """Items of running runs whose broker message or worker is gone."""
        now = utcnow()
        queued = Item.status == ItemStatus.QUEUED
        lost_message = queued if broker_lost else and_(queued, Item.lease_until < now)
        with self._db.session() as session:
            rows = session.execute(
                select(Item.id, Item.status, Item.owner, Item.lease_until)
                .join(Run, Run.id == Item.run_id)
                .where(Run.status == RunStatus.RUNNING)
                .where(or_(Item.status == ItemStatus.RUNNING, lost_message))
                .limit(BATCH * 10)
            ).all()
        if broker_lost:
            # Every message is gone, including the next link of chains in progress. Taking the
            # items over (new owner tokens) makes any answer still in flight for them void.
            return [row.id for row in rows][:BATCH]
        owners = sorted({worker_of(r.owner) for r in rows if r.owner})
        alive = self.heartbeat.alive(owners)

        def lost(row: Any) -> bool:
            if row.status == ItemStatus.QUEUED:
                return True
            expired = row.lease_until is None or as_utc(row.lease_until) < now
            return expired or not row.owner or worker_of(row.owner) not in alive

        return [row.id for row in rows if lost(row)][:BATCH]
