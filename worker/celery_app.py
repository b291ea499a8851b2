"""The Celery app. Importing it is cheap: tasks (and litellm) load only inside a worker."""

from __future__ import annotations

from celery import Celery

from recallq.settings import get_settings

QUEUE = "recallq"
DISPATCH_TASK = "recallq.dispatch"


def make_app(broker_url: str | None = None) -> Celery:
    settings = get_settings()
    app = Celery("recallq", include=["worker.tasks"])
    app.conf.update(
        broker_url=broker_url or settings.redis_url,
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


app = make_app()
