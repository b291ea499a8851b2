"""Periodic work of a worker, and work done at most once per interval across all workers.

    Periodic(interval, job)            this process runs `job` every `interval` seconds
    ExclusiveTurn(redis, key, ...)     at most one worker claims each interval's turn
    run_periodically(jobs, stop)       a thread's loop over its periodic jobs

The reaper, the retention and the batch lane poll each take an `ExclusiveTurn` before they
run; the heartbeat is a `Periodic` of every worker with no turn to take.

The lock floor. A turn is a Redis key set with NX and a time to live of 90% of the interval
(the holder's next tick, one interval later, finds it gone even with a little jitter), and
never less than `LOCK_FLOOR` seconds: below that, a Redis round trip and the workers' clocks
and scheduling are not precise enough to keep two claims of one short interval apart. A turn
excludes other workers for its time to live only; a job that must never overlap itself
(the batch lane poll) keeps its own lock as well.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

LOCK_FLOOR = 0.1  # seconds: the shortest turn (see the module docstring)
TURN_SHARE = 0.9  # of the interval a claimed turn lasts


def turn_ms(interval: float) -> int:
    """How long a claimed turn of `interval` seconds excludes other workers, in ms."""
    return int(max(LOCK_FLOOR, interval * TURN_SHARE) * 1000)


class ExclusiveTurn:
    """At most one claim per interval across every process sharing this Redis."""

    def __init__(self, redis: Redis, key: str, interval: float, holder: str) -> None:
        self._redis = redis
        self.key = key
        self.interval = interval
        self.holder = holder

    def claim(self) -> bool:
        """Whether this process has this interval's turn (nobody else claimed it)."""
        return bool(self._redis.set(self.key, self.holder, nx=True, px=turn_ms(self.interval)))


class Periodic:
    """A job this process runs every `interval` seconds, the first time `first_after` seconds
    after it is made (default: one interval). A job that raises is run again at its next
    time (an outage must not stop the loop), and logged with its traceback unless `told`
    says it took care of it (a worker's outages: worker.outages, said once per outage)."""

    def __init__(
        self,
        name: str,
        interval: float,
        job: Callable[[], object],
        first_after: float | None = None,
        told: Callable[[Exception, str], bool] | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self.job = job
        self.told = told
        self.next_at = time.monotonic() + (interval if first_after is None else first_after)

    def run_if_due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.interval
        try:
            self.job()
        except Exception as exc:  # an outage must not kill the thread
            if self.told is not None and self.told(exc, self.name):
                return True
            log.warning("%s failed; again in %.1f s", self.name, self.interval, exc_info=True)
        return True


def run_periodically(jobs: Sequence[Periodic], stop: threading.Event) -> None:
    """Run each job when it is due until `stop` is set; jobs of one loop never overlap."""
    while not stop.is_set():
        now = time.monotonic()
        for job in jobs:
            job.run_if_due(now)
        next_at = min(job.next_at for job in jobs)
        stop.wait(max(0.0, next_at - time.monotonic()))
