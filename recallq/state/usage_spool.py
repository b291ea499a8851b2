"""Usage the database could not take: the calls were answered (and billed), the write that
should have counted them failed (the database was down). Kept here and written once it is back.

    a store write fails ──► keep(charge)    in this process's memory and in Redis (each
                                            copy survives what the other does not: a Redis
                                            restart, a SIGKILLed worker)
    every heartbeat     ──► flush(write)    every charge kept, written under its charge id
                                            (recallq.state.items.ItemStore.write_spooled),
                                            then dropped from both copies

A charge is written in one transaction with its row in `usage_charges`, keyed by its id, and
the write that failed recorded the same row had it committed after all (its answer lost): a
charge written twice (that write and its kept copy, a flush whose commit was lost, two workers
flushing the same Redis copy, the memory and the Redis copy of one charge) is counted once.
The only usage still lost is that of calls in flight in a process killed by SIGKILL, and of
charges kept only in the memory of such a process while Redis was down too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from recallq.coordination import keys
from recallq.core.outcomes import Stage
from recallq.core.usage import Usage

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

#: Hash: charge id → charge (JSON), the usage of answered calls not written yet.
SPOOL_KEY = keys.PREFIX + "usage-spool"
#: At most this many charges are written per flush (the rest at the next).
FLUSH_BATCH = 500


@dataclass(frozen=True)
class Charge:
    """What answered calls of one item used, in one stage, not written yet."""

    charge_id: str
    item_id: int
    run_id: str
    stage: Stage
    usage: Usage
    answered_at: float  # unix seconds: when the write that counts it was made

    @classmethod
    def new(cls, item_id: int, run_id: str, stage: Stage, usage: Usage) -> Charge:
        return cls(uuid.uuid4().hex, item_id, run_id, stage, usage, time.time())

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "stage": str(self.stage)})

    @classmethod
    def from_json(cls, text: str | bytes) -> Charge:
        data = json.loads(text)
        return cls(
            str(data["charge_id"]),
            int(data["item_id"]),
            str(data["run_id"]),
            Stage(data["stage"]),
            Usage(**data["usage"]),
            float(data["answered_at"]),
        )


class UsageSpool:
    """The charges of this process not written yet, with their copy in Redis (`redis`; None:
    local mode, memory only)."""

    def __init__(self, redis: Redis | None = None) -> None:
        self._redis = redis
        self._kept: dict[str, Charge] = {}
        self._lock = threading.Lock()
        self._said_waiting = False

    def keep(self, charge: Charge) -> None:
        """Keep a charge until it is written; never raises (Redis may be down too)."""
        with self._lock:
            self._kept[charge.charge_id] = charge
            first, self._said_waiting = not self._said_waiting, True
        if first:  # once until the charges are written
            log.warning(
                "usage spool: the database did not take what answered calls used (item %d "
                "first); kept until it is back",
                charge.item_id,
            )
        if self._redis is not None:
            try:
                self._redis.hset(SPOOL_KEY, charge.charge_id, charge.to_json())
            except Exception as exc:  # the memory copy stands
                log.debug("usage spool: Redis copy of a charge not kept (%s)", exc)

    def pending(self) -> list[Charge]:
        """The charges kept here and in Redis (Redis's copies of this or any worker's)."""
        with self._lock:
            found = dict(self._kept)
        if self._redis is not None:
            try:
                stored = self._redis.hgetall(SPOOL_KEY)
            except Exception as exc:  # written later, from memory or at the next flush
                log.debug("usage spool: Redis not read (%s)", exc)
                stored = {}
            for charge_id, text in stored.items():
                try:
                    charge = Charge.from_json(text)
                except (ValueError, KeyError, TypeError):
                    log.warning("usage spool: unreadable charge %r dropped", charge_id)
                    self._forget_in_redis([charge_id])
                    continue
                found.setdefault(charge.charge_id, charge)
        # the oldest first; written in item order, as every writer of several items locks them
        oldest = sorted(found.values(), key=lambda charge: charge.answered_at)[:FLUSH_BATCH]
        return sorted(oldest, key=lambda charge: (charge.item_id, charge.charge_id))

    def flush(self, write: Callable[[Sequence[Charge]], None]) -> int:
        """Write the charges kept (`write` counts each charge id once, in one transaction),
        then drop them; how many were written. A write that fails (the database still down)
        keeps them for the next flush."""
        charges = self.pending()
        if not charges:
            return 0
        write(charges)
        ids = [charge.charge_id for charge in charges]
        with self._lock:
            self._said_waiting = False
            for charge_id in ids:
                self._kept.pop(charge_id, None)
        self._forget_in_redis(ids)
        log.info("usage spool: %d kept charges written", len(charges))
        return len(charges)

    def waiting(self, problem: Exception) -> None:
        """A flush could not write (the database is still down): said once until one can."""
        with self._lock:
            first, self._said_waiting = not self._said_waiting, True
        if first:
            first_line = (str(problem).splitlines() or [""])[0][:200]
            log.warning("usage spool: kept charges wait for the database (%s)", first_line)

    def _forget_in_redis(self, ids: Sequence[str | bytes]) -> None:
        if self._redis is None or not ids:
            return
        try:
            self._redis.hdel(SPOOL_KEY, *ids)
        except Exception as exc:  # written again later: the charge id counts it once
            log.debug("usage spool: Redis copies not dropped (%s)", exc)
