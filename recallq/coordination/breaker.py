"""A per-model circuit breaker that every worker process and host shares.

During a provider incident (minutes of 503s, a 429 storm, timeouts) retrying each item on its
own spends every attempt of every item in flight and then fails them all. The breaker notices
the incident once, for everyone: when a model's calls fail for transient reasons at a high
rate, no worker calls that model. After a cool-down exactly one caller, across all processes,
is let through as a probe (half-open). The probe's success closes the breaker; its failure
re-opens it with the cool-down doubled (capped), or with the provider's Retry-After.

Callers are never made to wait: `before_call` answers at once, and while the breaker is open it
says until when not to call, so the caller can put the item back instead of holding a thread.

How a caller uses it, right before the provider call (after the rate limiter and the cancel
gate, so that a probe is not held by a call that never goes out)::

    decision = breaker.before_call(model)
    if isinstance(decision, Open):
        ...  # put the item back until decision.until
    probe = decision if isinstance(decision, Probe) else None
    try:
        reply = call_the_provider()
    except TransientError as exc:  # 429, 5xx, timeouts, connection errors
        breaker.record_failure(model, "provider unavailable (503)", exc.retry_after, probe)
        raise
    except PermanentError:
        # The provider answered (a 400 is an answer): it is up. A probe that does not report
        # leaves the model shut until probe_timeout, when the next probe may go.
        breaker.record_success(model, probe)
        raise
    breaker.record_success(model, probe)

How soon a run resumes after its provider is back (issue 28): the cool-down is capped at
`max_cool_down` (15 s by default), and in distributed mode the breaker notes in a sorted set
(`keys.BREAKER_WAKES`) when workers should look at a model: when its next probe is due, and at
once when it closes. A worker sweeping the due wakes (recallq.execution.breaker_wakes) sends
one waiting item to be the probe, or, once closed, every waiting item: probes go on schedule
instead of when the reaper happens to requeue an item, and a closed breaker's items do not
wait for their leases to run out.

The sliding window is kept in `_BUCKETS` buckets of `window_s / _BUCKETS` seconds each, so it
slides in steps of a tenth of the window: memory per model is constant however busy it is.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from recallq.coordination import keys, scripts
from recallq.observability import metrics

if TYPE_CHECKING:
    from redis import Redis

# The window is counted in this many buckets (see the module docstring).
_BUCKETS = 10
# How long a worker process takes a model's breaker for closed once Redis said so, and holds the
# successes it records before counting them there together: two of a judge call's four Redis
# round trips, on almost every call (issue 29). A breaker opened elsewhere stops this process's
# calls within this long; a failure is counted at once (with the successes held before it).
LOCAL_VIEW_S = 0.25
# A provider's Retry-After is honoured beyond max_cool_down (it knows best), but not beyond
# this: a bogus header must not silence a model for a day.
MAX_RETRY_AFTER = 3600.0


@dataclass(frozen=True)
class Closed:
    """Go ahead and call."""


@dataclass(frozen=True)
class Probe:
    """Call: you are the one probe. Pass this to record_success / record_failure."""

    token: str


@dataclass(frozen=True)
class Open:
    """Do not call this model before `until` (unix seconds)."""

    until: float
    reason: str
    since: float


@dataclass(frozen=True)
class BreakerState:
    """A model's breaker for display. `next_probe_at` is, when half-open, the probe's deadline;
    `failures` counts those in the window when it opened plus one per failed probe."""

    status: Literal["open", "half_open"]
    reason: str
    since: float
    next_probe_at: float
    cool_down: float
    failures: int


class CircuitBreaker(Protocol):
    def before_call(self, model: str) -> Closed | Probe | Open: ...

    def record_success(self, model: str, probe: Probe | None = None) -> None: ...

    def record_failure(
        self,
        model: str,
        reason: str,
        retry_after: float | None = None,
        probe: Probe | None = None,
    ) -> None:
        """Transient failures only: a provider that answers with an error is up."""
        ...

    def release(self, model: str, probe: Probe) -> None:
        """Give back a probe whose call was never sent (its run was cancelled, the rate limit
        had no room): the next caller may probe at once."""
        ...

    def state(self, model: str) -> BreakerState | None:
        """None when closed."""
        ...


@dataclass(frozen=True)
class BreakerSettings:
    """When a model's breaker opens and how long it waits: the same for both breakers (the
    RECALLQ_BREAKER_* settings; Runtime.breaker builds them)."""

    window_s: float = 30.0  # seconds of outcomes it looks at
    min_calls: int = 10  # outcomes in the window before the failure ratio counts
    failure_ratio: float = 0.5  # opens at this share of transient failures...
    consecutive_failures: int = 5  # ...or after this many in a row
    base_cool_down: float = 5.0  # first wait before a probe; doubles per failed probe
    max_cool_down: float = 15.0
    probe_timeout: float = 60.0  # a probe is dead only once its call could no longer run

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.probe_timeout <= 0:
            raise ValueError("window_s and probe_timeout must be positive")
        if self.min_calls < 1 or self.consecutive_failures < 1:
            raise ValueError("min_calls and consecutive_failures must be at least 1")
        if not 0 < self.failure_ratio <= 1:
            raise ValueError("failure_ratio must be in (0, 1]")
        if not 0 < self.base_cool_down <= self.max_cool_down:
            raise ValueError("need 0 < base_cool_down <= max_cool_down")

    @property
    def linger(self) -> float:
        """How long a model's state outlives the last moment it matters (its last outcome, or
        its next probe time when open): long enough that a model that goes quiet between
        failed probes keeps its doubled cool-down, short enough that idle models leave
        nothing behind."""
        return self.window_s + self.max_cool_down


def _asked_cool_down(retry_after: float | None) -> float | None:
    """The provider's Retry-After as a cool-down, or None when it gave none (or nonsense)."""
    if retry_after is None or math.isnan(retry_after):
        return None
    return min(max(retry_after, 0.0), MAX_RETRY_AFTER)


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""


class RedisCircuitBreaker:
    """The breaker for distributed mode: state in a Redis hash per model, `key(model)`,
    changed only by breaker.lua. `clock` is passed into the script, so every host's clock
    must agree to well within `window_s` (as NTP gives). `local_view_s`: see LOCAL_VIEW_S
    (0: every call asks Redis, every outcome is counted at once)."""

    def __init__(
        self,
        redis: Redis,
        settings: BreakerSettings = BreakerSettings(),
        *,
        clock: Callable[[], float] = time.time,
        local_view_s: float = LOCAL_VIEW_S,
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._script = scripts.register(redis, "breaker")
        self._local_view_s = local_view_s
        self._bucket_s = settings.window_s / _BUCKETS
        self._window_s = settings.window_s
        self._lock = threading.Lock()
        # model → when (monotonic) Redis last said its breaker was closed
        self._closed_seen: dict[str, float] = {}
        # model → when (monotonic) a call of this process last failed: a "closed" asked for
        # before then is no view to keep
        self._failed_at: dict[str, float] = {}
        # model → successes not counted in Redis yet: (count, the first at (monotonic, clock),
        # the last at (clock))
        self._held: dict[str, tuple[int, float, float, float]] = {}
        self._settings_args = [
            settings.window_s,
            _BUCKETS,
            settings.min_calls,
            settings.failure_ratio,
            settings.consecutive_failures,
            settings.base_cool_down,
            settings.max_cool_down,
            settings.probe_timeout,
            settings.linger,
        ]

    def _run(self, model: str, command: str, *args: str) -> Any:
        return self._script(
            keys=[keys.breaker(model), keys.BREAKER_WAKES],
            args=[command, repr(self._clock()), *self._settings_args, *args],
        )

    def now(self) -> float:
        """The breaker's clock (unix seconds)."""
        return self._clock()

    def wakes_due(self) -> bool:
        """Whether a model's breaker has something due (a probe, or it closed): one read."""
        now = self._clock()
        return bool(self._redis.zrangebyscore(keys.BREAKER_WAKES, "-inf", now, start=0, num=1))

    def take_due_wakes(self) -> list[str]:
        """The models whose breakers have something due now, taken off the wakes at once (a
        sweeper that dies with them leaves the items to their leases and the reaper)."""
        now = self._clock()
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrangebyscore(keys.BREAKER_WAKES, "-inf", now)
            pipe.zremrangebyscore(keys.BREAKER_WAKES, "-inf", now)
            due, _ = pipe.execute()
        return sorted({keys.model_of_breaker(_text(key)) for key in due})

    def before_call(self, model: str) -> Closed | Probe | Open:
        asked_at = time.monotonic()
        with self._lock:
            seen = self._closed_seen.get(model)
        if seen is not None and asked_at - seen < self._local_view_s:
            return Closed()
        reply: list[bytes | str] = self._run(model, "before", uuid.uuid4().hex)
        kind = _text(reply[0])
        with self._lock:
            if kind == "closed":
                if asked_at > self._failed_at.get(model, 0.0):
                    self._closed_seen[model] = asked_at
            else:  # an incident: what was held from before it does not belong to what follows
                self._held.pop(model, None)
        if kind == "closed":
            return Closed()
        if kind == "probe":
            return Probe(_text(reply[1]))
        return Open(until=float(reply[1]), reason=_text(reply[2]), since=float(reply[3]))

    def record_success(self, model: str, probe: Probe | None = None) -> None:
        if probe is not None:  # the probe's answer closes the breaker: at once
            self._run(model, "record", "ok", "", "", probe.token, "0", "")
            return
        now, clock = time.monotonic(), self._clock()
        with self._lock:
            count, first, first_clock, _ = self._held.get(model, (0, now, clock, clock))
            count += 1
            due = now - first >= self._local_view_s or clock - first_clock >= self._bucket_s
            if due:
                self._held.pop(model, None)
            else:
                self._held[model] = (count, first, first_clock, clock)
        if due:
            self._run(model, "record", "ok", "", "", "", str(count - 1), "")

    def _take_held(self, model: str) -> tuple[str, str]:
        """The successes held for the model, taken to be counted now (none that the window has
        left behind): their count and when the last of them was seen, as the script's args."""
        with self._lock:
            count, _, first_clock, last_clock = self._held.pop(model, (0, 0.0, 0.0, 0.0))
        if count == 0 or self._clock() - first_clock >= self._window_s:
            return "0", ""
        return str(count), repr(last_clock)

    def record_failure(
        self,
        model: str,
        reason: str,
        retry_after: float | None = None,
        probe: Probe | None = None,
    ) -> None:
        asked = _asked_cool_down(retry_after)
        with self._lock:  # the next call asks Redis: this failure may have opened it
            self._closed_seen.pop(model, None)
            self._failed_at[model] = time.monotonic()
        what = self._run(
            model,
            "record",
            "fail",
            reason,
            "" if asked is None else repr(asked),
            probe.token if probe else "",
            *self._take_held(model),
        )
        metrics.breaker_recorded(model, _text(what))

    def release(self, model: str, probe: Probe) -> None:
        self._run(model, "release", probe.token)

    def state(self, model: str) -> BreakerState | None:
        fields = ("status", "reason", "since", "next_probe_at", "cool_down", "failures")
        status, reason, since, next_probe_at, cool_down, failures = self._redis.hmget(
            keys.breaker(model), fields
        )
        if status is None:
            return None
        return BreakerState(
            status="half_open" if _text(status) == "half_open" else "open",
            reason=_text(reason),
            since=float(since or 0),
            next_probe_at=float(next_probe_at or 0),
            cool_down=float(cool_down or 0),
            failures=int(failures or 0),
        )


@dataclass
class _ModelState:
    """One model in LocalCircuitBreaker: the same fields as breaker.lua's hash."""

    expires_at: float
    epochs: list[int] = field(default_factory=lambda: [-1] * _BUCKETS)
    calls: list[int] = field(default_factory=lambda: [0] * _BUCKETS)
    failed: list[int] = field(default_factory=lambda: [0] * _BUCKETS)
    consecutive: int = 0
    reason: str = ""
    status: Literal["open", "half_open"] | None = None
    since: float = 0.0
    next_probe_at: float = 0.0
    cool_down: float = 0.0
    failures: int = 0
    probe: str | None = None


class LocalCircuitBreaker:
    """The breaker for local mode (one process): breaker.lua's semantics under a lock."""

    def __init__(
        self,
        settings: BreakerSettings = BreakerSettings(),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._models: dict[str, _ModelState] = {}

    def _live(self, model: str, now: float) -> _ModelState | None:
        """The model's state unless it has expired (as its Redis key would have)."""
        state = self._models.get(model)
        if state is not None and state.expires_at <= now:
            del self._models[model]
            return None
        return state

    def _keep_until(self, state: _ModelState, horizon: float) -> None:
        state.expires_at = horizon + self._settings.linger

    def before_call(self, model: str) -> Closed | Probe | Open:
        with self._lock:
            now = self._clock()
            state = self._live(model, now)
            if state is None or state.status is None:
                return Closed()
            if now < state.next_probe_at:
                until = state.next_probe_at  # while a probe is out, ask again soon (see .lua)
                if state.status == "half_open":
                    until = min(until, now + self._settings.base_cool_down)
                return Open(until=until, reason=state.reason, since=state.since)
            state.status = "half_open"
            state.probe = uuid.uuid4().hex
            state.next_probe_at = now + self._settings.probe_timeout
            self._keep_until(state, state.next_probe_at)
            return Probe(state.probe)

    def record_success(self, model: str, probe: Probe | None = None) -> None:
        self._record(model, failed=False, reason="", asked_cool_down=None, probe=probe)

    def record_failure(
        self,
        model: str,
        reason: str,
        retry_after: float | None = None,
        probe: Probe | None = None,
    ) -> None:
        asked = _asked_cool_down(retry_after)
        self._record(model, failed=True, reason=reason, asked_cool_down=asked, probe=probe)

    def _record(
        self,
        model: str,
        *,
        failed: bool,
        reason: str,
        asked_cool_down: float | None,
        probe: Probe | None,
    ) -> None:
        settings = self._settings
        with self._lock:
            now = self._clock()
            state = self._live(model, now)
            if state is None:
                state = self._models[model] = _ModelState(expires_at=now)
            if state.status is not None:
                # only the current probe's report counts (see breaker.lua)
                if probe is None or probe.token != state.probe:
                    return
                if not failed:
                    del self._models[model]
                    return
                state.status = "open"
                state.probe = None
                state.cool_down = (
                    asked_cool_down
                    if asked_cool_down is not None
                    else min(state.cool_down * 2, settings.max_cool_down)
                )
                state.next_probe_at = now + state.cool_down
                state.reason = reason
                state.failures += 1
                self._keep_until(state, state.next_probe_at)
                return

            epoch = math.floor(now / (settings.window_s / _BUCKETS))
            slot = epoch % _BUCKETS
            if state.epochs[slot] != epoch:
                state.epochs[slot], state.calls[slot], state.failed[slot] = epoch, 0, 0
            state.calls[slot] += 1
            self._keep_until(state, now)
            if not failed:
                state.consecutive = 0
                return
            state.failed[slot] += 1
            state.reason = reason
            state.consecutive += 1
            live = [i for i in range(_BUCKETS) if state.epochs[i] > epoch - _BUCKETS]
            calls = sum(state.calls[i] for i in live)
            failures = sum(state.failed[i] for i in live)
            if state.consecutive >= settings.consecutive_failures or (
                calls >= settings.min_calls and failures >= settings.failure_ratio * calls
            ):
                cool_down = settings.base_cool_down
                if asked_cool_down is not None:
                    cool_down = asked_cool_down
                opened = _ModelState(
                    expires_at=0.0,
                    status="open",
                    since=now,
                    next_probe_at=now + cool_down,
                    cool_down=cool_down,
                    failures=max(failures, state.consecutive),
                    reason=reason,
                )
                self._keep_until(opened, opened.next_probe_at)
                self._models[model] = opened

    def release(self, model: str, probe: Probe) -> None:
        with self._lock:
            now = self._clock()
            state = self._live(model, now)
            if state is not None and state.status == "half_open" and state.probe == probe.token:
                state.status, state.probe, state.next_probe_at = "open", None, now

    def state(self, model: str) -> BreakerState | None:
        with self._lock:
            state = self._live(model, self._clock())
            if state is None or state.status is None:
                return None
            return BreakerState(
                status=state.status,
                reason=state.reason,
                since=state.since,
                next_probe_at=state.next_probe_at,
                cool_down=state.cool_down,
                failures=state.failures,
            )
