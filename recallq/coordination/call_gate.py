"""No judge call starts for a cancelled run, or for a run that has spent its budget.

A call registers under its run in Redis in the same atomic step that checks the run's cancel
flag (gate_enter.lua). Cancelling sets the flag, then waits for the registered calls to finish,
so once a cancel returns no call for that run is in flight and none can start.

Spend control: every answered call of a run with a budget (`budget_usd`, `budget_tokens`)
adds its cost and tokens to the run's spend in Redis (gate_charge.lua). The entry step refuses
a call once the spend has reached the budget, and sets the run's cancel flag to `budget` in
the same step, so every worker stops calling at once; the engine then cancels the run with
the reason "budget". Calls already in flight when the budget is reached still finish (and are
charged): a run overspends by at most one window of calls in flight. When Redis has lost a
run's spend, the next call seeds it again from what the database recorded (gate_seed.lua).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

from recallq.coordination import keys, scripts
from recallq.coordination.after_answer import after_answer
from recallq.core.errors import JudgeError

if TYPE_CHECKING:
    from redis import Redis

#: the cancel flag's value when a user cancelled, and when the budget was reached
CANCELLED_BY_USER = "1"
BUDGET_REACHED = "budget"

#: (usd, tokens) a run may spend; None for either means no limit of that kind
Budget = tuple[float | None, int | None]
BudgetOf = Callable[[str], Budget | None]
SpentOf = Callable[[str], tuple[float, int]]


class RunCancelled(JudgeError):
    """The run's calls are refused: `reason` is "user" or "budget"."""

    def __init__(self, run_id: str, reason: str = "user") -> None:
        what = "reached its budget" if reason == "budget" else "was cancelled"
        super().__init__(f"run {run_id} {what}")
        self.reason = reason


class CallGate(Protocol):
    def call(self, run_id: str) -> AbstractContextManager[None]:
        """Hold a place for one judge call of `run_id`; raises RunCancelled if it was
        cancelled or has reached its budget."""
        ...

    def charge(self, run_id: str, cost_usd: float, tokens: int) -> None:
        """Add what an answered call of `run_id` cost to the run's spend."""
        ...

    def close(self, run_id: str) -> None:
        """From now on no call for this run gets through."""
        ...

    def wait_idle(self, run_id: str, wait: float) -> int:
        """Wait up to `wait` s for the run's calls in flight; returns how many are still open."""
        ...

    def forget(self, run_id: str) -> None:
        """Drop the run's gate state (its run was deleted)."""
        ...

    def reopen(self, run_id: str, budget: Budget | None) -> None:
        """Calls for this resumed run get through again, under its (maybe raised) budget."""
        ...


class _Budgets:
    """Runs' budgets as this process read them, each read once (a resume that raises one
    also puts it in Redis, where gate_enter prefers it)."""

    KEPT = 4096

    def __init__(self, budget_of: BudgetOf | None) -> None:
        self._budget_of = budget_of
        self._known: OrderedDict[str, Budget | None] = OrderedDict()
        self._lock = threading.Lock()

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._known.pop(run_id, None)

    def of(self, run_id: str) -> Budget | None:
        if self._budget_of is None:
            return None
        with self._lock:
            if run_id in self._known:
                return self._known[run_id]
        budget = self._budget_of(run_id)
        if budget is not None and budget == (None, None):
            budget = None
        with self._lock:
            self._known[run_id] = budget
            while len(self._known) > self.KEPT:
                self._known.popitem(last=False)
        return budget


def _limit(value: float | int | None) -> str:
    return "" if value is None else repr(value)


class RedisCallGate:
    def __init__(
        self,
        redis: Redis,
        call_timeout: float,
        budget_of: BudgetOf | None = None,
        spent_of: SpentOf | None = None,
    ) -> None:
        """`budget_of(run_id)` gives a run's budget (None: none, or no such run);
        `spent_of(run_id)` what its items recorded, to seed a spend Redis has lost."""
        self._redis = redis
        self._enter = scripts.register(redis, "gate_enter")
        self._charge = scripts.register(redis, "gate_charge")
        self._seed = scripts.register(redis, "gate_seed")
        self._call_timeout = call_timeout
        self._budgets = _Budgets(budget_of)
        self._spent_of = spent_of

    @contextmanager
    def call(self, run_id: str) -> Iterator[None]:
        token = uuid.uuid4().hex
        expiry = time.time() + self._call_timeout
        in_flight = keys.run_calls_in_flight(run_id)
        budget = self._budgets.of(run_id) or (None, None)
        gate_keys = [keys.run_cancelled(run_id), in_flight, keys.run_spend(run_id)]
        args: list[str | float] = [token, expiry, _limit(budget[0]), _limit(budget[1])]
        answer = _text(self._enter(keys=gate_keys, args=args))
        if answer == "unseeded":
            usd, tokens = self._spent_of(run_id) if self._spent_of is not None else (0.0, 0)
            self._seed(keys=[keys.run_spend(run_id)], args=[repr(usd), tokens])
            answer = _text(self._enter(keys=gate_keys, args=args))
        if answer != "ok":
            raise RunCancelled(run_id, "budget" if answer == BUDGET_REACHED else "user")
        try:
            yield
        finally:  # the place expires anyway: a failure must not drop an answer
            after_answer("the call gate's release", lambda: self._redis.zrem(in_flight, token))

    def charge(self, run_id: str, cost_usd: float, tokens: int) -> None:
        if self._budgets.of(run_id) is not None and (cost_usd or tokens):
            self._charge(keys=[keys.run_spend(run_id)], args=[repr(float(cost_usd)), int(tokens)])

    def close(self, run_id: str) -> None:
        """From now on no call for this run gets through."""
        self._redis.set(keys.run_cancelled(run_id), CANCELLED_BY_USER, ex=30 * 86400)

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

    def forget(self, run_id: str) -> None:
        """Drop the run's gate state (its run was deleted)."""
        self._redis.delete(
            keys.run_cancelled(run_id), keys.run_calls_in_flight(run_id), keys.run_spend(run_id)
        )

    def reopen(self, run_id: str, budget: Budget | None) -> None:
        # Workers keep the budget they read first; the spend hash carries the raised one,
        # which gate_enter prefers.
        spend = keys.run_spend(run_id)
        if budget is not None and self._spent_of is not None:
            usd, tokens = self._spent_of(run_id)
            self._seed(keys=[spend], args=[repr(usd), tokens])
        if budget is not None:
            self._redis.hset(
                spend, mapping={"budget_usd": _limit(budget[0]), "budget_tokens": _limit(budget[1])}
            )
        self._budgets.forget(run_id)
        self._redis.delete(keys.run_cancelled(run_id))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class OpenGate:
    """Local mode: one process; a run is stopped by stopping its runner. Budgets hold here
    too, counted in this process."""

    def __init__(self, budget_of: BudgetOf | None = None, spent_of: SpentOf | None = None) -> None:
        self._budgets = _Budgets(budget_of)
        self._spent_of = spent_of
        self._spent: dict[str, tuple[float, int]] = {}
        self._closed: dict[str, str] = {}
        self._lock = threading.Lock()

    @contextmanager
    def call(self, run_id: str) -> Iterator[None]:
        budget = self._budgets.of(run_id)
        with self._lock:
            if run_id in self._closed:
                raise RunCancelled(run_id, self._closed[run_id])
        if budget is not None:
            with self._lock:
                known = self._spent.get(run_id)
            if known is None:
                known = self._spent_of(run_id) if self._spent_of is not None else (0.0, 0)
            with self._lock:
                usd, tokens = self._spent.setdefault(run_id, known)
                if (budget[0] is not None and usd >= budget[0]) or (
                    budget[1] is not None and tokens >= budget[1]
                ):
                    self._closed[run_id] = "budget"
                    raise RunCancelled(run_id, "budget")
        yield

    def charge(self, run_id: str, cost_usd: float, tokens: int) -> None:
        if self._budgets.of(run_id) is None:
            return
        with self._lock:
            usd, used = self._spent.get(run_id, (0.0, 0))
            self._spent[run_id] = (usd + cost_usd, used + tokens)

    def close(self, run_id: str) -> None:
        with self._lock:
            self._closed.setdefault(run_id, "user")

    def wait_idle(self, run_id: str, wait: float) -> int:
        return 0

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._spent.pop(run_id, None)
            self._closed.pop(run_id, None)

    def reopen(self, run_id: str, budget: Budget | None) -> None:
        self._budgets.forget(run_id)
        with self._lock:
            self._closed.pop(run_id, None)
