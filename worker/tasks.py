"""Celery tasks: thin wrappers around the engine's stages.

    extract_group([item_id, ...])  ──► for each item whose claims were found:
                                       attribute(pass, item_id)

A database or Redis outage inside a task puts its message back in the queue (Reject with
requeue) instead of failing it, so nothing is lost while a service restarts.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import sqlalchemy.exc
from celery.exceptions import Reject

from recallq import broker
from recallq.outcomes import Continue, Taken
from worker.celery_app import app, runtime

log = logging.getLogger(__name__)

OUTAGES = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, redis.ConnectionError)
OUTAGE_PAUSE = 2.0
T = TypeVar("T")


def requeue_on_outage(task: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return task(*args, **kwargs)
        except OUTAGES as exc:
            log.warning("%s: service unavailable (%s); message goes back", task.__name__, exc)
            if isinstance(exc, redis.ConnectionError):
                # a broker that is down may lose the message handed back: let the reaper
                # resend it soon instead of waiting for the stage's lease to run out
                last = args[-1]
                for item_id in last if isinstance(last, list) else [last]:
                    _expire_lease(item_id)
            time.sleep(OUTAGE_PAUSE)
            raise Reject(str(exc), requeue=True) from exc

    return run


def _expire_lease(item_id: int) -> None:
    try:
        runtime().items.expire_lease(item_id)
    except Exception:  # noqa: BLE001  (called while handling an outage: best effort)
        log.warning("could not expire the lease of item %s", item_id, exc_info=True)


@app.task(name=broker.DISPATCH)
@requeue_on_outage
def dispatch(run_id: str) -> int:
    return runtime().engine.dispatch(run_id)


@app.task(name=broker.EXTRACT_GROUP)
@requeue_on_outage
def extract_group(item_ids: list[int]) -> None:
    current = runtime()
    for outcome in current.engine.extract_group(item_ids):
        if isinstance(outcome, Continue):
            current.queue.send_attribution(outcome.taken)
        else:
            current.engine.settle(outcome)


@app.task(name=broker.ATTRIBUTE)
@requeue_on_outage
def attribute(message: dict[str, Any] | None, item_id: int) -> None:
    if message is not None:
        engine = runtime().engine
        engine.settle(engine.attribute(Taken.from_message(message)))
