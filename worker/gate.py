"""No LLM call starts for a cancelled run.

A call registers under its run in Redis in the same atomic step that checks the run's cancel
flag. Cancelling sets the flag, then waits for the registered calls to finish, so once a cancel
returns no call for that run is in flight and none can start.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol

from redis import Redis

from worker.judge.base import JudgeError

current_run: ContextVar[str | None] = ContextVar("current_run", default=None)

# KEYS: cancel flag, in-flight zset; ARGV: token, expiry (unix seconds)
_ENTER = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
return 1
"""


class RunCancelled(JudgeError):
    pass


class CallGate(Protocol):
    def call(self) -> AbstractContextManager[None]: ...


def _flag(run_id: str) -> str:
    return f"recallq:cancelled:{run_id}"


def _inflight(run_id: str) -> str:
    return f"recallq:inflight:{run_id}"


class RedisCallGate:
    def __init__(self, redis: Redis, call_timeout: float) -> None:
        self._redis = redis
        self._enter = redis.register_script(_ENTER)
        self._call_timeout = call_timeout

    @contextmanager
    def call(self) -> Iterator[None]:
        run_id = current_run.get()
        if run_id is None:
            yield
            return
        token = uuid.uuid4().hex
        expiry = time.time() + self._call_timeout
        if not self._enter(keys=[_flag(run_id), _inflight(run_id)], args=[token, expiry]):
            raise RunCancelled(f"run {run_id} was cancelled")
        try:
            yield
        finally:
            self._redis.zrem(_inflight(run_id), token)

    def close(self, run_id: str) -> None:
        """From now on no call for this run gets through."""
        self._redis.set(_flag(run_id), "1", ex=30 * 86400)

    def wait_idle(self, run_id: str, wait: float) -> int:
        """Wait up to `wait` s for the run's calls in flight; returns how many are still open."""
        deadline = time.monotonic() + wait
        while True:
            # entries past their expiry belong to calls whose worker died mid-call
            open_calls = self._redis.zcount(_inflight(run_id), time.time(), "+inf")
            if open_calls == 0 or time.monotonic() >= deadline:
                return open_calls
            time.sleep(0.05)


class OpenGate:
    """Local mode: one process, no API to cancel from."""

    @contextmanager
    def call(self) -> Iterator[None]:
        yield
