"""The broker's epoch: whether Redis lost its data since the reaper last looked."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update

from recallq.coordination import keys
from recallq.state.db import Database
from recallq.state.tables import BrokerEpoch, utcnow

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

EPOCH_NAME = "redis"


class BrokerEpochs:
    """Whether the broker lost its data since the reaper last looked.

    The epoch is Redis's `INFO server` `run_id` when it was first seen, remembered twice: in
    a Redis key and in Postgres. A Redis that restarted without its data (or was flushed)
    lacks the key; Postgres still has the row, so the loss shows whichever worker starts or
    sweeps first, and nothing a worker does at start can hide it. A Redis that restarted
    with its data (persistence) keeps the key: its new run_id is then no loss."""

    def __init__(self, redis: Redis, database: Database) -> None:
        self._redis = redis
        self._db = database

    def lost(self) -> bool:
        run_id = str(self._redis.info("server")["run_id"])
        with self._db.transaction() as conn:
            known = conn.execute(
                select(BrokerEpoch.token).where(BrokerEpoch.name == EPOCH_NAME).with_for_update()
            ).scalar_one_or_none()
            # read once the row is locked: a sweep that wrote the key and committed while this
            # one waited for the row is then seen (read before, the key was missing: a false
            # loss, seen when two workers' first sweeps overlapped over a slow database link)
            found = self._redis.get(keys.BROKER_EPOCH)
            marker = found.decode() if isinstance(found, bytes) else found
            if known is None:  # the first sweep ever: nothing can have been lost yet
                conn.execute(
                    insert(BrokerEpoch).values(name=EPOCH_NAME, token=run_id, updated_at=utcnow())
                )
            elif marker == known:
                return False
            else:
                values = {"token": run_id, "updated_at": utcnow()}
                conn.execute(
                    update(BrokerEpoch).where(BrokerEpoch.name == EPOCH_NAME).values(values)
                )
                log.warning(
                    "the broker lost its data (Redis run_id %s, was %s): every message is gone",
                    run_id,
                    known,
                )
            # before the commit: a second sweeper waiting on the row then finds them equal
            self._redis.set(keys.BROKER_EPOCH, run_id)
        return known is not None
