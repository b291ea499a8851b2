"""Ended runs older than `RECALLQ_RETENTION_DAYS` are deleted, with their items and claims.

One worker per interval applies it (an ExclusiveTurn, recallq.coordination.periodic), every
`RECALLQ_RETENTION_INTERVAL` seconds, from its housekeeping thread; a run is old when it
ended (completed or cancelled) that many days ago. Runs still queued or running are never
touched, whatever their age.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from recallq.coordination import keys
from recallq.coordination.call_gate import CallGate
from recallq.coordination.periodic import ExclusiveTurn
from recallq.state.runs import RunStore
from recallq.state.tables import utcnow

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

BATCH = 100  # runs deleted per transaction-sized step of a sweep


class Retention:
    def __init__(
        self,
        redis: Redis,
        runs: RunStore,
        gate: CallGate,
        days: float | None,
        interval: float,
        worker_id: str,
    ) -> None:
        self._runs = runs
        self._gate = gate
        self.days = days
        self.interval = interval
        self._turn = ExclusiveTurn(redis, keys.RETENTION_LOCK, interval, worker_id)

    def try_sweep(self) -> int:
        """Sweep if retention is set and no other worker did within the interval."""
        if not self.days or self.days <= 0:
            return 0
        return self.sweep() if self._turn.claim() else 0

    def sweep(self) -> int:
        """Delete every run that ended more than `days` ago; returns how many."""
        assert self.days is not None
        cutoff = utcnow() - timedelta(days=self.days)
        total = 0
        while True:
            deleted = self._runs.delete_expired(cutoff, BATCH)
            for run_id in deleted:
                self._gate.forget(run_id)
            total += len(deleted)
            if len(deleted) < BATCH:
                break
        if total:
            log.info("retention: deleted %d run(s) that ended before %s", total, cutoff)
        return total
