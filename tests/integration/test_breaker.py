"""The per-model circuit breaker: the Redis one on a redis-server of its own, and the in-process
one for local mode held to the same behaviour."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from recallq.coordination import keys
from recallq.coordination.breaker import (
    MAX_RETRY_AFTER,
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
    Closed,
    LocalCircuitBreaker,
    Open,
    Probe,
    RedisCircuitBreaker,
)
from tests.services import redis_database

UNAVAILABLE = "provider unavailable (503)"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[redis.Redis]:
    """A database of the test session's own redis-server."""
    client = redis.Redis.from_url(redis_database(15))
    yield client
    client.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# breakers(n, **settings) -> n handles on one shared breaker, as n workers would hold
Breakers = Callable[..., list[CircuitBreaker]]


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["redis", "local"])
def breakers(request: pytest.FixtureRequest, clock: FakeClock) -> Breakers:
    def make(count: int = 1, **settings: Any) -> list[CircuitBreaker]:
        if request.param == "local":
            # local mode is one process: its "workers" are threads sharing one breaker
            return [LocalCircuitBreaker(BreakerSettings(**settings), clock=clock)] * count
        client = request.getfixturevalue("redis_server")
        # every call asks Redis and every outcome is counted at once: the script's behaviour
        # (the local view a worker keeps between its calls has a test of its own below)
        return [
            RedisCircuitBreaker(client, BreakerSettings(**settings), clock=clock, local_view_s=0)
            for _ in range(count)
        ]

    return make


@pytest.fixture()
def model() -> str:
    """A model name of the test's own, so tests share the server without seeing each other."""
    return f"provider/model-{uuid.uuid4().hex[:8]}"


def _closed() -> BreakerState:
    raise AssertionError("the breaker is closed")


def _at(moment: float) -> Any:
    """Equal to `moment` to the millisecond (pytest.approx's default tolerance, relative to a
    unix time, would be half an hour)."""
    return pytest.approx(moment, rel=0, abs=1e-3)


def _open(breaker: CircuitBreaker, model: str) -> Open:
    decision = breaker.before_call(model)
    assert isinstance(decision, Open), decision
    return decision


def _probe(breaker: CircuitBreaker, model: str) -> Probe:
    decision = breaker.before_call(model)
    assert isinstance(decision, Probe), decision
    return decision


def _opened_by_storm(breaker: CircuitBreaker, model: str, **failure: Any) -> None:
    for _ in range(5):
        assert breaker.before_call(model) == Closed()
        breaker.record_failure(model, UNAVAILABLE, **failure)


def test_a_503_storm_opens_it_for_the_base_cool_down(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2)
    for _ in range(4):
        breaker.record_failure(model, "timeouts")
    other_worker.record_success(model)  # a success ends the run of failures
    for _ in range(4):
        breaker.record_failure(model, "timeouts")
    assert other_worker.before_call(model) == Closed()  # 4 in a row, 8 of 9: not yet
    opened_at = clock.now
    breaker.record_failure(model, UNAVAILABLE)
    assert other_worker.before_call(model) == Open(opened_at + 5.0, UNAVAILABLE, opened_at)
    clock.advance(4.9)
    assert _open(other_worker, model).until == _at(opened_at + 5.0)
    assert breaker.state(model) == BreakerState(
        status="open",
        reason=UNAVAILABLE,
        since=opened_at,
        next_probe_at=opened_at + 5.0,
        cool_down=5.0,
        failures=9,
    )


def test_a_high_failure_ratio_in_the_window_opens_it(breakers: Breakers, model: str) -> None:
    (breaker,) = breakers(1)
    for _ in range(4):  # alternating: never two failures in a row, but half of the calls fail
        breaker.record_success(model)
        breaker.record_failure(model, "rate limited (429)")
    breaker.record_success(model)
    assert breaker.before_call(model) == Closed()  # 4 of 9: below min_calls and ratio
    breaker.record_failure(model, "rate limited (429)")  # 5 of 10
    assert _open(breaker, model).reason == "rate limited (429)"


def test_it_stays_closed_under_one_failure_in_twenty(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2)
    for call in range(20):
        assert breaker.before_call(model) == Closed()
        if call == 7:
            other_worker.record_failure(model, "rate limited (429)", retry_after=2.0)
        else:
            other_worker.record_success(model)
        clock.advance(0.1)
    assert breaker.before_call(model) == Closed()
    assert breaker.state(model) is None


def test_outcomes_older_than_the_window_are_forgotten(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    (breaker,) = breakers(1, window_s=10.0)

    def alternate(pairs: int) -> None:  # never two failures in a row
        for _ in range(pairs):
            breaker.record_success(model)
            breaker.record_failure(model, "timeouts")

    alternate(4)
    clock.advance(11.5)  # past the window, and into a bucket other than the first one's
    alternate(2)
    # 6 failures in 12 calls overall, but only 2 in 4 within the last 10 s
    assert breaker.before_call(model) == Closed()
    clock.advance(0.5)
    alternate(2)
    assert breaker.before_call(model) == Closed()  # 4 in 8
    alternate(1)
    assert isinstance(breaker.before_call(model), Open)  # 5 in 10 within the window


def test_exactly_one_probe_among_concurrent_workers(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    workers = breakers(2)
    _opened_by_storm(workers[0], model)
    clock.advance(5.0)
    start = threading.Barrier(20)
    decisions: list[Closed | Probe | Open] = []
    lock = threading.Lock()

    def call(index: int) -> None:
        start.wait()
        decision = workers[index % 2].before_call(model)
        with lock:
            decisions.append(decision)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    probes = [decision for decision in decisions if isinstance(decision, Probe)]
    assert len(probes) == 1
    # the others ask again after the base cool-down (the probe may answer any moment), not
    # at once (no spinning) and not at the probe's 60 s deadline
    assert {decision for decision in decisions if isinstance(decision, Open)} == {
        Open(clock.now + 5.0, UNAVAILABLE, clock.now - 5.0)
    }
    state = workers[1].state(model)
    assert state is not None
    assert (state.status, state.next_probe_at) == ("half_open", _at(clock.now + 60.0))


def test_probe_success_closes_and_starts_afresh(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2)
    _opened_by_storm(breaker, model)
    clock.advance(5.0)
    probe = _probe(breaker, model)
    breaker.record_success(model, probe)
    assert other_worker.before_call(model) == Closed()
    assert other_worker.state(model) is None
    # the window and the run of failures were reset: four more failures do not open it
    for _ in range(4):
        other_worker.record_failure(model, "timeouts")
    assert breaker.before_call(model) == Closed()
    # and the cool-down starts again from the base
    opened_at = clock.now
    other_worker.record_failure(model, "timeouts")
    assert _open(breaker, model).until == _at(opened_at + 5.0)


def test_reports_from_calls_begun_before_it_opened_do_not_close_it(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2)
    _opened_by_storm(breaker, model)
    for _ in range(20):
        other_worker.record_success(model)  # calls that were already in flight
    other_worker.record_failure(model, "connection errors", retry_after=900.0)
    assert _open(breaker, model) == Open(clock.now + 5.0, UNAVAILABLE, clock.now)
    clock.advance(5.0)
    probe = _probe(breaker, model)
    other_worker.record_success(model)  # not the probe: still half-open
    assert _open(other_worker, model).until == _at(clock.now + 5.0)  # asks again soon
    assert (other_worker.state(model) or _closed()).status == "half_open"
    breaker.record_success(model, probe)
    assert other_worker.before_call(model) == Closed()


def test_probe_failure_doubles_the_cool_down_up_to_the_cap(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2, base_cool_down=5.0, max_cool_down=30.0)
    _opened_by_storm(breaker, model)
    opened_at = clock.now
    cool_down = 5.0
    for expected, reason in [(10.0, "timeouts"), (20.0, UNAVAILABLE), (30.0, "x"), (30.0, "y")]:
        clock.advance(cool_down)
        probe = _probe(other_worker, model)
        other_worker.record_failure(model, reason, probe=probe)
        assert breaker.before_call(model) == Open(clock.now + expected, reason, opened_at)
        cool_down = expected
    state = breaker.state(model)
    assert state is not None
    assert (state.status, state.cool_down, state.failures) == ("open", 30.0, 5 + 4)


def test_retry_after_sets_the_cool_down(breakers: Breakers, clock: FakeClock, model: str) -> None:
    (breaker,) = breakers(1, max_cool_down=300.0)
    _opened_by_storm(breaker, model, retry_after=42.0)
    assert _open(breaker, model).until == _at(clock.now + 42.0)
    clock.advance(42.0)
    # beyond max_cool_down: the provider's word is honoured ...
    breaker.record_failure(model, "rate limited (429)", 1000.0, _probe(breaker, model))
    assert _open(breaker, model).until == _at(clock.now + 1000.0)
    clock.advance(1000.0)
    # ... up to an hour
    breaker.record_failure(model, "rate limited (429)", 86400.0, _probe(breaker, model))
    assert _open(breaker, model).until == _at(clock.now + MAX_RETRY_AFTER)
    state = breaker.state(model)
    assert state is not None
    assert state.cool_down == MAX_RETRY_AFTER
    clock.advance(MAX_RETRY_AFTER)
    # without Retry-After the doubling resumes from there, capped at max_cool_down
    breaker.record_failure(model, "timeouts", probe=_probe(breaker, model))
    assert _open(breaker, model).until == _at(clock.now + 300.0)


def test_a_dead_probe_is_replaced_after_probe_timeout(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2, probe_timeout=20.0)
    _opened_by_storm(breaker, model)
    clock.advance(5.0)
    dead = _probe(breaker, model)  # its worker is killed mid-call and never reports
    clock.advance(19.9)
    assert _open(other_worker, model).until == _at(clock.now + 0.1)
    clock.advance(0.1)
    replacement = _probe(other_worker, model)
    assert replacement != dead
    assert _open(breaker, model).until == _at(clock.now + 5.0)  # a probe is out: ask again soon
    state = breaker.state(model)
    assert state is not None and state.next_probe_at == _at(clock.now + 20.0)
    breaker.record_success(model, dead)  # a late report of the first probe changes nothing
    assert isinstance(breaker.before_call(model), Open)
    other_worker.record_success(model, replacement)
    assert breaker.before_call(model) == Closed()


def test_a_probe_given_back_unsent_lets_the_next_caller_probe_at_once(
    breakers: Breakers, clock: FakeClock, model: str
) -> None:
    breaker, other_worker = breakers(2, probe_timeout=60.0)
    _opened_by_storm(breaker, model)
    clock.advance(5.0)
    unsent = _probe(breaker, model)  # its run was cancelled before the call went out
    assert isinstance(other_worker.before_call(model), Open)
    breaker.release(model, unsent)
    assert _probe(other_worker, model) != unsent  # no 60 s wait for a probe never sent
    other_worker.release(model, unsent)  # a stale give-back changes nothing
    assert isinstance(breaker.before_call(model), Open)


def test_models_are_independent(breakers: Breakers, model: str) -> None:
    (breaker,) = breakers(1)
    _opened_by_storm(breaker, model)
    assert breaker.before_call(model + "-other") == Closed()
    assert breaker.state(model + "-other") is None


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        BreakerSettings(base_cool_down=10.0, max_cool_down=5.0)
    with pytest.raises(ValueError):
        BreakerSettings(failure_ratio=0.0)
    with pytest.raises(ValueError):
        BreakerSettings(min_calls=0)


def _dirty(client: redis.Redis) -> int:
    """Writes the server has seen (it counts them though nothing is ever saved)."""
    return int(client.info("persistence")["rdb_changes_since_last_save"])


def test_asking_an_open_breaker_writes_nothing(
    redis_server: redis.Redis, clock: FakeClock, model: str
) -> None:
    breaker = RedisCircuitBreaker(redis_server, clock=clock, local_view_s=0)
    _opened_by_storm(breaker, model)
    writes = _dirty(redis_server)
    for _ in range(50):
        _open(breaker, model)
    assert _dirty(redis_server) == writes


def test_every_key_expires_when_idle(redis_server: redis.Redis, model: str) -> None:
    """Real time here: Redis expires keys by its own clock."""
    breaker = RedisCircuitBreaker(
        redis_server,
        BreakerSettings(window_s=0.2, base_cool_down=0.2, max_cool_down=0.4, probe_timeout=0.3),
        local_view_s=0,
    )
    key = keys.breaker(model)
    breaker.record_success(model)
    assert 0 < redis_server.pttl(key) <= 601  # window + max cool-down
    for _ in range(5):
        breaker.record_failure(model, UNAVAILABLE)
    assert 0 < redis_server.pttl(key) <= 801  # cool-down, then the same
    time.sleep(0.25)
    _probe(breaker, model)  # and its holder dies
    assert 0 < redis_server.pttl(key) <= 901  # probe deadline, then the same
    time.sleep(1.0)
    assert redis_server.exists(key) == 0
    assert breaker.before_call(model) == Closed()
    assert redis_server.keys(f"recallq:breaker:{model}*") == []


def test_a_client_that_decodes_responses_works_too(
    redis_server: redis.Redis, clock: FakeClock, model: str
) -> None:
    port = redis_server.connection_pool.connection_kwargs["port"]
    client = redis.Redis(port=port, decode_responses=True)
    breaker = RedisCircuitBreaker(client, clock=clock, local_view_s=0)
    _opened_by_storm(breaker, model)
    assert _open(breaker, model).reason == UNAVAILABLE
    clock.advance(5.0)
    breaker.record_success(model, _probe(breaker, model))
    assert breaker.before_call(model) == Closed()
    client.close()


def test_the_cool_down_is_capped_at_15_s_by_default() -> None:
    from recallq.settings import Settings

    assert BreakerSettings().max_cool_down == 15.0
    assert Settings().breaker_max_cool_down == 15.0  # RECALLQ_BREAKER_MAX_COOL_DOWN


def test_wakes_say_when_a_probe_is_due_and_when_it_closed(
    redis_server: redis.Redis, clock: FakeClock, model: str
) -> None:
    """breaker.lua notes when workers should look at a model (recallq.execution.breaker_wakes
    sends an item then): each probe's time, a probe's deadline, and now when it closes."""
    breaker = RedisCircuitBreaker(
        redis_server, BreakerSettings(probe_timeout=60.0), clock=clock, local_view_s=0
    )

    def wake() -> float | None:
        return redis_server.zscore(keys.BREAKER_WAKES, keys.breaker(model))

    _opened_by_storm(breaker, model)
    assert wake() == _at(clock.now + 5.0)
    assert model not in breaker.take_due_wakes()
    for waited, cool_down in ((5.0, 10.0), (10.0, 15.0), (15.0, 15.0)):  # doubled, capped
        clock.advance(waited)
        assert breaker.wakes_due()
        assert model in breaker.take_due_wakes() and wake() is None
        probe = _probe(breaker, model)
        assert wake() == _at(clock.now + 60.0)  # its deadline: a dead probe is replaced then
        breaker.record_failure(model, UNAVAILABLE, probe=probe)
        assert wake() == _at(clock.now + cool_down)
    clock.advance(15.0)
    breaker.take_due_wakes()
    breaker.record_success(model, _probe(breaker, model))
    assert breaker.state(model) is None
    assert wake() == _at(clock.now)  # closed: its waiting items go at once
    assert model in breaker.take_due_wakes() and wake() is None


def _window(client: redis.Redis, model: str) -> tuple[int, int, int]:
    """(calls, failures, failures in a row) that Redis holds for a closed breaker."""
    fields: dict[bytes, bytes] = client.hgetall(keys.breaker(model))  # type: ignore[assignment]
    state = {k.decode(): v for k, v in fields.items()}
    calls = sum(int(v) for k, v in state.items() if k[0] == "n" and k[1:].isdigit())
    failures = sum(int(v) for k, v in state.items() if k[0] == "f" and k[1:].isdigit())
    return calls, failures, int(state.get("consec", 0))


class _CountedConnection(redis.Connection):
    """A connection that counts the commands it sends (round trips: nothing is pipelined)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)


def test_a_worker_keeps_a_local_view_between_its_calls(
    redis_server: redis.Redis, model: str
) -> None:
    """Issue 29: a worker takes a closed breaker for closed for `local_view_s` without asking
    Redis, and holds its successes until then, counting them before its next failure (they
    end a run of failures only if seen after its last failure); a breaker opened by another
    worker stops its calls once the view is old, or at once after one of its own calls
    failed."""
    view = 2.0
    kwargs = redis_server.connection_pool.connection_kwargs
    pool = redis.ConnectionPool(
        connection_class=_CountedConnection, port=kwargs["port"], db=kwargs["db"]
    )
    worker = RedisCircuitBreaker(redis.Redis(connection_pool=pool), local_view_s=view)
    other = RedisCircuitBreaker(redis_server, local_view_s=0)
    for _ in range(4):
        other.record_failure(model, UNAVAILABLE)
    assert _window(redis_server, model) == (4, 4, 4)
    assert worker.before_call(model) == Closed()  # asked Redis
    trips = _CountedConnection.sent
    assert trips > 0
    for _ in range(20):
        assert worker.before_call(model) == Closed()
        worker.record_success(model)
    assert _CountedConnection.sent == trips  # 20 calls, no round trip
    assert _window(redis_server, model) == (4, 4, 4)  # the successes are held
    # its failure counts them first: seen after the other's failures, they ended that run
    worker.record_failure(model, UNAVAILABLE)
    assert _window(redis_server, model) == (25, 5, 1)

    other.before_call(model)
    for _ in range(5):
        other.record_failure(model, UNAVAILABLE)  # opened by the other worker
    assert isinstance(other.before_call(model), Open)
    assert isinstance(worker.before_call(model), Open)  # its failure dropped its view

    # a success held from before other workers' failures does not end their run of failures
    late = f"{model}-late"
    assert worker.before_call(late) == Closed()
    worker.record_success(late)  # held
    for _ in range(4):
        other.record_failure(late, UNAVAILABLE)
    worker.record_failure(late, UNAVAILABLE)  # the fifth in a row: opens
    assert isinstance(other.before_call(late), Open)

    fresh = f"{model}-b"
    assert worker.before_call(fresh) == Closed()
    for _ in range(5):
        other.record_failure(fresh, UNAVAILABLE)
    assert worker.before_call(fresh) == Closed()  # the view, at most `view` seconds old
    time.sleep(view)
    assert isinstance(worker.before_call(fresh), Open)
    pool.disconnect()


def test_held_successes_are_counted_once_the_view_is_old(
    redis_server: redis.Redis, model: str
) -> None:
    worker = RedisCircuitBreaker(redis_server, local_view_s=0.3)
    for _ in range(3):
        worker.record_success(model)
    assert _window(redis_server, model) == (0, 0, 0)
    time.sleep(0.3)
    worker.record_success(model)  # the view is old: these four are counted together
    assert _window(redis_server, model) == (4, 0, 0)
