"""The worker's Celery app and the runtime its tasks share.

`start(settings)` builds both once, where the worker process starts (`recallq worker`):
the library patches are applied, the app is configured for the broker, and the runtime
(database, Redis, judges, engine) is built. Tasks reach that runtime through `runtime()`.
"""

from __future__ import annotations

from celery import Celery

from recallq import broker, metrics, patches
from recallq.redact import install_log_redaction
from recallq.runtime import Runtime
from recallq.settings import Settings

app = Celery("recallq", include=["worker.tasks", "worker.housekeeping"])
_runtime: Runtime | None = None


def start(settings: Settings, metrics_address: tuple[str, int] | None = None) -> Celery:
    """Configure the app and build this worker's runtime; returns the app to run. With
    `metrics_address` (host, port), this process's metrics are served there."""
    global _runtime
    patches.prepare_kombu()
    patches.prepare_litellm()  # before the first task: litellm loads in ~6 s of CPU
    broker.configure(app, settings.redis_url)
    # No pre-ping before each transaction: an outage already hands the message back.
    queue = broker.CeleryQueue(app, settings.extraction_pack)
    _runtime = Runtime.distributed(settings, queue, pre_ping=False)
    # provider errors are redacted before they are stored; this covers every log line too
    install_log_redaction(_runtime.redactor)
    if metrics_address is not None:
        models = _runtime.models.keys
        metrics.use_state_collectors(
            metrics.HeartbeatCollector(), metrics.BreakerCollector(_runtime.breaker, models)
        )
        metrics.serve(*metrics_address)
    return app


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("worker.celery_app.start() was not called in this process")
    return _runtime
