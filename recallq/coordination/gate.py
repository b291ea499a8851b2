"""No judge call starts for a cancelled run.

A call registers under its run in Redis in the same atomic step that checks the run's cancel
flag (gate_enter.lua). Cancelling sets the flag, then waits for the registered calls to finish,
so once a cancel returns no call for that run is in flight and none can start.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from redis import Redis

from recallq.coordination import keys, scripts
from recallq.judge.base import JudgeError


class RunCancelled(JudgeError):
    pass


class CallGate(Protocol):
    def call(self, run_id: str) -> AbstractContextManager[None]:
        """Hold a place for one judge call of `run_id`; raises RunCancelled if it was."""
        ...

    def close(self, run_id: str) -> None:
        """From now on no call for this run gets through."""
        ...

    def wait_idle(self, run_id: str, wait: float) -> int:
        """Wait up to `wait` s for the run's calls in flight; returns how many are still open."""
        ...


class RedisCallGate:
    def __init__(self, redis: Redis, call_timeout: float) -> None:
        self._redis = redis
        self._enter = scripts.register(redis, "gate_enter")
        self._call_timeout = call_timeout

    @contextmanager
    def call(self, run_id: str) -> Iterator[None]:
        token = uuid.uuid4().hex
        expiry = time.time() + self._call_timeout
        in_flight = keys.run_calls_in_flight(run_id)
        if not self._enter(keys=[keys.run_cancelled(run_id), in_flight], args=[token, expiry]):
            raise RunCancelled(f"run {run_id} was cancelled")
        try:
            yield
        finally:
            self._redis.zrem(in_flight, token)

    def close(self, run_id: str) -> None:
        """From now on no call for this run gets through."""
        self._redis.set(keys.run_cancelled(run_id), "1", ex=30 * 86400)

    def wait_idle(self, run_id: str, wait: float) -> int:
        """Wait up to `wait` s for the run's calls in flight; returns how many are still open."""
        deadline = time.monotonic() + wait
        while True:
            # entries past their expiry belong to calls whose worker died mid-call
            open_calls = int(
                self._redis.zcount(keys.run_calls_in_flight(run_id), time.time(), "+inf")
            )
            if open_calls == 0 or time.monotonic() >= deadline:
                return open_calls
            time.sleep(0.05)


class OpenGate:
    """Local mode: one process; a run is stopped by stopping its runner."""

    @contextmanager
    def call(self, run_id: str) -> Iterator[None]:
        yield

    def close(self, run_id: str) -> None:
        pass

    def wait_idle(self, run_id: str, wait: float) -> int:
        return 0
