"""The worker's Celery app and the state its tasks share.

    prepare(settings)      once, where `recallq worker` starts, before it forks its
                           processes: the library patches (litellm's when a model
                           takes its lane), the app configured for the broker, its
                           tasks and Celery's worker imported
    start(settings, ...)   in each process: its state (`WorkerState`: its runtime, the
                           messages it holds, the items it hands back), its metrics page
    run(...)               in each process: Celery's worker, M threads, until it stops

Tasks and the housekeeping reach that state through `state()`, and the runtime through
`runtime()`.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, signals

from recallq import patches
from recallq.coordination.liveness import HeldItems
from recallq.core.redact import install_log_redaction
from recallq.execution import celery_queue as broker
from recallq.execution.reaper import HandBack
from recallq.execution.runtime import Runtime
from recallq.judge import lanes
from recallq.judge.models import JudgeModelsError, batch_models, load_models
from recallq.observability import gauges as metrics_state
from recallq.observability import metrics
from recallq.runs.run_views import keep_view
from recallq.settings import Settings
from worker.outages import DATABASE, REDIS, Outages, quiet_rejections

app = Celery("recallq", include=["worker.tasks", "worker.housekeeping"])


@dataclass
class WorkerState:
    """Everything of this worker process that outlives a task, owned in one place."""

    runtime: Runtime
    held: HeldItems  # items of the messages received and not finished (for the reaper)
    hand_back: HandBack  # items of tasks that ended without settling them
    outages: Outages  # the database or Redis out now: said once each, waited out
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def build(cls, runtime: Runtime) -> WorkerState:
        if runtime.redis is None or runtime.heartbeat is None:
            raise RuntimeError("a worker needs Redis: build its runtime with distributed()")
        worker_id = runtime.heartbeat.worker_id
        outages = Outages({DATABASE: runtime.database.ping, REDIS: runtime.redis.ping})
        return cls(
            runtime,
            HeldItems(runtime.redis, worker_id),
            HandBack(runtime.items, worker_id),
            outages,
        )


_state: WorkerState | None = None


#: what Celery's worker and kombu's Redis transport import as a worker starts
_IMPORTED_AS_A_WORKER_STARTS = (
    "celery.apps.worker",
    "celery.bin.celery",
    "celery.concurrency.thread",
    "celery.worker.consumer",
    "kombu.transport.redis",
)


def prepare(settings: Settings) -> Celery:
    """What every worker process shares, done once before they are forked: they start in a
    fraction of a second, and share these pages with each other instead of a copy each
    (litellm alone is 4-6 s of CPU and 150 MiB, imported only when a model needs it)."""
    patches.prepare_kombu()
    if _calls_litellm(settings):
        importlib.import_module("recallq.judge.litellm_transport")  # litellm, patched
    broker.configure(app, settings.redis_url)
    app.loader.import_default_modules()  # the tasks and the housekeeping's signal handlers
    app.finalize(auto=True)
    for module in _IMPORTED_AS_A_WORKER_STARTS:
        importlib.import_module(module)
    return app


def _calls_litellm(settings: Settings) -> bool:
    """Whether a model of the models file takes the litellm lane (recallq.judge.lanes) or may
    use the provider Batch API (the batch lane speaks through litellm)."""
    try:
        models = load_models(settings.models_file)
    except JudgeModelsError:
        return True  # the runtime says what is wrong with the file, as it did before
    return lanes.needs_litellm(models.values()) or bool(batch_models(models))


def start(
    settings: Settings,
    ready: Callable[[], None],
    metrics_at: tuple[socket.socket, str] | None = None,
) -> None:
    """Build this worker process's state (its own database engine, Redis clients and
    heartbeat: nothing of the kind crosses a fork). `ready()` is called once it takes tasks.
    With `metrics_at` (the command's listening socket and the processes' metrics directory),
    this process serves the page of them all there too."""
    global _state
    # No pre-ping before each transaction: an outage already hands the message back.
    queue = broker.CeleryQueue(app, settings.extraction_pack)
    runtime = Runtime.distributed(settings, queue, worker=True)
    runtime.on_completed = keep_view
    _state = WorkerState.build(runtime)
    # provider errors are redacted before they are stored; this covers every log line too
    install_log_redaction(runtime.redactor)
    if metrics_at is not None:
        listening, directory = metrics_at
        metrics.serve_processes(
            listening,
            metrics_state.WorkerProcessesCollector(directory),
            metrics_state.BreakerCollector(runtime.breaker, runtime.models.keys),
        )
    # the command says "ready." once for all its processes, not Celery once for each
    logging.getLogger("celery.apps.worker").addFilter(_without_ready_line)
    # a message handed back in an outage: Outages says it once, not Celery with a traceback
    logging.getLogger("celery.app.trace").addFilter(quiet_rejections)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        # the supervisor replaces a process that stops: Celery's SIGHUP would exec a second
        # command inside this one
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        ready()


def _without_ready_line(record: logging.LogRecord) -> bool:
    return record.msg != "%s ready."


def run(concurrency: int, loglevel: str, banner: bool) -> int:
    """Celery's worker in this process, until it stops; its exit code."""
    code = app.start(
        [
            *([] if banner else ["--quiet"]),
            "worker",
            "--hostname",  # unique on the host, and the pid of the heartbeat's worker id
            f"recallq-{os.getpid()}@%h",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--queues",
            broker.QUEUE,
            "--loglevel",
            loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return int(code or 0)


def state() -> WorkerState:
    if _state is None:
        raise RuntimeError("worker.celery_app.start() was not called in this process")
    return _state


def runtime() -> Runtime:
    return state().runtime
