"""The worker's background threads: its heartbeat (with the messages it holds), the reaper's
sweeps, the retention and handing back the items of tasks that a database or Redis outage
interrupted; the provider batch lane's polls; the outages' probe (worker.outages: a job that
fails for an outage says so once per outage, not with a traceback each time).

Started when the worker is ready, stopped when it shuts down. Every job is a Periodic, and
the reaper, the retention, the breaker wakes and the lane poll run at most once per interval
across all workers (an ExclusiveTurn each; see recallq.coordination.periodic); every worker
beats. The breaker wakes (recallq.execution.breaker_wakes: a probe due, a breaker closed) are
looked at every second in a thread of their own, not behind a sweep. The heartbeat
beats in a thread of its own, and so does the lane poll: a job waiting on the database must
not hold a beat back (over a 200 ms link to Postgres a sweep took seconds, longer than the
heartbeat TTL of the multi-host tests, and the other workers took this one for dead and took
its items over: tests/multihost).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import signals

from recallq.batch.lane import BatchLane
from recallq.coordination import keys
from recallq.coordination.periodic import ExclusiveTurn, Periodic, run_periodically
from worker.celery_app import WorkerState, state
from worker.outages import PROBE_INTERVAL
from worker.tasks import items_of

log = logging.getLogger(__name__)


def heartbeat_job(worker: WorkerState) -> Periodic:
    """This worker's beat, with the items it holds (Redis only)."""
    heartbeat = worker.runtime.heartbeat
    assert heartbeat is not None  # a worker's runtime is distributed

    def beat() -> None:
        heartbeat.beat()
        worker.held.publish()

    told = worker.outages.failed
    return Periodic("heartbeat", heartbeat.interval, beat, first_after=0, told=told)


def housekeeping_jobs(worker: WorkerState) -> list[Periodic]:
    """The jobs that wait on the database: the hand-back, the usage spool (what answered calls
    used that an outage kept from the database: recallq.state.usage_spool), the reaper, the
    retention."""
    current = worker.runtime
    reaper, retention = current.reaper(), current.retention()
    heartbeat = reaper.heartbeat
    told = worker.outages.failed
    return [
        Periodic("hand-back", heartbeat.interval, worker.hand_back.drain, first_after=0, told=told),
        Periodic("usage spool", heartbeat.interval, current.items.write_spooled, first_after=0),
        Periodic(
            "reaper",
            reaper.interval,
            reaper.try_sweep,
            min(reaper.interval, heartbeat.interval),
            told=told,
        ),
        Periodic(
            "retention",
            retention.interval,
            retention.try_sweep,
            min(reaper.interval, retention.interval),
            told=told,
        ),
    ]


def lane_job(worker: WorkerState, lane: BatchLane) -> Periodic:
    redis, heartbeat = worker.runtime.redis, worker.runtime.heartbeat
    assert redis is not None and heartbeat is not None  # a worker's runtime is distributed
    turn = ExclusiveTurn(redis, keys.BATCH_LANE_POLL, lane.interval, heartbeat.worker_id)

    def poll() -> None:
        # one poll per interval across the workers (the poll's own lock keeps them apart)
        if turn.claim():
            report = lane.poll()
            if report.batches_created or report.batches_applied or report.adopted:
                log.info("batch lane: %s", report)

    return Periodic("batch lane poll", lane.interval, poll, told=worker.outages.failed)


@signals.after_setup_logger.connect
def _quiet_per_task_logs(**_: Any) -> None:
    # "received" and "succeeded" lines for every task cost CPU and say nothing the
    # database does not; failures are still logged at WARNING and above.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.task_received.connect
def _hold(request: Any = None, **_: Any) -> None:
    """A message is this worker's from its receipt (it may wait, prefetched, for a thread)."""
    task = getattr(request, "task", None)
    if task is not None:
        state().held.received(items_of(task.run, request.args, request.kwargs))


@signals.worker_ready.connect
def _start(**_: Any) -> None:
    worker = state()
    beat = heartbeat_job(worker)
    beat.job()  # at once: this worker is alive before anything else happens
    probe = Periodic("outage probe", PROBE_INTERVAL, worker.outages.probe)
    wakes = worker.runtime.breaker_wakes()
    woken = Periodic("breaker wakes", wakes.interval, wakes.try_sweep, told=worker.outages.failed)
    for name, jobs in (
        ("recallq-heartbeat", [beat]),
        ("recallq-housekeeping", housekeeping_jobs(worker)),
        ("recallq-outages", [probe]),  # its own: a ping may wait its connect timeout
        ("recallq-breaker-wakes", [woken]),
    ):
        threading.Thread(
            target=run_periodically, args=(jobs, worker.stop), name=name, daemon=True
        ).start()
    threading.Thread(
        target=run_periodically,
        args=([lane_job(worker, worker.runtime.batch_lane())], worker.stop),
        name="recallq-batch-lane",
        daemon=True,
    ).start()


@signals.worker_shutdown.connect
def _stop_housekeeping(**_: Any) -> None:
    worker = state()
    worker.stop.set()
    worker.held.clear()
