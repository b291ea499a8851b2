"""Who this worker process is, and the heartbeat that tells the reaper it is alive."""

from __future__ import annotations

import os
import socket
import time
import uuid

from redis import Redis

from recallq import metrics
from recallq.coordination import keys

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
FORGET_AFTER = 86400.0  # a worker silent this long leaves the list of workers


def new_owner_token(worker_id: str = WORKER_ID) -> str:
    """Marks one taking of an item: the worker's id, then a unique part."""
    return f"{worker_id}/{uuid.uuid4().hex[:12]}"


def worker_of(owner: str) -> str:
    return owner.rsplit("/", 1)[0]


class Heartbeat:
    """This worker's heartbeat in Redis, and other workers' liveness."""

    def __init__(self, redis: Redis, ttl: float, worker_id: str = WORKER_ID) -> None:
        self._redis = redis
        self.ttl = ttl
        self.worker_id = worker_id

    @property
    def interval(self) -> float:
        return self.ttl / 4

    def beat(self) -> None:
        now = time.time()
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.heartbeat(self.worker_id), "1", px=int(self.ttl * 1000))
            pipe.zadd(keys.WORKERS, {self.worker_id: now})
            pipe.zremrangebyscore(keys.WORKERS, "-inf", now - FORGET_AFTER)
            pipe.execute()
        metrics.heartbeat_beat()

    def live_workers(self) -> int:
        """How many workers beat within the heartbeat TTL."""
        return int(self._redis.zcount(keys.WORKERS, time.time() - self.ttl, "+inf"))

    def last_beat(self) -> float | None:
        """When any worker last beat (unix seconds), if one did within a day."""
        newest = self._redis.zrevrange(keys.WORKERS, 0, 0, withscores=True)
        return float(newest[0][1]) if newest else None

    def alive(self, worker_ids: list[str]) -> set[str]:
        if not worker_ids:
            return set()
        found = self._redis.mget([keys.heartbeat(w) for w in worker_ids])
        return {w for w, value in zip(worker_ids, found, strict=True) if value is not None}

    def holder_alive(self, owner: str) -> bool:
        """Whether the worker named in an item's owner token still beats."""
        return bool(self.alive([worker_of(owner)]))
