"""The Celery broker as the engine's work queue: how messages are named, routed and sent.

The API and the workers both send (a new run's dispatch; an item's stages), so this lives in
the library; the tasks that receive these messages are the worker's (worker.tasks).

    dispatch(run_id=)                     top up the run's window of queued items
    extract_group(item_ids=[...])         one per group of released items; it sends the items
        └──► attribute_group(messages=[...], item_ids=[...])   whose claims it found, together

A message costs a worker more CPU than a judge call's HTTP round trip (kombu's Redis transport
records every delivery and acknowledgement for acks_late): a group's items travel together, in
attribution messages of ATTRIBUTION_MESSAGE_ITEMS (a task attributes its items one after the
other: fewer per message keeps more of a run's dispatch window in flight at once).

Arguments go by name: a worker reads the items a message holds from `item_ids` or `item_id`
(worker.tasks), never from a position.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from recallq.core.outcomes import Taken

if TYPE_CHECKING:  # the app is made by whoever sends (the API, a worker): local mode never is
    from celery import Celery
    from redis import Redis

QUEUE = "recallq"
DISPATCH = "recallq.dispatch"
EXTRACT_GROUP = "recallq.extract_group"
ATTRIBUTE_GROUP = "recallq.attribute_group"
#: one item's attribution, as sent before attribute_group: still received, never sent
ATTRIBUTE = "recallq.attribute"
#: items per attribute_group message: a dispatch window of W items keeps up to W / this many
#: judge calls of a run in flight
ATTRIBUTION_MESSAGE_ITEMS = 4


def configure(app: Celery, broker_url: str) -> Celery:
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            # longer than any task (attempts x timeout), so acks_late never redelivers live work
            "visibility_timeout": 3 * 3600,
        },
        task_default_queue=QUEUE,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_enable_soft_shutdown_on_idle=True,
        worker_soft_shutdown_timeout=30.0,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
    )
    return app


def items_named(arguments: Mapping[str, Any]) -> list[int]:
    """The items a task's message is about, by argument name (`item_ids` or `item_id`)."""
    found = arguments.get("item_ids")
    if found is None:
        found = [arguments["item_id"]] if "item_id" in arguments else []
    return [i for i in found if isinstance(i, int)] if isinstance(found, list) else []


# kombu's Redis transport keeps each message delivered and not yet acknowledged here
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"  # sorted set: delivery tag -> when it was delivered


def unacknowledged(redis: Redis, delivered_before: float) -> dict[str, tuple[float, list[int]]]:
    """The task messages delivered (to a worker alive or dead) before `delivered_before`, in
    unix seconds, and not acknowledged: delivery tag -> when, and the items it is about."""
    pairs = cast(
        list[tuple[bytes, float]],
        redis.zrangebyscore(UNACKED_INDEX, "-inf", delivered_before, withscores=True),
    )
    delivered = {tag.decode(): float(score) for tag, score in pairs}
    if not delivered:
        return {}
    found: dict[str, tuple[float, list[int]]] = {}
    for tag, raw in zip(delivered, redis.hmget(UNACKED, list(delivered)), strict=True):
        if raw is None:
            continue
        try:
            message = json.dumps(json.loads(raw)[0])  # [message, exchange, routing key]
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        found[tag] = (delivered[tag], _message_items(message))
    return found


def queued_items(redis: Redis) -> set[int]:
    """The items of every task message waiting in the queue (not yet delivered)."""
    found: set[int] = set()
    for raw in redis.lrange(QUEUE, 0, -1):
        found.update(_message_items(raw))
    return found


def _message_items(raw: bytes | str) -> list[int]:
    """The items of one task message as kombu's Redis transport stores it; none if it is not
    a task message of ours."""
    try:
        message = json.loads(raw)
        _args, kwargs, *_ = json.loads(base64.b64decode(message["body"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return []
    return items_named(kwargs) if isinstance(kwargs, dict) else []


def forget_unacknowledged(redis: Redis, tags: Sequence[str]) -> None:
    """Acknowledge, for a worker that died, messages whose items the reaper sent again (else
    kombu delivers them once more after the visibility timeout: harmless, but late)."""
    if tags:
        with redis.pipeline(transaction=True) as pipe:
            pipe.hdel(UNACKED, *tags)
            pipe.zrem(UNACKED_INDEX, *tags)
            pipe.execute()


class CeleryQueue:
    """Sends the engine's work as Celery messages by task name."""

    def __init__(self, app: Celery, group_size: int) -> None:
        self.app = app
        self.group_size = group_size

    def send_items(self, item_ids: Sequence[int]) -> None:
        for start in range(0, len(item_ids), self.group_size):
            group = list(item_ids[start : start + self.group_size])
            self.app.send_task(EXTRACT_GROUP, kwargs={"item_ids": group})

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        for start in range(0, len(passes), ATTRIBUTION_MESSAGE_ITEMS):
            group = passes[start : start + ATTRIBUTION_MESSAGE_ITEMS]
            messages = [taken.to_message() for taken in group]
            item_ids = [taken.item_id for taken in group]
            kwargs = {"messages": messages, "item_ids": item_ids}
            self.app.send_task(ATTRIBUTE_GROUP, kwargs=kwargs)

    def send_dispatch(self, run_id: str) -> None:
        self.app.send_task(DISPATCH, kwargs={"run_id": run_id})
