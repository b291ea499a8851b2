"""The Redis broker connection on real Redis: a worker survives losing it with messages
unacknowledged (Celery collects the broken connection, detaching its transport, then closes
it; closing puts the messages back through that transport)."""

from __future__ import annotations

from typing import Any, cast

from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from recallq import patches
from tests.services import redis_database

QUEUE = Queue("broker-test", Exchange("broker-test"), "broker-test")


def test_closing_a_collected_connection_with_unacked_messages_does_not_crash() -> None:
    patches.prepare_kombu()  # what a worker applies when it starts
    url = redis_database(14)
    with Connection(url) as publisher, publisher.Producer() as producer:
        producer.publish(
            {"n": 1}, exchange=QUEUE.exchange, routing_key="broker-test", declare=[QUEUE]
        )

    connection = Connection(url)
    delivered: list = []
    connection.Consumer(
        [QUEUE], callbacks=[lambda body, message: delivered.append(message)]
    ).consume()
    connection.drain_events(timeout=5)
    assert len(delivered) == 1  # unacknowledged, as a late-acked task's message is

    channel = connection.default_channel
    cast(Any, channel)._pool = None  # the broken pool was dropped
    connection._do_close_transport()  # collect() detached the transport
    connection.close()  # was: AttributeError, which Celery treats as unrecoverable
