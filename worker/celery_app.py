"""The Celery app. Importing it is cheap: tasks (and litellm) load only inside a worker."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from recallq.settings import get_settings

QUEUE = "recallq"
DISPATCH_TASK = "recallq.dispatch"


def _closed_broker_is_a_connection_error() -> None:
    """When Redis goes away while messages are unacknowledged, Celery collects the broken
    connection (detaching its transport) and then closes it, and closing tries to put those
    messages back through the detached transport: an AttributeError that Celery treats as
    unrecoverable, so the worker exits (seen in about 1 of 8 Redis restarts). Raise the
    connection error it really is: Celery then reconnects as usual, and the reaper resends
    what the broker lost."""
    original = kombu_redis.Channel._connparams
    if getattr(original, "_recallq", False):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the broker connection is already closed")
        return original(self, asynchronous)

    _connparams._recallq = True  # type: ignore[attr-defined]
    kombu_redis.Channel._connparams = _connparams


_closed_broker_is_a_connection_error()


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
