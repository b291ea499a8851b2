"""The worker's background thread: its heartbeat, the reaper's sweeps and the retention.

Started when the worker is ready, stopped when it shuts down. One worker at a time sweeps
(see recallq.reaper) and applies the retention (recallq.retention); every worker beats.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import signals

from recallq.reaper import Reaper
from recallq.retention import Retention
from worker.celery_app import runtime

log = logging.getLogger(__name__)

_stop = threading.Event()


def _loop(reaper: Reaper, retention: Retention) -> None:
    heartbeat = reaper.heartbeat
    next_sweep = time.monotonic() + min(reaper.interval, heartbeat.interval)
    next_retention = time.monotonic() + min(reaper.interval, retention.interval)
    while not _stop.is_set():
        try:
            heartbeat.beat()
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + reaper.interval
                reaper.try_sweep()
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + retention.interval
                retention.try_sweep()
        except Exception:  # noqa: BLE001  (an outage must not kill the thread)
            log.warning("housekeeping failed; retrying", exc_info=True)
        _stop.wait(min(heartbeat.interval, reaper.interval))


@signals.after_setup_logger.connect
def _quiet_per_task_logs(**_: Any) -> None:
    # "received" and "succeeded" lines for every task cost CPU and say nothing the
    # database does not; failures are still logged at WARNING and above.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.worker_ready.connect
def _start(**_: Any) -> None:
    reaper = runtime().reaper()
    reaper.heartbeat.beat()
    reaper.mark_broker_fresh()
    retention = runtime().retention()
    threading.Thread(
        target=_loop, args=(reaper, retention), name="recallq-housekeeping", daemon=True
    ).start()


@signals.worker_shutdown.connect
def _stop_housekeeping(**_: Any) -> None:
    _stop.set()
