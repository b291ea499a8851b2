"""Puts work back when its worker or its broker message vanished, and keeps runs flowing.

One worker per interval sweeps (an ExclusiveTurn, recallq.coordination.periodic), every
`reaper_interval` seconds. Lost work comes back within the heartbeat TTL plus one interval,
whatever held it:
- Redis lost its data (restarted without persistence, or flushed; the broker epoch,
  recallq.execution.broker_epoch, tells from Postgres, whoever started first): every queued or
  running item of a running run lost its message, so all of them go back to the queue;
- running items whose worker stopped heart-beating (SIGKILL, OOM) or whose lease ran out
  (a task that ended without settling its items hands them back: `HandBack`);
- items of messages a dead worker held (received, prefetched or mid-stage: its HeldItems),
  unless a live worker now owns the item and holds a message of it;
- queued items whose lease ran out (a lost message, or a deferred item now due);
- every queued or running run is dispatched again, which refills its window.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select

from recallq.coordination import keys
from recallq.coordination.liveness import Heartbeat, forget_held, held_by, worker_of
from recallq.coordination.periodic import ExclusiveTurn
from recallq.core.status import RUN_ACTIVE, ItemStatus, RunStatus
from recallq.execution.broker_epoch import BrokerEpochs
from recallq.execution.celery_queue import forget_unacknowledged, queued_items, unacknowledged
from recallq.execution.engine import WorkQueue
from recallq.state.db import Database
from recallq.state.items import ItemStore
from recallq.state.tables import Item, Run, as_utc, utcnow

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

BATCH = 1000
IN_FLIGHT = (ItemStatus.QUEUED, ItemStatus.RUNNING)
#: How long a commit that releases or moves an item may come before the message it sends.
SEND_MARGIN_S = 5.0


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
        self._turn = ExclusiveTurn(redis, keys.REAPER_LOCK, interval, heartbeat.worker_id)
        self._epochs = BrokerEpochs(redis, database)

    def try_sweep(self) -> int:
        """Sweep if no other worker did within the interval."""
        return self.sweep() if self._turn.claim() else 0

    def sweep(self) -> int:
        """One pass. Returns how many items went back to the queue."""
        if self._epochs.lost():
            requeued = self._requeue_all_in_flight()
            log.warning("requeueing %d item(s) (broker lost its data)", requeued)
        else:
            requeued = self._requeue_lost()
        with self._db.session() as session:
            active = list(session.scalars(select(Run.id).where(Run.status.in_(RUN_ACTIVE))))
        for run_id in active:
            self._queue.send_dispatch(run_id)
        return requeued

    def _messages(self) -> tuple[set[int], dict[str, tuple[float, list[int]]], set[int]]:
        """The items of the messages waiting in the broker, the messages delivered and not
        acknowledged, and the items live workers hold messages of: the broker first, in the
        order a message moves (waiting, delivered), then the workers, then (the callers) the
        database, so a message in flight between two reads is not missed."""
        waiting = queued_items(self._redis)
        unacked = unacknowledged(self._redis, math.inf)
        live_held = held_by(self._redis, self.heartbeat.live_workers_ids())
        return waiting, unacked, {i for ids in live_held.values() for i in ids}

    def _requeue_lost(self) -> int:
        waiting, unacked, holding = self._messages()
        delivered_before = time.time() - self.heartbeat.ttl
        held = held_by(self._redis, self.heartbeat.dead_workers())
        # Messages delivered over a TTL ago, never acknowledged, that no live worker holds: a
        # worker died with them, maybe before it could even note that it held them.
        orphans = {
            tag: ids
            for tag, (delivered, ids) in unacked.items()
            if delivered < delivered_before and not holding.intersection(ids)
        }
        dead_held = {i for ids in [*held.values(), *orphans.values()] for i in ids}
        in_unacked = {i for _, ids in unacked.values() for i in ids}
        with_message = waiting | in_unacked | holding | dead_held
        lost, left = self._lost(dead_held, with_message)
        if lost:
            log.warning("requeueing %d item(s)", len(lost))
        requeued = self._items.requeue_lost(lost)
        if requeued:
            self._queue.send_items(requeued)
        # only once their items are requeued (a failure above: the next sweep again); what
        # a live owner holds stays, to be looked at again when it no longer does
        forget_held(self._redis, [w for w, ids in held.items() if ids and not ids & left])
        forget_unacknowledged(self._redis, [t for t, ids in orphans.items() if not left & set(ids)])
        return len(requeued)

    def _requeue_all_in_flight(self) -> int:
        """Every message sent before the loss is gone, including the next link of chains in
        progress: each item in flight goes back to the queue unless a message of it is in the
        broker now (sent since, as a submission right after a flush sends them) or a live
        worker holds one. Taking the items over (new owner tokens) makes any answer still in
        flight for them void. An item written since shortly before the broker was read may
        not have sent its message yet: it is left to the sweeps after this one, which take
        it as any item without a message (one released or between stages once it has been
        quiet for a heartbeat TTL, another queued one when its lease runs out)."""
        read_at = utcnow()
        waiting, unacked, holding = self._messages()
        with_message = waiting.union(holding, *(ids for _, ids in unacked.values()))
        sent_by = read_at - timedelta(seconds=SEND_MARGIN_S)
        written_before = or_(
            Item.lease_until.is_(None), Item.lease_until < self._lease_end_if_written_at(sent_by)
        )
        total, after = 0, 0
        while True:
            with self._db.session() as session:
                ids = list(
                    session.scalars(
                        select(Item.id)
                        .join(Run, Run.id == Item.run_id)
                        .where(Run.status == RunStatus.RUNNING)
                        .where(Item.status.in_(IN_FLIGHT), Item.id > after, written_before)
                        .order_by(Item.id)
                        .limit(BATCH)
                    )
                )
            if not ids:
                return total
            after = ids[-1]
            requeued = self._items.requeue_lost([i for i in ids if i not in with_message])
            if requeued:
                self._queue.send_items(requeued)
            total += len(requeued)

    def items_to_requeue(self, held_by_dead: Iterable[int] = ()) -> list[int]:
        """Items of running runs whose broker message or worker is gone. `held_by_dead`:
        items of messages that dead workers held."""
        return self._lost(set(held_by_dead))[0]

    def _lost(
        self, dead_held: set[int], with_message: set[int] | None = None
    ) -> tuple[list[int], set[int]]:
        """The items lost, and those of `dead_held` left to a live owner holding them.
        `with_message`: the items of every message in the broker, delivered or not, and held
        by a worker, read before the items are (then an item released since, or one of a
        message sent since, is not in it, and is too young to be taken for lost)."""
        now = utcnow()
        queued = Item.status == ItemStatus.QUEUED
        lost_message = and_(queued, Item.lease_until < now)
        candidates = or_(Item.status == ItemStatus.RUNNING, lost_message)
        # released (queued, never taken, not deferred) over a heartbeat TTL ago
        released_before = now + timedelta(
            seconds=self._items.queue_lease_seconds - self.heartbeat.ttl
        )
        unsent = and_(
            queued,
            Item.owner.is_(None),
            Item.attempts == 0,
            Item.lease_until < released_before,
        )
        if with_message is not None:
            candidates = or_(candidates, unsent)
        quiet_before = self._lease_end_if_written_at(now - timedelta(seconds=self.heartbeat.ttl))
        if dead_held:
            candidates = or_(candidates, and_(Item.id.in_(dead_held), Item.status.in_(IN_FLIGHT)))
        with self._db.session() as session:
            rows = session.execute(
                select(Item.id, Item.status, Item.owner, Item.lease_until, Item.attempts)
                .join(Run, Run.id == Item.run_id)
                .where(Run.status == RunStatus.RUNNING)
                .where(candidates)
                .limit(BATCH * 10)
            ).all()
        owners = sorted({worker_of(r.owner) for r in rows if r.owner})
        alive = self.heartbeat.alive(owners)
        holding = _holding(self._redis, rows, dead_held, alive)

        def lost(row: Any) -> bool:
            if row.id in dead_held:
                # its message died with its worker; left alone while a live owner holds a
                # message of it (a stage of it is running there, or about to), and while it
                # was written within a TTL (requeued by the last sweep, or taken since by a
                # live worker whose held set, published with each beat, may not show it yet:
                # without this, what a sweep had requeued from a dead worker was requeued
                # again, sweep after sweep, under the live worker that took it)
                owner = worker_of(row.owner) if row.owner else None
                if owner is not None and owner not in alive:
                    return True
                if owner is not None and row.id in holding.get(owner, ()):
                    return False
                return row.lease_until is None or as_utc(row.lease_until) < quiet_before
            if row.status == ItemStatus.QUEUED:
                if with_message is not None and row.id not in with_message:
                    never_taken = row.owner is None and row.attempts == 0
                    # a worker died between releasing it and sending its message
                    if never_taken and as_utc(row.lease_until) < released_before:
                        return True
                return row.lease_until is None or as_utc(row.lease_until) < now
            expired = row.lease_until is None or as_utc(row.lease_until) < now
            if expired or not row.owner or worker_of(row.owner) not in alive:
                return True
            # between stages (or a stage that ended without settling it) with its message
            # lost: a worker killed as it took the message out of the queue (kombu's BRPOP
            # and its note of the delivery are two steps) leaves no trace in Redis
            return (
                with_message is not None
                and row.id not in with_message
                and as_utc(row.lease_until) < quiet_before
            )

        found = [row.id for row in rows if lost(row)]
        left = {row.id for row in rows if row.id in dead_held} - set(found)
        return found[:BATCH], left

    def _lease_end_if_written_at(self, moment: datetime) -> datetime:
        """The earliest end of a lease taken at `moment`, of either kind (a running item has
        a queue lease between stages, a stage's lease during one): an item whose lease ends
        before it was last written before `moment`."""
        shortest = min(self._items.queue_lease_seconds, self._items.lease_seconds)
        return moment + timedelta(seconds=shortest)


def _holding(
    redis: Redis, rows: Sequence[Any], dead_held: set[int], alive: set[str]
) -> dict[str, set[int]]:
    """What the live owners of items held by dead workers hold themselves."""
    owners = {worker_of(r.owner) for r in rows if r.id in dead_held and r.owner}
    return held_by(redis, sorted(owners & alive))


class HandBack:
    """Items of tasks that ended without settling them (an outage, an error): their leases
    expire as soon as the database answers, so the reaper sends them at its next sweep
    instead of when a 10-minute lease runs out. One per worker, drained by its
    housekeeping."""

    def __init__(self, items: ItemStore, worker_id: str) -> None:
        self._items = items
        self._worker_id = worker_id
        self._pending: set[int] = set()
        self._lock = threading.Lock()

    def add(self, item_ids: Iterable[int]) -> None:
        with self._lock:
            self._pending.update(item_ids)

    def pending(self) -> set[int]:
        with self._lock:
            return set(self._pending)

    def drain(self) -> None:
        for item_id in sorted(self.pending()):
            # raises while the database is down: again at the next beat
            self._items.expire_lease(item_id, self._worker_id)
            with self._lock:
                self._pending.discard(item_id)
