"""Celery tasks: thin wrappers that run pipeline stages and chain them per item."""

from __future__ import annotations

from celery import chain

from worker import pipeline
from worker.celery_app import DISPATCH_TASK, app


def enqueue_items(item_ids: list[int]) -> None:
    for item_id in item_ids:
        chain(extract.si(item_id), attribute.si(item_id)).apply_async()


@app.task(name=DISPATCH_TASK)
def dispatch(run_id: str) -> int:
    return pipeline.dispatch(run_id, enqueue_items)


@app.task(name="recallq.extract")
def extract(item_id: int) -> None:
    pipeline.extract(item_id)


@app.task(name="recallq.attribute")
def attribute(item_id: int) -> None:
    pipeline.attribute(item_id)
    pipeline.after_item(item_id, enqueue_items)
