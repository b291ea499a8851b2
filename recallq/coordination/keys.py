"""Every Redis key recallq uses, named once. All start with `recallq:`."""

from __future__ import annotations

PREFIX = "recallq:"

#: The broker's epoch (a Redis run_id), also kept in Postgres: while Redis keeps its data,
#: the two agree (recallq.execution.broker_epoch.BrokerEpochs).
BROKER_EPOCH = PREFIX + "broker-epoch"
#: Held by the one worker sweeping for lost work.
REAPER_LOCK = PREFIX + "reaper-lock"
#: The turn of the worker polling the provider batch lane this interval (its Postgres
#: advisory lock, not this key, keeps polls from overlapping: see recallq.batch.store).
BATCH_LANE_POLL = PREFIX + "batch-lane-poll"


def held_items(worker_id: str) -> str:
    """Set: the items of the task messages a worker received and has not finished. It
    outlives the worker, so the reaper can requeue what a dead worker held."""
    return f"{PREFIX}held:{worker_id}"


def heartbeat(worker_id: str) -> str:
    """Present while the worker beats (expires after the heartbeat TTL)."""
    return f"{PREFIX}worker:{worker_id}"


def run_cancelled(run_id: str) -> str:
    """Set when a run is cancelled: the call gate refuses its calls."""
    return f"{PREFIX}cancelled:{run_id}"


def run_spend(run_id: str) -> str:
    """Hash: what a run with a budget has spent (usd, tokens), for the call gate."""
    return f"{PREFIX}spend:{run_id}"


def submissions(key_id: str) -> str:
    """The GCRA state of one API key's submissions (its next allowed time)."""
    return f"{PREFIX}submissions:{key_id}"


#: Held by the one worker applying the retention setting.
RETENTION_LOCK = PREFIX + "retention-lock"


def run_calls_in_flight(run_id: str) -> str:
    """Sorted set of the run's judge calls in flight, scored by when each expires."""
    return f"{PREFIX}inflight:{run_id}"


def rate_limit(model: str) -> str:
    """Hash: the model's GCRA state (next free request and token times, penalty factor)."""
    return f"{PREFIX}ratelimit:{model}"


def breaker(model: str) -> str:
    """Hash: the model's circuit breaker (its window of outcomes, or open/half-open state)."""
    return f"{PREFIX}breaker:{model}"


#: Sorted set of breaker keys (`breaker(model)`) scored by when a worker should look at
#: them: the model's next probe is due, or its breaker closed (breaker.lua adds them).
BREAKER_WAKES = PREFIX + "breaker-wakes"
#: The turn of the worker sweeping the due breaker wakes this interval.
BREAKER_WAKES_LOCK = PREFIX + "breaker-wakes-lock"


def model_of_breaker(key: str) -> str:
    """The model of a `breaker(model)` key."""
    return key.removeprefix(f"{PREFIX}breaker:")


#: Sorted set of worker ids scored by their last heartbeat (unix seconds): any worker alive?
WORKERS = PREFIX + "workers"
