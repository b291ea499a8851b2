"""A worker's view of a database or Redis outage: said once when it starts and once when it
ends, with messages handed back at a doubling pause instead of a traceback each.

    a task or a periodic job fails on an outage   Outages.failed(exc): the first failure of an
                                                  outage is one warning line; the rest count
    a task's message goes back                    Outages.pause(exc): it waits 2 s, 4 s, ...
                                                  30 s (a thread holds one message meanwhile),
                                                  or less when the service is back
    every second, in a thread of its own          Outages.probe(): a ping of each service that
                                                  is out; one that answers is one info line
                                                  ("back after N s, M failures") and wakes the
                                                  waiting messages

Before: every message bounced about four times a second per thread, each with Celery's
"rejected" traceback and a warning of ours (~340 tracebacks per worker in a 30 s Postgres
stop), and every housekeeping job logged one per beat (issue 28).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import kombu.exceptions
import redis
import sqlalchemy.exc

log = logging.getLogger(__name__)

DATABASE, REDIS = "the database", "Redis"
#: What a task or a job raises when a service it needs is out, and which service that is.
SERVICE_OF: Mapping[type[BaseException], str] = {
    sqlalchemy.exc.OperationalError: DATABASE,
    sqlalchemy.exc.InterfaceError: DATABASE,
    redis.ConnectionError: REDIS,
    redis.TimeoutError: REDIS,
    kombu.exceptions.OperationalError: REDIS,  # sending the next message with the broker down
}
OUTAGES = tuple(SERVICE_OF)
FIRST_PAUSE, MAX_PAUSE = 2.0, 30.0
PROBE_INTERVAL = 1.0


def service_of(exc: BaseException) -> str | None:
    """The service an outage error is of; None for any other error."""
    for kind, service in SERVICE_OF.items():
        if isinstance(exc, kind):
            return service
    return None


@dataclass
class _Outage:
    since: float
    failures: int = 0
    pause: float = FIRST_PAUSE
    back: threading.Event = field(default_factory=threading.Event)


class Outages:
    """The outages of one worker process, by service. `pings` says how to ask each service
    whether it answers again (a ping raising an outage error: not yet)."""

    def __init__(
        self,
        pings: Mapping[str, Callable[[], object]],
        first_pause: float = FIRST_PAUSE,
        max_pause: float = MAX_PAUSE,
    ) -> None:
        self._pings = pings
        self._first_pause, self._max_pause = first_pause, max_pause
        self._lock = threading.Lock()
        self._out: dict[str, _Outage] = {}

    def failed(self, exc: BaseException, what: str) -> bool:
        """`what` (a task, a job) failed on `exc`: True when that is an outage (the first of
        one is said), False for any other error (the caller's to report)."""
        service = service_of(exc)
        if service is None:
            return False
        with self._lock:
            outage = self._out.get(service)
            if outage is None:
                outage = self._out[service] = _Outage(time.monotonic(), pause=self._first_pause)
                log.warning(
                    "%s is unavailable (%s: %s): messages go back to the queue until it "
                    "answers; said again when it does",
                    service,
                    what,
                    _one_line(exc),
                )
            outage.failures += 1
        return True

    def pause(self, exc: BaseException) -> float:
        """Wait before a message goes back: the outage's pause, doubled by each pause up to
        the maximum, or until its service answers again. Returns the pause it was given."""
        service = service_of(exc)
        with self._lock:
            outage = self._out.get(service) if service else None
            if outage is None:
                return 0.0
            wait, outage.pause = outage.pause, min(outage.pause * 2, self._max_pause)
        outage.back.wait(wait)
        return wait

    def out(self) -> list[str]:
        with self._lock:
            return sorted(self._out)

    def probe(self) -> None:
        """Ask each service that is out whether it answers; say once that it is back."""
        for service in self.out():
            try:
                self._pings[service]()
            except Exception:  # not yet (whatever the ping raised: it is tried again)
                continue
            with self._lock:
                outage = self._out.pop(service)
            outage.back.set()
            log.warning(
                "%s is back after %.0f s (%d failed task(s) or job(s) meanwhile)",
                service,
                time.monotonic() - outage.since,
                outage.failures,
            )


def quiet_rejections(record: logging.LogRecord) -> bool:
    """A filter for Celery's task log: a task rejects its message (requeued) only in an
    outage, which Outages says once; Celery logs each with a traceback."""
    data = getattr(record, "data", None)
    return not (isinstance(data, dict) and data.get("description") == "rejected")


def _one_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)  # SQLAlchemy's: the driver's error, without the SQL
    text = " ".join(str(orig if orig is not None else exc).split())
    return f"{type(orig or exc).__name__}: {text[:200]}"
