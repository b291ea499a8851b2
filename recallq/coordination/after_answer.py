"""Bookkeeping after the provider answered a call: it never drops the answer.

Once a provider has answered, the call was billed: its answer (and with it its usage) must
reach the engine, whatever happens to the Redis bookkeeping that follows it (the call gate's
place, the breaker's record of the success, the rate limiter's correction, the run's spend).
A step that fails (Redis restarting, a timeout) is skipped: each is self-healing (the gate's
place expires, the breaker's window moves on, the limiter's estimate stands, a lost spend is
seeded again from the database). It is said once, and once again when the step works again,
not once per call.
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
