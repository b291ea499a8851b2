"""Bookkeeping around a judge call: Redis failing never turns into lost usage.

After the provider answered (with an answer or an error), the call was billed: the answer (and
with it its usage) must reach the engine, whatever happens to the Redis bookkeeping that
follows it (the call gate's place, the breaker's record, the rate limiter's correction or
penalty, the run's spend). A step that fails (Redis restarting, a timeout) is skipped
(`after_answer`): each heals by itself (the gate's place expires, the breaker's window moves
on, the limiter's estimate stands, a lost spend is seeded again from the database). It is said
once, and once again when the step works again, not once per call.

Before a call is sent, Redis that cannot be reached (`unreachable`) means the call is not
sent: the judge raises CoordinationUnavailable, and the item waits with what its earlier calls
used (a repair request, a re-ask, a second stage's call: their first call's usage is written).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_failing: set[str] = set()
_lock = threading.Lock()


def after_answer(what: str, step: Callable[[], object]) -> None:
    """Run one bookkeeping step of an answered call (`what` names it); a failure is logged
    (once until the step works again) and does not reach the caller."""
    try:
        step()
    except Exception as exc:
        with _lock:
            first = what not in _failing
            _failing.add(what)
        if first:
            log.warning("%s after an answer failed (%s); the answer is kept", what, exc)
        return
    if _failing:
        with _lock:
            back = what in _failing
            _failing.discard(what)
        if back:
            log.info("%s after an answer works again", what)


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` is Redis that cannot be reached or timed out (a judge call that meets it
    before it is sent is not sent, and its item waits: recallq.core.errors.CoordinationUnavailable).
    """
    try:
        from redis.exceptions import ConnectionError, TimeoutError
    except ImportError:  # local mode without the service extra: no Redis to fail
        return False
    return isinstance(exc, ConnectionError | TimeoutError)
