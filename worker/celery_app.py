"""The worker's Celery app and the state its tasks share.

`start(settings)` builds both once, where the worker process starts (`recallq worker`):
the library patches are applied, the app is configured for the broker, and the worker's state
(`WorkerState`: its runtime, the messages it holds, the items it hands back) is built. Tasks
and the housekeeping reach that state through `state()`, and the runtime through `runtime()`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from celery import Celery

from recallq import patches
from recallq.coordination.liveness import HeldItems
from recallq.core.redact import install_log_redaction
from recallq.execution import celery_queue as broker
from recallq.execution.reaper import HandBack
from recallq.execution.runtime import Runtime
from recallq.observability import gauges as metrics_state
from recallq.observability import metrics
from recallq.runs.run_views import keep_view
from recallq.settings import Settings

app = Celery("recallq", include=["worker.tasks", "worker.housekeeping"])


@dataclass
class WorkerState:
    """Everything of this worker process that outlives a task, owned in one place."""

    runtime: Runtime
    held: HeldItems  # items of the messages received and not finished (for the reaper)
    hand_back: HandBack  # items of tasks that ended without settling them
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def build(cls, runtime: Runtime) -> WorkerState:
        if runtime.redis is None or runtime.heartbeat is None:
            raise RuntimeError("a worker needs Redis: build its runtime with distributed()")
        worker_id = runtime.heartbeat.worker_id
        return cls(runtime, HeldItems(runtime.redis, worker_id), HandBack(runtime.items, worker_id))


_state: WorkerState | None = None


def start(settings: Settings, metrics_address: tuple[str, int] | None = None) -> Celery:
    """Configure the app and build this worker's state; returns the app to run. With
    `metrics_address` (host, port), this process's metrics are served there."""
    global _state
    patches.prepare_kombu()
    patches.prepare_litellm()  # before the first task: litellm loads in ~6 s of CPU
    broker.configure(app, settings.redis_url)
    # No pre-ping before each transaction: an outage already hands the message back.
    queue = broker.CeleryQueue(app, settings.extraction_pack)
    runtime = Runtime.distributed(settings, queue, worker=True)
    runtime.on_completed = keep_view
    _state = WorkerState.build(runtime)
    # provider errors are redacted before they are stored; this covers every log line too
    install_log_redaction(runtime.redactor)
    if metrics_address is not None:
        models = runtime.models.keys
        metrics.use_state_collectors(
            metrics_state.HeartbeatCollector(),
            metrics_state.BreakerCollector(runtime.breaker, models),
        )
        metrics.serve(*metrics_address)
    return app


def state() -> WorkerState:
    if _state is None:
        raise RuntimeError("worker.celery_app.start() was not called in this process")
    return _state


def runtime() -> Runtime:
    return state().runtime
