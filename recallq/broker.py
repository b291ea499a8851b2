"""The Celery broker as the engine's work queue: how messages are named, routed and sent.

The API and the workers both send (a new run's dispatch; an item's stages), so this lives in
the library; the tasks that receive these messages are the worker's (worker.tasks).

    dispatch(run_id)                  top up the run's window of queued items
    extract_group([item_id, ...])     one per group of released items; it sends, for each
        └──► attribute(pass, item_id)     item whose claims it found, its attribution
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from recallq.outcomes import Taken

QUEUE = "recallq"
DISPATCH = "recallq.dispatch"
EXTRACT_GROUP = "recallq.extract_group"
ATTRIBUTE = "recallq.attribute"


def configure(app: Celery, broker_url: str) -> Celery:
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            # longer than any task (attempts x timeout), so acks_late never redelivers live work
            "visibility_timeout": 3 * 3600,
        },
        task_default_queue=QUEUE,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_enable_soft_shutdown_on_idle=True,
        worker_soft_shutdown_timeout=30.0,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
    )
    return app


class CeleryQueue:
    """Sends the engine's work as Celery messages by task name."""

    def __init__(self, app: Celery, group_size: int) -> None:
        self.app = app
        self.group_size = group_size

    def send_items(self, item_ids: Sequence[int]) -> None:
        for start in range(0, len(item_ids), self.group_size):
            group = list(item_ids[start : start + self.group_size])
            self.app.send_task(EXTRACT_GROUP, args=[group])

    def send_attribution(self, taken: Taken) -> None:
        self.app.send_task(ATTRIBUTE, args=[taken.to_message(), taken.item_id])

    def send_dispatch(self, run_id: str) -> None:
        self.app.send_task(DISPATCH, args=[run_id])
