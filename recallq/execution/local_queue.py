"""Local mode's work queue: a thread pool in this process drives the engine, as a worker's
tasks do. Items sent to it are extracted in groups (one pool task per group), then each item is
attributed and settled in a pool task of its own (a worker attributes a group's items in one
task: there a message costs more than a pool task here); what follows each stage is the engine's
routing (Engine.go_on); a deferred item is sent again, by a timer, at its time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from recallq.core.outcomes import Taken
from recallq.execution.engine import Engine
from recallq.state.tables import as_utc, utcnow

log = logging.getLogger(__name__)


class LocalRunner:
    """A thread pool as the engine's work queue. Deferred items are sent again when due.

    Once stopped it takes no more work: items the engine releases after that stay queued in
    the database, for a resume to send again."""

    def __init__(self, concurrency: int, group_size: int) -> None:
        self._group_size = group_size
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="recallq-local")
        self._engine: Engine | None = None
        self._busy = 0  # work submitted or scheduled and not finished
        self._active = 0  # items a pool thread works on right now
        self._stopped = False
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    def start(self, engine: Engine) -> None:
        self._engine = engine

    def send_items(self, item_ids: Sequence[int]) -> None:
        for start in range(0, len(item_ids), self._group_size):
            group = list(item_ids[start : start + self._group_size])
            self._submit(self._extract_group, group, len(group))

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        # one pool task each: in this process a pass costs no message, and the pool's threads
        # are the calls in flight
        for taken in passes:
            self._submit(self._attribute, taken, 1)

    def send_dispatch(self, run_id: str) -> None:
        self._submit(self._dispatch, run_id, 0)

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._busy == 0

    @property
    def in_flight(self) -> int:
        """Items a pool thread is working on right now (a group's extraction counts them all)."""
        with self._lock:
            return self._active

    def stop(self, wait: bool = True) -> None:
        """Take no more work and drop what has not started. With `wait`, return once the work
        in flight has ended; without, return at once (see wait_for_in_flight)."""
        with self._lock:
            self._stopped = True
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def wait_for_in_flight(self, timeout: float) -> int:
        """After stop(wait=False): wait up to `timeout` seconds for the work in flight to end;
        returns how much is still running."""
        deadline = time.monotonic() + timeout
        while (left := self.in_flight) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def _submit(self, work: Callable[[Any], object], argument: Any, items: int) -> None:
        with self._lock:
            if self._stopped:
                return
            self._busy += 1
        self._pool.submit(self._done_after, work, argument, items)

    def _done_after(self, work: Callable[[Any], object], argument: Any, items: int) -> None:
        with self._lock:
            self._active += items
        try:
            work(argument)
        except Exception:  # one item's bug must not stop the others
            log.exception("local runner: %s(%r) failed", getattr(work, "__name__", work), argument)
        finally:
            with self._lock:
                self._busy -= 1
                self._active -= items

    def _extract_group(self, item_ids: list[int]) -> None:
        engine = self._started()
        outcomes = list(zip(item_ids, engine.extract_group(item_ids), strict=True))
        engine.go_on_group(outcomes, self._later)

    def _attribute(self, taken: Taken) -> None:
        engine = self._started()
        engine.go_on(taken.item_id, engine.attribute(taken), self._later)

    def _dispatch(self, run_id: str) -> None:
        self._started().dispatch(run_id)

    def _started(self) -> Engine:
        assert self._engine is not None, "start() the runner with its engine first"
        return self._engine

    def _later(self, item_id: int, until: datetime) -> None:
        delay = max(0.0, (as_utc(until) - utcnow()).total_seconds())
        with self._lock:
            if self._stopped:
                return
            self._busy += 1
            timer = threading.Timer(delay, self._resend, args=(item_id,))
            timer.daemon = True
            self._timers.append(timer)
        timer.start()

    def _resend(self, item_id: int) -> None:
        self.send_items([item_id])
        with self._lock:
            self._busy -= 1
