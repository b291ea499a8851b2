"""The shared rate limiter and the cancel gate, on a real Redis."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from recallq.coordination.call_gate import RedisCallGate, RunCancelled
from recallq.coordination.ratelimit import RedisRateLimiter
from recallq.core.errors import RateLimited
from tests.services import redis_database

pytestmark = pytest.mark.alone  # spacing asserted to 10 ms


@pytest.fixture()
def client() -> redis.Redis:
    return redis.Redis.from_url(redis_database(12))


def _stamps(limiter: RedisRateLimiter, threads: int, calls: int, tokens: int = 10) -> list[float]:
    stamps: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        for _ in range(calls):
            limiter.acquire("m", tokens)
            with lock:
                stamps.append(time.monotonic())

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sorted(stamps)


def test_requests_are_spaced_evenly_across_callers(client) -> None:
    limiter = RedisRateLimiter(client, rpm=600, tpm=None, utilisation=1.0)
    stamps = _stamps(limiter, threads=6, calls=5)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert min(gaps) >= 0.09  # 600/min: one every 100 ms, no burst
    # at least the spacing, and not a long wait over it (the bound is wide: a loaded machine
    # runs threads late, never early)
    assert 2.85 <= stamps[-1] - stamps[0] < 4.5


def test_tokens_per_minute_and_correction_after_the_call(client) -> None:
    limiter = RedisRateLimiter(client, rpm=None, tpm=6000, utilisation=1.0)  # 100 tokens/s
    limiter.acquire("m", 50)
    start = time.monotonic()
    limiter.acquire("m", 50)  # waits for the first call's 50 tokens: 0.5 s
    assert 0.45 <= time.monotonic() - start < 1.5
    limiter.settle("m", estimated=50, actual=10)  # the call used fewer: 0.4 s handed back
    start = time.monotonic()
    limiter.acquire("m", 10)  # 0.1 s with the 0.4 s handed back, 0.5 s without
    assert time.monotonic() - start < 0.4


def test_a_long_wait_gives_the_slot_back(client) -> None:
    limiter = RedisRateLimiter(client, rpm=60, tpm=None, max_wait=0.5, utilisation=1.0)
    limiter.acquire("m", 1)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire("m", 1)
    assert refused.value.delay == pytest.approx(1.0, abs=0.1)


def test_a_provider_429_halts_every_caller_then_rate_recovers(client) -> None:
    first = RedisRateLimiter(client, rpm=6000, tpm=None, utilisation=1.0)
    second = RedisRateLimiter(client, rpm=6000, tpm=None, utilisation=1.0)  # another worker
    first.penalise("m", retry_after=0.5)
    start = time.monotonic()
    second.acquire("m", 1)
    assert 0.45 <= time.monotonic() - start < 1.5
    # the rate is halved (20 ms between calls instead of 10) and recovers over 30 s
    stamps = _stamps(second, threads=1, calls=11)
    assert (stamps[-1] - stamps[0]) / 10 >= 0.017


def test_the_gate_refuses_calls_of_a_cancelled_run_and_waits_for_open_ones(client) -> None:
    gate = RedisCallGate(client, call_timeout=30)
    release = threading.Event()
    inside = threading.Event()

    def long_call() -> None:
        with gate.call("run-1"):
            inside.set()
            release.wait(5)

    caller = threading.Thread(target=long_call)
    caller.start()
    inside.wait(5)
    gate.close("run-1")
    with pytest.raises(RunCancelled), gate.call("run-1"):
        pass
    assert gate.wait_idle("run-1", wait=0.2) == 1  # the open call is still running
    release.set()
    caller.join()
    assert gate.wait_idle("run-1", wait=2) == 0
    with gate.call("run-2"):  # other runs are unaffected
        pass
