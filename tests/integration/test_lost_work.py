"""Lost work comes back whatever held it, checked on real Postgres and a redis-server of this
module's own, with the stages called in-process (the judge is a double at the LLM boundary):

- one primitive for exclusive periodic work (recallq.coordination.periodic);
- the broker's epoch, remembered in Postgres, tells a Redis that lost its data whoever
  starts first (recallq.execution.broker_epoch.BrokerEpochs);
- a message a dead worker held comes back although the database names a live owner (the
  worker that sent it), and is left alone while a live owner holds it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import cast

import pytest
from celery import Celery
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from redis import Redis
from sqlalchemy import select, update

from recallq.coordination import keys
from recallq.coordination.liveness import HeldItems, held_by
from recallq.coordination.periodic import (
    LOCK_FLOOR,
    ExclusiveTurn,
    Periodic,
    run_periodically,
    turn_ms,
)
from recallq.core.outcomes import Continue, Taken
from recallq.core.status import ItemStatus
from recallq.core.usage import Usage
from recallq.execution import celery_queue as broker
from recallq.execution.broker_epoch import BrokerEpochs
from recallq.execution.reaper import SEND_MARGIN_S, HandBack
from recallq.execution.runtime import Runtime
from recallq.judge.base import Judge, JudgeReply
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.state.tables import Item, utcnow
from tests.services import RedisServer, migrated_database

MODEL = "lost-work-probe"


class EchoJudge:
    name = MODEL
    prompt_version = "echo-v1"

    def extract_claims(self, ground_truth: str, run_id: str, repair: object = None) -> JudgeReply:
        return JudgeReply({"claims": [ground_truth]}, Usage(llm_calls=1))

    def attribute(
        self, claims: list[str], contexts: list[str], run_id: str, repair: object = None
    ) -> JudgeReply:
        verdicts = [
            {"claim_index": i, "verdict": "yes", "context_indices": [0], "reason": "stated"}
            for i in range(len(claims))
        ]
        return JudgeReply({"verdicts": verdicts}, Usage(llm_calls=1))


class SentNowhere:
    """A work queue that only records what the engine and the reaper send."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_items(self, item_ids: Sequence[int]) -> None:
        self.sent += item_ids

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        pass

    def send_dispatch(self, run_id: str) -> None:
        pass


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server: one test restarts it."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture()
def redis(redis_server: RedisServer) -> Iterator[Redis]:
    client = Redis.from_url(redis_server.url())
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def pg_database() -> Iterator[str]:
    """Each test's own database: the reaper's view and the epoch row are the test's."""
    with migrated_database() as url:
        yield url


@pytest.fixture()
def workers(
    pg_database: str, redis_server: RedisServer, redis: Redis
) -> Iterator[Callable[[str], Runtime]]:
    """Runtimes of worker processes by worker id, sharing one judge and one queue."""
    settings = Settings(database_url=pg_database, redis_url=redis_server.url(), heartbeat_ttl=5)
    queue = SentNowhere()
    judge = EchoJudge()
    made: list[Runtime] = []

    def worker(worker_id: str) -> Runtime:
        runtime = Runtime.distributed(
            settings, queue, worker_id=worker_id, judges={MODEL: cast(Judge, judge)}
        )
        made.append(runtime)
        return runtime

    yield worker
    for runtime in made:
        runtime.close()


# --- the primitive ---------------------------------------------------------------------------


def test_one_turn_per_interval_across_workers(redis: Redis) -> None:
    first = ExclusiveTurn(redis, "recallq:test-turn", 10.0, "host:1")
    second = ExclusiveTurn(redis, "recallq:test-turn", 10.0, "host:2")
    assert first.claim() is True
    assert second.claim() is False and first.claim() is False
    assert redis.get("recallq:test-turn") == b"host:1"
    assert 0 < redis.pttl("recallq:test-turn") <= turn_ms(10.0) == 9000
    redis.delete("recallq:test-turn")  # the turn's time to live ran out
    assert second.claim() is True


def test_a_short_interval_holds_its_turn_for_the_lock_floor(redis: Redis) -> None:
    assert turn_ms(0.01) == int(LOCK_FLOOR * 1000) == 100
    turn = ExclusiveTurn(redis, "recallq:test-floor", 0.01, "host:1")
    assert turn.claim() is True
    assert redis.pttl("recallq:test-floor") > 10  # the floor, not 9 ms


def test_periodic_runs_when_due_and_survives_a_failing_job() -> None:
    runs: list[str] = []

    def job() -> None:
        runs.append("ran")
        raise ConnectionError("Redis is down")

    periodic = Periodic("probe", 5.0, job, first_after=0)
    start = periodic.next_at
    assert periodic.run_if_due(start) is True  # the failure is logged, not raised
    assert periodic.next_at == start + 5.0
    assert periodic.run_if_due(start + 4.9) is False
    assert periodic.run_if_due(start + 5.0) is True
    assert runs == ["ran", "ran"]


def test_run_periodically_runs_its_jobs_until_stopped() -> None:
    stop = threading.Event()
    counts = {"fast": 0, "slow": 0}

    def fast() -> None:
        counts["fast"] += 1
        if counts["fast"] == 3:
            stop.set()

    jobs = [
        Periodic("fast", 0.01, fast, first_after=0),
        Periodic("slow", 3600.0, lambda: counts.__setitem__("slow", 1)),
    ]
    thread = threading.Thread(target=run_periodically, args=(jobs, stop))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert counts == {"fast": 3, "slow": 0}


# --- the broker's epoch ----------------------------------------------------------------------


def test_a_redis_that_lost_its_data_is_seen_whoever_starts_first(
    pg_database: str, redis_server: RedisServer, redis: Redis
) -> None:
    database = Database(pg_database)
    try:
        epochs = BrokerEpochs(redis, database)
        assert epochs.lost() is False  # the first sweep ever: nothing to lose yet
        assert epochs.lost() is False
        old_run_id = redis.info("server")["run_id"]

        redis_server.restart()
        # A worker starting now writes nothing that could hide the loss: it only beats.
        fresh = Redis.from_url(redis_server.url())
        assert fresh.info("server")["run_id"] != old_run_id
        newcomer = BrokerEpochs(fresh, database)
        assert newcomer.lost() is True
        assert newcomer.lost() is False  # seen once
        assert BrokerEpochs(fresh, database).lost() is False

        fresh.flushall()  # lost without a restart: the run_id is the same, the key is gone
        assert newcomer.lost() is True
        fresh.close()
    finally:
        database.dispose()


def test_after_a_loss_only_items_without_a_message_since_are_taken_over(
    workers: Callable[[str], Runtime], redis: Redis
) -> None:
    """A flush (or a restart without data) loses the messages sent before it; a message sent
    since (a submission right after it) or held by a live worker is no loss, and taking its
    item over would void the stage at work on it and pay for its calls twice (the full suite
    saw 197 items of a fresh run extracted again after an earlier module's flush)."""
    runtime = workers("host:a")
    assert runtime.heartbeat is not None
    runtime.heartbeat.beat()
    reaper = runtime.reaper()
    assert reaper.sweep() == 0  # the epoch is known now
    gone, kept = _between_stages(runtime), _between_stages(runtime)
    _written_ago(runtime, [gone, kept], SEND_MARGIN_S + 1)
    owner = _item(runtime, kept).owner
    redis.flushall()  # the broker loses its data, the database keeps the epoch
    runtime.heartbeat.beat()
    held = HeldItems(redis, "host:a")
    held.received([kept])  # a message of it since the loss, at a live worker
    held.publish()
    assert reaper.sweep() == 1
    assert _item(runtime, gone).status == ItemStatus.QUEUED  # its message died in the flush
    assert _item(runtime, gone).owner is None
    assert _item(runtime, kept).status == ItemStatus.RUNNING and _item(runtime, kept).owner == owner
    assert reaper.sweep() == 0  # the loss is seen once


def test_after_a_loss_an_item_written_as_the_broker_was_read_waits_for_its_message(
    workers: Callable[[str], Runtime], redis: Redis
) -> None:
    """A commit comes a moment before the message it sends: an item released as the loss
    sweep reads the broker has no message there yet, and taking it over would send it twice.
    The sweeps after it take the item if it still has no message a heartbeat TTL later."""
    runtime = workers("host:a")
    assert runtime.heartbeat is not None
    runtime.heartbeat.beat()
    reaper = runtime.reaper()
    assert reaper.sweep() == 0  # the epoch is known now
    redis.flushall()
    runtime.heartbeat.beat()
    released = _queued_item(runtime)  # its message is about to be sent (SentNowhere: never)
    extracted = _between_stages(runtime)  # its attribution's message, likewise
    owner = _item(runtime, extracted).owner
    assert reaper.sweep() == 0
    assert _item(runtime, released).owner is None
    assert _item(runtime, extracted).owner == owner  # not taken over
    _written_ago(runtime, [released, extracted], runtime.settings.heartbeat_ttl + 1)
    assert reaper.sweep() == 2  # the regular sweep: written a TTL ago, still no message


def _written_ago(runtime: Runtime, item_ids: list[int], seconds: float) -> None:
    """As if the items' last write (a lease's start) were `seconds` older."""
    with runtime.database.transaction() as conn:
        conn.execute(
            update(Item)
            .where(Item.id.in_(item_ids))
            .values(lease_until=Item.lease_until - timedelta(seconds=seconds))
        )


# --- messages a dead worker held -------------------------------------------------------------


def _queued_item(runtime: Runtime) -> int:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL])
    with runtime.database.session() as session:
        run = ingest.create_run(
            session,
            runtime.runs,
            spec,
            [{"ground_truth": f"Ada was born in 1815 ({uuid.uuid4()}).", "context": ["1815."]}],
            runtime.settings,
        )
        run_id = run.id
    runtime.engine.dispatch(run_id)
    with runtime.database.session() as session:
        return session.scalars(select(Item.id).where(Item.run_id == run_id)).one()


def _between_stages(runtime: Runtime) -> int:
    """An item extracted by `runtime`'s worker, its attribution message sent."""
    item_id = _queued_item(runtime)
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue)
    assert isinstance(runtime.engine.extract(taken.taken), Continue)
    return item_id


def _dies(redis: Redis, worker_id: str, ttl: float) -> None:
    """The worker stops beating: its heartbeat key expires, its last beat grows old."""
    redis.delete(keys.heartbeat(worker_id))
    redis.zadd(keys.WORKERS, {worker_id: time.time() - 2 * ttl})


def _item(runtime: Runtime, item_id: int) -> Item:
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
    assert item is not None
    return item


def test_a_message_held_by_a_dead_worker_comes_back_at_the_next_sweep(
    workers: Callable[[str], Runtime], redis: Redis
) -> None:
    sender, holder = workers("host:sender"), workers("host:holder")
    assert sender.heartbeat is not None and holder.heartbeat is not None
    item_id = _between_stages(sender)
    sender.heartbeat.beat()
    holder.heartbeat.beat()
    held = HeldItems(redis, "host:holder")
    held.received([item_id])  # prefetched, not yet run
    held.publish()  # the holder's next heartbeat
    reaper = sender.reaper()
    reaper.sweep()
    assert _item(sender, item_id).status == ItemStatus.RUNNING  # alive: its message is safe

    _dies(redis, "host:holder", holder.heartbeat.ttl)
    # written before the holder received its message, so before its last beat
    _written_ago(sender, [item_id], 2 * holder.heartbeat.ttl)
    sent_before = len(sender.queue.sent)  # type: ignore[attr-defined]
    assert reaper.sweep() == 1
    item = _item(sender, item_id)
    assert item.status == ItemStatus.QUEUED and item.owner is None
    assert sender.queue.sent[sent_before:] == [item_id]  # type: ignore[attr-defined]
    assert held_by(redis, ["host:holder"]) == {"host:holder": set()}  # forgotten once requeued
    assert reaper.sweep() == 0


def test_a_message_a_worker_died_with_before_noting_it_comes_back(
    workers: Callable[[str], Runtime], redis: Redis, redis_server: RedisServer
) -> None:
    """Delivered to a worker killed before it could write that it held the message: only
    the broker's unacknowledged messages know of it."""
    sender = workers("host:sender")
    assert sender.heartbeat is not None
    item_id = _between_stages(sender)
    sender.heartbeat.beat()
    app = broker.configure(Celery("lost-work-test"), redis_server.url())
    broker.CeleryQueue(app, 8).send_dispatch("not-a-run")  # no item: never requeues anything
    _deliver_unacknowledged(redis_server.url())
    app.send_task(broker.ATTRIBUTE, kwargs={"message": None, "item_id": item_id})
    _deliver_unacknowledged(redis_server.url())
    assert redis.hlen(broker.UNACKED) == 2
    reaper = sender.reaper()
    assert reaper.sweep() == 0  # delivered just now: its worker may still note it

    for tag in cast(list[bytes], redis.zrange(broker.UNACKED_INDEX, 0, -1)):
        redis.zadd(broker.UNACKED_INDEX, {tag: time.time() - 2 * sender.heartbeat.ttl})
    _written_ago(sender, [item_id], 2 * sender.heartbeat.ttl)  # before its message was sent
    assert reaper.sweep() == 1
    assert _item(sender, item_id).status == ItemStatus.QUEUED
    assert redis.hlen(broker.UNACKED) == 0  # acknowledged for the dead worker: no late copy
    assert reaper.sweep() == 0
    app.close()


def test_an_item_released_by_a_worker_that_died_before_sending_it_comes_back(
    workers: Callable[[str], Runtime], redis: Redis, redis_server: RedisServer
) -> None:
    """Released (pending -> queued) in the transaction that ended another item; its worker
    was killed before it sent the item's message: no message of it is anywhere."""
    runtime = workers("host:one")
    assert runtime.heartbeat is not None
    waiting, unsent = _queued_item(runtime), _queued_item(runtime)  # "sent" nowhere
    released_long_ago = utcnow() + timedelta(
        seconds=runtime.settings.queue_lease_seconds - 2 * runtime.heartbeat.ttl
    )
    with runtime.database.session() as session, session.begin():
        session.execute(
            update(Item).where(Item.id.in_([waiting, unsent])).values(lease_until=released_long_ago)
        )
    app = broker.configure(Celery("lost-work-test"), redis_server.url())
    broker.CeleryQueue(app, 8).send_items([waiting])  # its message waits in the queue
    app.close()

    assert runtime.reaper().sweep() == 1
    assert _item(runtime, unsent).lease_until != released_long_ago  # requeued, sent again
    assert runtime.queue.sent[-1:] == [unsent]  # type: ignore[attr-defined]
    assert _item(runtime, waiting).status == ItemStatus.QUEUED


def test_an_item_between_stages_whose_message_vanished_comes_back_from_a_live_owner(
    workers: Callable[[str], Runtime], redis: Redis, redis_server: RedisServer
) -> None:
    """Owned by a live worker, between stages, and no message of it anywhere (a worker
    killed as it took the message out of the queue leaves no trace of it in Redis)."""
    runtime = workers("host:sender")
    assert runtime.heartbeat is not None
    vanished, waiting = _between_stages(runtime), _between_stages(runtime)
    runtime.heartbeat.beat()
    reaper = runtime.reaper()
    assert reaper.sweep() == 0  # just written: its message may be on its way
    written_long_ago = utcnow() + timedelta(
        seconds=runtime.settings.queue_lease_seconds - 2 * runtime.heartbeat.ttl
    )
    with runtime.database.session() as session, session.begin():
        session.execute(
            update(Item)
            .where(Item.id.in_([vanished, waiting]))
            .values(lease_until=written_long_ago)
        )
    app = broker.configure(Celery("lost-work-test"), redis_server.url())
    app.send_task(broker.ATTRIBUTE, kwargs={"message": None, "item_id": waiting})
    app.close()

    assert reaper.sweep() == 1
    assert _item(runtime, vanished).status == ItemStatus.QUEUED
    assert _item(runtime, waiting).status == ItemStatus.RUNNING  # its message is queued


def _deliver_unacknowledged(url: str) -> None:
    """A worker's consumer takes one message and dies before acknowledging it."""
    connection = Connection(url)
    queue = Queue(broker.QUEUE, Exchange(broker.QUEUE), broker.QUEUE)
    connection.Consumer([queue], callbacks=[lambda body, message: None]).consume()
    connection.drain_events(timeout=10)
    qos = connection.default_channel.qos
    qos._delivered.clear()  # SIGKILLed: nothing of this consumer runs again, nor restores
    qos._dirty.clear()
    connection.close()


def test_an_item_a_live_owner_holds_again_is_left_to_it(
    workers: Callable[[str], Runtime], redis: Redis
) -> None:
    sender, holder = workers("host:sender"), workers("host:holder")
    assert sender.heartbeat is not None and holder.heartbeat is not None
    item_id = _between_stages(sender)
    sender.heartbeat.beat()
    HeldItems(redis, "host:holder").received([item_id])
    HeldItems(redis, "host:sender").received([item_id])  # a duplicate, running on the owner
    _dies(redis, "host:holder", holder.heartbeat.ttl)
    assert sender.reaper().sweep() == 0
    assert _item(sender, item_id).owner is not None


def test_what_a_live_worker_took_from_a_dead_ones_held_items_is_not_taken_again(
    workers: Callable[[str], Runtime], redis: Redis
) -> None:
    """A dead worker's held set outlives the sweep that requeued its items while another of
    them is left to a live owner. An item that sweep requeued, taken since by a live worker
    whose next beat has not published its message yet, stays that worker's: it was requeued
    again at every sweep (a worker host vanishing set off a storm: tests/multihost)."""
    sender, holder = workers("host:sender"), workers("host:holder")
    assert sender.heartbeat is not None and holder.heartbeat is not None
    left, requeued = _between_stages(sender), _between_stages(sender)
    _written_ago(sender, [left, requeued], 2 * holder.heartbeat.ttl)
    dead = HeldItems(redis, "host:holder")
    dead.received([left, requeued])
    dead.publish()
    live = HeldItems(redis, "host:sender")
    live.received([left])  # a duplicate of `left`, running on its owner
    live.publish()
    sender.heartbeat.beat()
    _dies(redis, "host:holder", holder.heartbeat.ttl)
    reaper = sender.reaper()
    assert reaper.sweep() == 1
    assert _item(sender, requeued).status == ItemStatus.QUEUED
    assert held_by(redis, ["host:holder"]) == {"host:holder": {left, requeued}}  # kept for `left`

    assert isinstance(sender.engine.take(requeued), Continue)  # its new message, not published
    assert reaper.sweep() == 0
    assert _item(sender, requeued).status == ItemStatus.RUNNING


def test_held_items_are_published_with_each_heartbeat(redis: Redis) -> None:
    """Kept in memory as messages come and go (no Redis round trip per task) and written
    whole by each beat, so a Redis restart loses them for one beat at most."""
    held = HeldItems(redis, "host:a")
    held.received([1, 2])
    held.received([2])  # two messages of item 2
    held.finished([2])
    assert held_by(redis, ["host:a"]) == {"host:a": set()}  # not before the beat
    held.publish()
    assert held_by(redis, ["host:a"]) == {"host:a": {1, 2}}
    redis.flushall()  # Redis restarted
    held.publish()
    assert held_by(redis, ["host:a"]) == {"host:a": {1, 2}}
    held.finished([1, 2])
    held.publish()
    assert held_by(redis, ["host:a"]) == {"host:a": set()} and held.held() == set()


def test_hand_back_makes_a_taken_item_due_at_once(workers: Callable[[str], Runtime]) -> None:
    runtime = workers("host:one")
    item_id = _queued_item(runtime)
    assert isinstance(runtime.engine.take(item_id), Continue)
    lease = _item(runtime, item_id).lease_until
    hand_back = HandBack(runtime.items, "host:one")
    hand_back.add([item_id])
    hand_back.drain()
    shortened = _item(runtime, item_id).lease_until
    assert lease is not None and shortened is not None
    assert (lease - shortened).total_seconds() > runtime.settings.lease_seconds - 60
    assert hand_back.pending() == set()


def test_hand_back_leaves_what_another_worker_took_over(workers: Callable[[str], Runtime]) -> None:
    """A worker back from a partition hands back the items of the tasks the outage ended;
    those another worker took over meanwhile stay as that worker's, lease and all."""
    stale, other = workers("host:stale"), workers("host:other")
    item_id = _queued_item(stale)
    assert isinstance(stale.engine.take(item_id), Continue)
    stale.items.requeue_lost([item_id])  # the reaper, while the stale worker was cut off
    assert isinstance(other.engine.take(item_id), Continue)
    lease = _item(other, item_id).lease_until
    hand_back = HandBack(stale.items, "host:stale")
    hand_back.add([item_id])
    hand_back.drain()
    assert _item(other, item_id).lease_until == lease
    assert hand_back.pending() == set()
