"""Sends waiting items when a model's circuit breaker has something due, instead of when
their leases run out and the reaper's next sweep finds them (issue 28: a run finished 70 s
after its provider came back, 10 s of it the reaper's interval after a probe).

breaker.lua notes in `keys.BREAKER_WAKES` when to look at a model; every worker asks each
second whether a wake is due (one Redis read), and the one that claims the turn (a shared
lock) takes the due wakes and, for each model:
- its breaker closed: every item waiting out the incident goes back to the queue now;
- its next probe may go (or a probe's holder went silent past its deadline): one item goes,
  to be the probe;
- a wake no longer due (the breaker re-opened since): nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from recallq.coordination import keys
from recallq.coordination.breaker import RedisCircuitBreaker
from recallq.coordination.periodic import ExclusiveTurn
from recallq.execution.engine import WorkQueue
from recallq.state.items import ItemStore

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

#: Seconds between two looks at the wakes (how late a probe or a resumption may be).
INTERVAL = 1.0


class BreakerWakes:
    def __init__(
        self,
        redis: Redis,
        breaker: RedisCircuitBreaker,
        items: ItemStore,
        queue: WorkQueue,
        holder: str,
        interval: float = INTERVAL,
    ) -> None:
        self._breaker = breaker
        self._items = items
        self._queue = queue
        self.interval = interval
        self._turn = ExclusiveTurn(redis, keys.BREAKER_WAKES_LOCK, interval, holder)

    def try_sweep(self) -> int:
        """Sweep the due wakes if one is due and no other worker took this turn; returns how
        many items were sent."""
        if not self._breaker.wakes_due() or not self._turn.claim():
            return 0
        return self.sweep()

    def sweep(self) -> int:
        sent = 0
        for model in self._breaker.take_due_wakes():
            state = self._breaker.state(model)
            if state is not None and state.next_probe_at > self._breaker.now():
                continue  # re-opened since: its own wake is due later
            woken = self._items.wake_waiting(model, None if state is None else 1)
            if woken:
                self._queue.send_items(woken)
                what = "its breaker closed" if state is None else "a probe is due"
                log.info("%s: %s; %d waiting item(s) sent", model, what, len(woken))
            sent += len(woken)
        return sent
