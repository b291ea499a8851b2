"""The worker's background threads: its heartbeat, the reaper's sweeps, the retention and
handing back the items of tasks that a database or Redis outage interrupted; the provider
batch lane's polls.

Started when the worker is ready, stopped when it shuts down. One worker at a time sweeps
(see recallq.reaper) and applies the retention (recallq.retention); every worker beats. One
worker at a time polls the batch lane (see recallq.batch_lane), in a thread of its own:
applying a large batch's results takes longer than a heartbeat may wait.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import signals

from recallq.batch_lane import BatchLane
from recallq.coordination import keys
from recallq.reaper import Reaper
from recallq.retention import Retention
from recallq.store import ItemStore
from worker.celery_app import runtime

log = logging.getLogger(__name__)

_stop = threading.Event()
_abandoned: set[int] = set()
_abandoned_lock = threading.Lock()


def hand_back(item_ids: list[object]) -> None:
    """Items an interrupted task held: their leases expire as soon as the database answers."""
    with _abandoned_lock:
        _abandoned.update(i for i in item_ids if isinstance(i, int))


def _hand_back_abandoned(items: ItemStore) -> None:
    with _abandoned_lock:
        pending = list(_abandoned)
    for item_id in pending:
        items.expire_lease(item_id)  # raises while the database is still down: next beat
        with _abandoned_lock:
            _abandoned.discard(item_id)


def _loop(reaper: Reaper, retention: Retention, items: ItemStore) -> None:
    heartbeat = reaper.heartbeat
    next_sweep = time.monotonic() + min(reaper.interval, heartbeat.interval)
    next_retention = time.monotonic() + min(reaper.interval, retention.interval)
    while not _stop.is_set():
        try:
            _hand_back_abandoned(items)
        except Exception:  # the database is still down
            log.info("items to hand back wait for the database", exc_info=True)
        try:
            heartbeat.beat()
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + reaper.interval
                reaper.try_sweep()
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + retention.interval
                retention.try_sweep()
        except Exception:  # an outage must not kill the thread
            log.warning("housekeeping failed; retrying", exc_info=True)
        _stop.wait(min(heartbeat.interval, reaper.interval))


def _lane_loop(lane: BatchLane, worker_id: str) -> None:
    interval = lane.interval
    lock_ms = max(100, int(interval * 900))
    while not _stop.wait(interval):
        try:
            redis = runtime().redis
            assert redis is not None
            # one poll per interval across the workers (the poll's own lock keeps them apart)
            if redis.set(keys.BATCH_LANE_POLL, worker_id, nx=True, px=lock_ms):
                report = lane.poll()
                if report.batches_created or report.batches_applied or report.adopted:
                    log.info("batch lane: %s", report)
        except Exception:  # an outage must not kill the thread
            log.warning("batch lane poll failed; retrying", exc_info=True)


@signals.after_setup_logger.connect
def _quiet_per_task_logs(**_: Any) -> None:
    # "received" and "succeeded" lines for every task cost CPU and say nothing the
    # database does not; failures are still logged at WARNING and above.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.worker_ready.connect
def _start(**_: Any) -> None:
    current = runtime()
    reaper = current.reaper()
    reaper.heartbeat.beat()
    reaper.mark_broker_fresh()
    retention = current.retention()
    thread = threading.Thread(
        target=_loop,
        args=(reaper, retention, current.items),
        name="recallq-housekeeping",
        daemon=True,
    )
    thread.start()
    lane = current.batch_lane()
    threading.Thread(
        target=_lane_loop,
        args=(lane, reaper.heartbeat.worker_id),
        name="recallq-batch-lane",
        daemon=True,
    ).start()


@signals.worker_shutdown.connect
def _stop_housekeeping(**_: Any) -> None:
    _stop.set()
