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


def test_a_channel_keeps_one_redis_client_per_pool() -> None:
    """kombu made a Redis client for every publish (recallq.patches): one per channel and
    pool now, a new one once the pool was dropped, and publishing still delivers."""
    patches.prepare_kombu()
    url = redis_database(14)
    queue = Queue("broker-client-test", Exchange("broker-client-test"), "broker-client-test")
    with Connection(url) as connection:
        channel = cast(Any, connection.default_channel)
        first = channel._create_client()
        assert channel._create_client() is first
        with connection.Producer() as producer:
            for n in range(3):
                producer.publish(
                    {"n": n},
                    exchange=queue.exchange,
                    routing_key="broker-client-test",
                    declare=[queue],
                )
        assert channel._create_client() is first
        assert channel._create_client(asynchronous=True) is not first  # the consumer's own
        channel._disconnect_pools()  # as after a broken connection
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool

        received: list[int] = []

        def got(body: Any, message: Any) -> None:
            received.append(body["n"])
            message.ack()

        consumer = connection.Consumer([queue], callbacks=[got])
        consumer.consume()
        while len(received) < 3:
            connection.drain_events(timeout=5)
        assert received == [0, 1, 2]
        queue(connection.default_channel).delete()
