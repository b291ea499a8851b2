"""Who this worker is, and the heartbeat that tells the reaper it is alive."""

from __future__ import annotations

import os
import socket
import uuid

from redis import Redis

from recallq.settings import get_settings

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def heartbeat_key(worker_id: str) -> str:
    return f"recallq:worker:{worker_id}"


def new_owner_token() -> str:
    """Marks one taking of an item: the worker's id, then a unique part."""
    return f"{WORKER_ID}/{uuid.uuid4().hex[:12]}"


def worker_of(owner: str) -> str:
    return owner.rsplit("/", 1)[0]


def beat_interval() -> float:
    return get_settings().heartbeat_ttl / 4


def beat(redis: Redis) -> None:
    redis.set(heartbeat_key(WORKER_ID), "1", px=int(get_settings().heartbeat_ttl * 1000))


def alive(redis: Redis, worker_ids: list[str]) -> set[str]:
    if not worker_ids:
        return set()
    found = redis.mget([heartbeat_key(w) for w in worker_ids])
    return {w for w, value in zip(worker_ids, found, strict=True) if value is not None}
