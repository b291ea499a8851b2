"""Celery tasks: thin wrappers around the engine's stages.

    extract_group([item_id, ...])  ──► for each item whose claims were found:
                                       attribute(pass, item_id)

What follows each stage is the engine's routing (Engine.go_on), as in the local runner; a
deferred item is the reaper's to send again when it is due.

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
from recallq.outcomes import Taken
from worker import housekeeping
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
            # This worker still holds the items it took, and it lives on: its message may come
            # back to a worker that leaves them to it, or be lost with the broker. Hand them
            # back as soon as the database answers, so the reaper sends them again then.
            last = args[-1] if args else None
            housekeeping.hand_back(last if isinstance(last, list) else [last])
            time.sleep(OUTAGE_PAUSE)
            raise Reject(str(exc), requeue=True) from exc

    return run


@app.task(name=broker.DISPATCH)
@requeue_on_outage
def dispatch(run_id: str) -> int:
    return runtime().engine.dispatch(run_id)


@app.task(name=broker.EXTRACT_GROUP)
@requeue_on_outage
def extract_group(item_ids: list[int]) -> None:
    engine = runtime().engine
    for item_id, outcome in zip(item_ids, engine.extract_group(item_ids), strict=True):
        engine.go_on(item_id, outcome)  # a deferred item: the reaper sends it when due


@app.task(name=broker.ATTRIBUTE)
@requeue_on_outage
def attribute(message: dict[str, Any] | None, item_id: int) -> None:
    if message is not None:
        engine = runtime().engine
        engine.go_on(item_id, engine.attribute(Taken.from_message(message)))
