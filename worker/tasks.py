"""Celery tasks: thin wrappers around the engine's stages.

    extract_group(item_ids=[...])  ──► the items whose claims were found, together:
                                       attribute_group(messages=[...], item_ids=[...])

A group's items are attributed one after the other in its task: each of the worker's threads
keeps one judge call in flight either way, with one message per group instead of per item.

What follows each stage is the engine's routing (Engine.go_on), as in the local runner; a
deferred item is the reaper's to send again when it is due.

A database or Redis outage inside a task puts its message back in the queue (Reject with
requeue) instead of failing it, so nothing is lost while a service restarts; the outage is said
once, and each message waits a doubling pause before it goes back (worker.outages).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery.exceptions import Reject

from recallq.core.outcomes import Taken
from recallq.execution import celery_queue as broker
from recallq.execution.celery_queue import items_named
from worker.celery_app import app, runtime, state
from worker.outages import OUTAGES

log = logging.getLogger(__name__)

T = TypeVar("T")


@functools.lru_cache(maxsize=64)
def _signature(task: Callable[..., Any]) -> inspect.Signature:
    """A task function's signature, worked out once (twice per message otherwise)."""
    return inspect.signature(task)


def items_of(task: Callable[..., Any], args: Any, kwargs: Any) -> list[int]:
    """The items of one call of a task function (a message's args and kwargs)."""
    try:
        bound = _signature(task).bind(*(args or ()), **(kwargs or {}))
    except TypeError:  # a malformed message: its task fails on it, and holds no item
        return []
    return items_named(bound.arguments)


def requeue_on_outage(task: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> T:
        worker = state()
        items = items_of(task, args, kwargs)
        try:
            return task(*args, **kwargs)
        except OUTAGES as exc:
            worker.outages.failed(exc, task.__name__)  # said once per outage
            # This worker still holds the items it took, and it lives on: its message may come
            # back to a worker that leaves them to it, or be lost with the broker. Hand them
            # back as soon as the database answers, so the reaper sends them again then.
            worker.hand_back.add(items)
            worker.outages.pause(exc)  # 2 s, doubling to 30 s; less when it is back
            raise Reject(str(exc), requeue=True) from exc
        finally:
            worker.held.finished(items)

    return run


@app.task(name=broker.DISPATCH)
@requeue_on_outage
def dispatch(run_id: str) -> int:
    return runtime().engine.dispatch(run_id)


@app.task(name=broker.EXTRACT_GROUP)
@requeue_on_outage
def extract_group(item_ids: list[int]) -> None:
    engine = runtime().engine
    # a deferred item: the reaper sends it when due
    engine.go_on_group(list(zip(item_ids, engine.extract_group(item_ids), strict=True)))


@app.task(name=broker.ATTRIBUTE_GROUP)
@requeue_on_outage
def attribute_group(messages: list[dict[str, Any]], item_ids: list[int]) -> None:
    engine = runtime().engine
    passes = [Taken.from_message(message) for message in messages]
    broken: Exception | None = None
    for taken, handed in zip(passes, engine.hand_over_group(passes), strict=True):
        try:
            engine.go_on(taken.item_id, engine.attribute_handed(handed))
        except OUTAGES:
            raise  # the whole message goes back; items it finished are skipped next time
        except Exception as exc:  # one item's bug does not keep the others from their turn
            log.exception("%s: attribution failed", taken.label)
            broken = broken or exc
    if broken is not None:
        raise broken


@app.task(name=broker.ATTRIBUTE)
@requeue_on_outage
def attribute(message: dict[str, Any] | None, item_id: int) -> None:
    """One item's attribution: messages queued by a worker of an earlier version."""
    if message is not None:
        engine = runtime().engine
        engine.go_on(item_id, engine.attribute(Taken.from_message(message)))
