"""worker.outages: an outage is said once when it starts and once when it ends, a message
waits a doubling pause before it goes back, and other errors are left to their caller."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
import sqlalchemy.exc

from worker.outages import DATABASE, REDIS, Outages, quiet_rejections


def _db_error() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))


class Ping:
    def __init__(self) -> None:
        self.answers = False

    def __call__(self) -> None:
        if not self.answers:
            raise _db_error()


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ping = Ping()
    outages = Outages({DATABASE: ping, REDIS: lambda: None})
    caplog.set_level(logging.INFO, "worker.outages")
    assert not outages.failed(ValueError("a bug"), "attribute")  # not an outage: the caller's
    for _ in range(50):
        assert outages.failed(_db_error(), "attribute")
    outages.probe()
    outages.probe()
    assert outages.out() == [DATABASE]
    ping.answers = True
    outages.probe()
    outages.probe()
    assert outages.out() == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the database is unavailable (attribute: Exception: connection")
    assert lines[1].startswith("the database is back after 0 s (50 failed task(s)")


def test_a_message_waits_a_doubling_pause_cut_short_when_the_service_is_back() -> None:
    outages = Outages({REDIS: lambda: None}, first_pause=0.01, max_pause=0.04)
    error = redis.ConnectionError("gone")
    assert outages.pause(error) == 0.0  # no outage: no pause
    outages.failed(error, "heartbeat")
    assert [outages.pause(error) for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]

    slow = Outages({REDIS: lambda: None}, first_pause=30.0)
    slow.failed(error, "heartbeat")
    threading.Timer(0.05, slow.probe).start()  # Redis answers again
    started = time.monotonic()
    slow.pause(error)
    assert time.monotonic() - started < 5


def test_celerys_rejected_lines_are_left_out() -> None:
    rejected = logging.LogRecord("celery.app.trace", logging.WARNING, "", 0, "x", None, None)
    rejected.data = {"description": "rejected"}
    failed = logging.LogRecord("celery.app.trace", logging.ERROR, "", 0, "x", None, None)
    failed.data = {"description": "raised unexpected"}
    assert not quiet_rejections(rejected) and quiet_rejections(failed)
