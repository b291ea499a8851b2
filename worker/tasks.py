"""Celery tasks: thin wrappers that run pipeline stages, chained per item.

    extract(item_id) -> owner token | None  ──►  attribute(token, item_id)

A database or Redis outage inside a task puts its message back in the queue (Reject with
requeue) instead of failing it, so nothing is lost while a service restarts.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import sqlalchemy.exc
from celery import Task, chain, signals
from celery.exceptions import Reject

from recallq import db
from recallq.settings import get_settings
from worker import liveness, pipeline, reaper
from worker.celery_app import DISPATCH_TASK, app
from worker.judges import is_local_mode, redis_client

log = logging.getLogger(__name__)

db.skip_pre_ping()

OUTAGES = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, redis.ConnectionError)
OUTAGE_PAUSE = 2.0


def enqueue_items(item_ids: list[int]) -> None:
    for item_id in item_ids:
        chain(extract.si(item_id), attribute.s(item_id)).apply_async()


def requeue_on_outage(task: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except OUTAGES as exc:
            log.warning("%s: service unavailable (%s); message goes back", task.__name__, exc)
            if isinstance(exc, redis.ConnectionError) and isinstance(args[-1], int):
                # a broker that is down may lose the message handed back: let the reaper
                # resend it soon instead of waiting for the stage's lease to run out
                pipeline.expire_lease(args[-1])
            time.sleep(OUTAGE_PAUSE)
            raise Reject(str(exc), requeue=True) from exc

    return run


def _holder_alive(owner: str) -> bool:
    if is_local_mode():
        return False
    return bool(liveness.alive(redis_client(), [liveness.worker_of(owner)]))


@app.task(name=DISPATCH_TASK)
@requeue_on_outage
def dispatch(run_id: str) -> int:
    return pipeline.dispatch(run_id, enqueue_items)


@app.task(name="recallq.extract", bind=True)
@requeue_on_outage
def extract(self: Task, item_id: int) -> dict[str, Any] | None:
    taken = pipeline.take(item_id, _holder_alive)
    if isinstance(taken, pipeline.Taken):
        taken = pipeline.extract(taken)
    if isinstance(taken, pipeline.Taken):
        return taken.to_message()
    pipeline.finish_up(taken, enqueue_items)
    self.request.chain = None  # the item ended here (or is not ours): no attribution
    return None


@app.task(name="recallq.attribute")
@requeue_on_outage
def attribute(taken: dict[str, Any] | None, item_id: int) -> None:
    if taken is not None:
        pipeline.finish_up(pipeline.attribute(pipeline.Taken(**taken)), enqueue_items)


# --- the worker's background thread: heartbeat and reaper ---------------------------------------

_stop = threading.Event()


def _housekeeping() -> None:
    interval = get_settings().reaper_interval
    next_sweep = time.monotonic() + min(interval, liveness.beat_interval())
    while not _stop.is_set():
        try:
            client = redis_client()
            liveness.beat(client)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + interval
                reaper.try_sweep(client, interval, enqueue_items, dispatch.delay)
        except Exception:  # noqa: BLE001  (an outage must not kill the thread)
            log.warning("housekeeping failed; retrying", exc_info=True)
        _stop.wait(min(liveness.beat_interval(), interval))


@signals.after_setup_logger.connect
def _quiet_per_task_logs(**_: Any) -> None:
    # "received" and "succeeded" lines for every task cost CPU and say nothing the
    # database does not; failures are still logged at WARNING and above.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.worker_ready.connect
def _start_housekeeping(**_: Any) -> None:
    if app.conf.broker_url.startswith("memory://"):
        return  # local mode: one process, nothing to reap
    client = redis_client()
    liveness.beat(client)
    client.set(reaper.EPOCH_KEY, "1", nx=True)  # a fresh broker has lost nothing
    threading.Thread(target=_housekeeping, name="recallq-housekeeping", daemon=True).start()


@signals.worker_shutdown.connect
def _stop_housekeeping(**_: Any) -> None:
    _stop.set()
