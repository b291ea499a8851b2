"""ItemStore: the moves of one item through its stages (the table of moves: recallq.state)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from recallq.core.outcomes import Deferred, Ended, Skipped, SkipReason, Stage, Taken
from recallq.core.precision import Precision
from recallq.core.scoring import Outcome, Verdict
from recallq.core.status import ITEM_ENDED, ITEM_IN_FLIGHT, ItemStatus, RunStatus
from recallq.core.usage import NO_USAGE, Usage
from recallq.observability import metrics
from recallq.state.claim_cache import ClaimCache
from recallq.state.db import Database
from recallq.state.item_charges import ItemCharges, charges_of
from recallq.state.item_statements import (
    HAND_OVER,
    HAND_OVER_GROUP,
    RELEASE_NEXT,
    RUN_CONTEXT,
    STORED_CLAIMS,
    STORED_CLAIMS_OF,
    TAKE_GROUP,
    TAKE_READ_GROUP,
    TAKE_READ_ONE,
)
from recallq.state.item_writes import (
    IN_FLIGHT,
    add_values,
    charge_params,
    claims_insert,
    claims_saved,
    claims_saved_together,
    ended_statement,
    failed_values,
    item_update_params,
    items,
    owned_write,
    record_charges,
    runs,
    spent_values,
    succeeded_values,
    update_item,
    update_items_in_id_order,
    verdict_rows,
    verdicts_upsert,
    write_charges,
)
from recallq.state.tables import as_utc, utcnow
from recallq.state.usage_spool import Charge, UsageSpool

# a worker keeps the static contexts of this many runs (each at most the context byte limit)
RUN_CONTEXTS_KEPT = 16

log = logging.getLogger(__name__)

#: a pass handed over to the stage that runs it, and the item's resolved contexts
HandedOver = tuple[Taken, list[str]]


@dataclass(frozen=True)
class FoundClaims:
    """Claims found for a pass, for extraction's end: what finding them used (`usage`),
    whether they came from the claim cache, and their key there."""

    taken: Taken
    claims: Sequence[str]
    usage: Usage
    cache_hit: bool
    cache_key: str


def _refused(item_id: int, move: str, owner: str) -> None:
    """A guarded write that found the item no longer its pass's: one line each, so that a stale
    pass's late writes (a worker back from a partition, a redelivered message) can be seen."""
    log.info("item %d: %s refused: no longer owned by %s", item_id, move, owner)


class ItemStore:
    """The moves of one item through its stages (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        lease_seconds: float,
        queue_lease_seconds: float,
        dispatch_window: int,
        release_group: int,
        spool: UsageSpool | None = None,
    ) -> None:
        """`dispatch_window`: items of one run queued or running at once. `release_group`: how
        many places must be free before items are released into them, so that they travel
        (and are extracted) together. `spool` keeps the usage of writes the database refused
        to take (it was down) until `write_spooled` can write it."""
        self._db = database
        self.charges = ItemCharges(database, spool or UsageSpool())
        self.lease_seconds = lease_seconds
        self.queue_lease_seconds = queue_lease_seconds
        self.dispatch_window = dispatch_window
        self.release_group = min(release_group, dispatch_window)
        self._run_contexts: OrderedDict[str, list[str]] = OrderedDict()
        self._run_contexts_lock = threading.Lock()

    @property
    def spool(self) -> UsageSpool:
        """Where the usage of writes the database did not take waits (see ItemCharges)."""
        return self.charges.spool

    def _lease(self, seconds: float | None = None) -> datetime:
        """Lease of a stage at work (default), or of `seconds`."""
        return utcnow() + timedelta(seconds=self.lease_seconds if seconds is None else seconds)

    def queue_lease(self) -> datetime:
        """Lease of an item whose next message waits in the broker. If the message is lost (a
        worker died holding it unacknowledged), the reaper sends another when this runs out;
        a duplicate is harmless, the owner token sorts it out."""
        return self._lease(self.queue_lease_seconds)

    # --- take -------------------------------------------------------------------------------

    def take(
        self, item_id: int, owner: str, holder_alive: Callable[[str], bool]
    ) -> Taken | Skipped:
        """queued|running → running under `owner`, or why not. An item whose run was cancelled
        becomes cancelled here; one held by a live worker is left to it (a duplicate message).

        The read and the write need no common transaction: the write happens only if nobody
        moved the item on since the read (its WHERE checks owner and status again)."""
        with self._db.single_statement() as conn:
            row = conn.execute(TAKE_READ_ONE, {"item_id": item_id}).one_or_none()
        return self._take_read(item_id, row, owner, holder_alive)

    def take_group(
        self,
        item_ids: Sequence[int],
        new_owner: Callable[[], str],
        holder_alive: Callable[[str], bool],
    ) -> list[Taken | Skipped]:
        """`take` for each of these items (a fresh owner token each from `new_owner`), their
        reads in one query and, on Postgres, their writes in another: what each became, in
        order."""
        with self._db.single_statement() as conn:
            found = conn.execute(TAKE_READ_GROUP, {"item_ids": list(dict.fromkeys(item_ids))})
            rows = {row.id: row for row in found}
        if self._db.dialect != "postgresql":
            return [
                self._take_read(item_id, rows.get(item_id), new_owner(), holder_alive)
                for item_id in item_ids
            ]
        became: dict[int, Taken | Skipped] = {}
        taking: dict[int, str] = {}
        for item_id in dict.fromkeys(item_ids):
            row = rows.get(item_id)
            not_taken = self._not_taken(item_id, row, holder_alive)
            if not_taken is None:
                taking[item_id] = new_owner()
            else:
                became[item_id] = not_taken
        became |= self._take_all(taking, rows)
        # a second copy of an id in the group finds the item no longer as it was read
        seen: set[int] = set()
        results: list[Taken | Skipped] = []
        for item_id in item_ids:
            again = item_id in seen and item_id in taking
            results.append(Skipped(SkipReason.NOT_OWNED) if again else became[item_id])
            seen.add(item_id)
        return results

    def _take_all(self, owners: dict[int, str], rows: dict[int, Any]) -> dict[int, Taken | Skipped]:
        """The write of `take` for several items (Postgres): each under its owner token, in
        one statement; what each became."""
        if not owners:
            return {}
        taking = [
            {"id": i, "owner": owner, "old_owner": rows[i].owner, "old_status": rows[i].status}
            for i, owner in owners.items()
        ]
        params = {
            "b_rows": taking,
            "b_ids": list(owners),
            "b_lease": self._lease(),
            "b_now": utcnow(),
        }
        with self._db.single_statement() as conn:
            moved = set(conn.execute(TAKE_GROUP, params).scalars())
            with_claims = [i for i in moved if rows[i].has_claims]
            known: dict[int, list[str]] = {i: [] for i in with_claims}
            if with_claims:
                for item_id, text in conn.execute(STORED_CLAIMS_OF, {"item_ids": with_claims}):
                    known[item_id].append(text)
        if moved:
            metrics.items_moved(ItemStatus.RUNNING, len(moved))
        became: dict[int, Taken | Skipped] = {}
        for item_id, owner in owners.items():
            if item_id not in moved:
                became[item_id] = Skipped(SkipReason.NOT_OWNED)
                continue
            claims = tuple(known[item_id]) if item_id in known else None
            became[item_id] = self._taken(item_id, owner, rows[item_id], claims)
        return became

    def _not_taken(
        self, item_id: int, row: Any, holder_alive: Callable[[str], bool]
    ) -> Skipped | None:
        """Why `take` leaves an item as it is (None: it takes it). An item whose run was
        cancelled becomes cancelled here."""
        if row is None or row.status in ITEM_ENDED:
            return Skipped(SkipReason.ENDED)
        if row.status == ItemStatus.PENDING:  # a stale message: dispatch releases it later
            return Skipped(SkipReason.NOT_RELEASED)
        if row.status == ItemStatus.BATCHED:  # a batch-mode run's item makes no online call
            return Skipped(SkipReason.IN_BATCH)
        now = utcnow()
        if row.run_status == RunStatus.CANCELLED:
            cancelled = {"status": ItemStatus.CANCELLED, "finished_at": now, "lease_until": None}
            with self._db.single_statement() as conn:
                update_item(conn, item_id, cancelled, status=row.status)
            return Skipped(SkipReason.RUN_CANCELLED)
        held = row.status == ItemStatus.RUNNING and row.owner and row.lease_until is not None
        if held and as_utc(row.lease_until) > now and holder_alive(row.owner):
            return Skipped(SkipReason.HELD)
        return None

    def _take_read(
        self, item_id: int, row: Any, owner: str, holder_alive: Callable[[str], bool]
    ) -> Taken | Skipped:
        """The rest of `take`, once the item's row is read (None: no such item)."""
        not_taken = self._not_taken(item_id, row, holder_alive)
        if not_taken is not None:
            return not_taken
        values: dict[str, Any] = {
            "status": ItemStatus.RUNNING,
            "owner": owner,
            "lease_until": self._lease(),
            "attempts": 1,
        }
        if row.started_at is None:  # first taking; a retaken item keeps when it started
            values["started_at"] = utcnow()
        unchanged = {"owner": row.owner, "status": row.status, "unowned": row.owner is None}
        with self._db.single_statement() as conn:
            if not update_item(conn, item_id, values, **unchanged):
                return Skipped(SkipReason.NOT_OWNED)
            known = self._stored_claims(conn, item_id) if row.has_claims else None
        return self._taken(item_id, owner, row, known)

    @staticmethod
    def _taken(item_id: int, owner: str, row: Any, known: tuple[str, ...] | None) -> Taken:
        """The pass of an item just taken under `owner` (`row` as `take` read it)."""
        waiting = as_utc(row.waiting_since).timestamp() if row.waiting_since else None
        return Taken(
            item_id,
            owner,
            row.run_id,
            row.model,
            row.scale,
            row.ground_truth,
            known,
            row.retry_deadline_s,
            waiting,
            row.project,
            row.key,
            row.precision,
        )

    def cached_claims(self, keys: Sequence[str]) -> dict[str, list[str]]:
        """Claims the claim cache holds for those of these keys (ground truth, model, prompt
        version) it has: one query for a group's items."""
        if not keys:
            return {}
        with self._db.single_statement() as conn:
            return ClaimCache.read(conn, keys)

    # --- while running ----------------------------------------------------------------------

    def save_claims(
        self,
        taken: Taken,
        claims: Sequence[str],
        usage: Usage,
        cache_hit: bool,
        cache_key: str,
    ) -> Taken | Skipped:
        """running → running: the item's claims (and, when freshly extracted, the claim cache)
        with what their extraction used. The item's next message is on its way: its lease
        becomes a queue lease. Returns the pass with the claims stored, which are an earlier
        pass's when that one stored its claims first. The item made progress: whatever it
        waited out is over."""
        values = spent_values(usage, Stage.EXTRACTION, int(cache_hit)) | {
            "lease_until": self.queue_lease(),
            "waiting_since": None,
        }
        with self.charges.charging(taken, (usage, Stage.EXTRACTION)) as charges:
            if self._db.dialect == "postgresql":
                all_new = self._save_claims_in_one(
                    taken, values, charges, claims, cache_hit, cache_key
                )
            else:
                all_new = self._save_claims_in_steps(
                    taken, values, charges, claims, cache_hit, cache_key
                )
        if all_new is None:
            return Skipped(SkipReason.NOT_OWNED)
        # else an earlier pass stored its claims first: those are the item's (read after the
        # write, whose usage a failed read must not count again)
        stored = tuple(claims) if all_new else self.stored_claims(taken.item_id)
        return replace(taken, claims=stored, waiting_since=None)

    def _save_claims_in_one(
        self,
        taken: Taken,
        values: dict[str, Any],
        charges: list[Charge],
        claims: Sequence[str],
        cache_hit: bool,
        cache_key: str,
    ) -> bool | None:
        """save_claims in one statement (Postgres): whether all its claims were new (else an
        earlier pass stored them first), None when refused."""
        params = item_update_params(taken.item_id, values, taken.owner, ItemStatus.RUNNING)
        params |= {"b_claims": list(claims), "b_key": cache_key} | charge_params(charges)
        statement = claims_saved(frozenset(values), not cache_hit)
        with self._db.single_statement() as conn:
            row = conn.execute(statement, params).one()
        if not row.owned:
            self._refuse(taken, charges, "save_claims")
            return None
        return bool(row.inserted == len(claims))

    def save_claims_together(self, found: Sequence[FoundClaims]) -> list[Taken | Skipped]:
        """`save_claims` for several passes (the items of one extraction call, or the claim
        cache's hits of a group): on Postgres in one statement. What each became, in order."""
        ids = [f.taken.item_id for f in found]
        if self._db.dialect != "postgresql" or len(found) < 2 or len(set(ids)) < len(ids):
            return [
                self.save_claims(f.taken, f.claims, f.usage, f.cache_hit, f.cache_key)
                for f in found
            ]
        rows = [
            {
                "id": f.taken.item_id,
                "owner": f.taken.owner,
                **spent_values(f.usage, Stage.EXTRACTION, int(f.cache_hit)),
                "key": f.cache_key,
                "fresh": not f.cache_hit,
                "claims": list(f.claims),
            }
            for f in found
        ]
        charges = {f.taken.item_id: charges_of(f.taken, (f.usage, Stage.EXTRACTION)) for f in found}
        params = {"b_rows": rows, "b_ids": ids, "b_lease": self.queue_lease()}
        params |= charge_params([c for of_item in charges.values() for c in of_item])
        try:
            with self._db.single_statement() as conn:
                saved = conn.execute(claims_saved_together(), params)
                written: dict[int, int] = {row.id: row.inserted for row in saved}
        except SQLAlchemyError:
            self.charges.keep([c for of_item in charges.values() for c in of_item])
            raise
        refused = [f.taken for f in found if f.taken.item_id not in written]
        if refused:
            try:
                for taken in refused:
                    self._refuse(taken, charges[taken.item_id], "save_claims")
            except SQLAlchemyError:
                self.charges.keep([c for t in refused for c in charges[t.item_id]])
                raise
        became: list[Taken | Skipped] = []
        for f in found:
            item_id = f.taken.item_id
            if item_id not in written:
                became.append(Skipped(SkipReason.NOT_OWNED))
                continue
            stored = tuple(f.claims)
            if written[item_id] != len(f.claims):  # an earlier pass stored its claims first
                stored = self.stored_claims(item_id)
            became.append(replace(f.taken, claims=stored, waiting_since=None))
        return became

    def stored_claims(self, item_id: int) -> tuple[str, ...]:
        """The claims an item has stored, in order."""
        with self._db.single_statement() as conn:
            return self._stored_claims(conn, item_id)

    def _save_claims_in_steps(
        self,
        taken: Taken,
        values: dict[str, Any],
        charges: list[Charge],
        claims: Sequence[str],
        cache_hit: bool,
        cache_key: str,
    ) -> bool | None:
        """save_claims in one transaction of several statements (SQLite)."""
        with self._db.transaction() as conn:
            if not self._write_owned(conn, taken, values, charges, "save_claims"):
                return None
            if not cache_hit:
                ClaimCache.write(conn, cache_key, claims)
            rows = [{"item_id": taken.item_id, "idx": i, "text": t} for i, t in enumerate(claims)]
            inserted = conn.execute(claims_insert(conn.dialect.name), rows).all()
        return len(inserted) == len(claims)

    def hand_over(self, taken: Taken, new_owner: str) -> HandedOver | Skipped:
        """running → running under the owner token of the worker running the next stage, so
        the reaper follows that worker's heartbeat and a duplicate of its message finds the
        item no longer its own. Returns the pass and the item's resolved contexts."""
        params = {
            "b_id": taken.item_id,
            "b_owner": taken.owner,
            "b_new_owner": new_owner,
            "b_lease": self._lease(),
        }
        with self._db.single_statement() as conn:
            row = conn.execute(HAND_OVER, params).one_or_none()
        return self._handed(taken, new_owner, None if row is None else row.contexts, row is None)

    def hand_over_group(
        self, passes: Sequence[Taken], new_owner: str
    ) -> list[HandedOver | Skipped]:
        """`hand_over` for the passes of one message, in one statement; in their order."""
        owned = [(taken.item_id, taken.owner) for taken in passes]
        params = {"b_owned": owned, "b_new_owner": new_owner, "b_lease": self._lease()}
        with self._db.single_statement() as conn:
            found = {row.id: row.contexts for row in conn.execute(HAND_OVER_GROUP, params)}
        return [
            self._handed(t, new_owner, found.get(t.item_id), t.item_id not in found) for t in passes
        ]

    def _handed(
        self, taken: Taken, new_owner: str, contexts: list[str] | None, refused: bool
    ) -> HandedOver | Skipped:
        if refused:
            _refused(taken.item_id, "hand_over", taken.owner)
            return Skipped(SkipReason.NOT_OWNED)
        if contexts is None:  # the run's static context, stored once on the run
            contexts = self.run_context(taken.run_id)
        return replace(taken, owner=new_owner), list(contexts)

    def run_context(self, run_id: str) -> list[str]:
        """A run's static context ([] when it has none). It never changes, so a worker keeps
        the last few it read instead of reading a megabyte per item."""
        with self._run_contexts_lock:
            if run_id in self._run_contexts:
                self._run_contexts.move_to_end(run_id)
                return self._run_contexts[run_id]
        with self._db.single_statement() as conn:
            found = conn.execute(RUN_CONTEXT, {"run_id": run_id}).scalar()
        context = list(found or [])
        with self._run_contexts_lock:
            self._run_contexts[run_id] = context
            while len(self._run_contexts) > RUN_CONTEXTS_KEPT:
                self._run_contexts.popitem(last=False)
        return context

    # --- ending -----------------------------------------------------------------------------

    def succeed(
        self,
        taken: Taken,
        outcome: Outcome,
        usage: Usage,
        stage: Stage,
        verdicts: dict[int, Verdict] | None = None,
        cache_hits: int = 0,
        precision: Precision | None = None,
        relevance: Usage = NO_USAGE,
    ) -> Ended | Skipped:
        """running → succeeded with its score, reason, the verdict of every claim and its
        context precision; the next pending item of the run is queued in its place. `usage` is
        what `stage` spent last, `relevance` what the context_relevance call spent."""
        values = succeeded_values(outcome, usage, stage, cache_hits, precision, relevance)
        rows = verdict_rows(taken.item_id, taken.claims or (), verdicts) if verdicts else []
        with self.charges.charging(taken, (usage, stage), (relevance, Stage.RELEVANCE)) as charges:
            ended = self._end(taken, values, charges, rows, "succeed")
        if ended is not None and precision is not None:
            metrics.precision_scored(precision.mode)
        return Skipped(SkipReason.NOT_OWNED) if ended is None else ended

    def fail(
        self, taken: Taken, error: str, usage: Usage, stage: Stage, relevance: Usage = NO_USAGE
    ) -> Ended | Skipped:
        """running → failed with its error; the next pending item is queued in its place.
        `relevance`: what a context_relevance call spent, beside `stage`'s `usage`."""
        values = failed_values(error, usage, stage, relevance)
        with self.charges.charging(taken, (usage, stage), (relevance, Stage.RELEVANCE)) as charges:
            ended = self._end(taken, values, charges, [], "fail")
        return Skipped(SkipReason.NOT_OWNED) if ended is None else ended

    def _end(
        self,
        taken: Taken,
        values: dict[str, Any],
        charges: list[Charge],
        verdicts: list[dict[str, Any]],
        move: str,
    ) -> Ended | None:
        """An item's end (`move`): its values, its claims' `verdicts` and the release of the
        next pending items in its place, unless its pass no longer owns it (None)."""
        if self._db.dialect != "postgresql":  # one transaction of several statements
            with self._db.transaction() as conn:
                if not self._write_owned(conn, taken, values, charges, move):
                    return None
                if verdicts:
                    conn.execute(verdicts_upsert(conn.dialect.name), verdicts)
                return Ended(taken.run_id, self._release_next(conn, taken.run_id))
        params = item_update_params(taken.item_id, values, taken.owner, ItemStatus.RUNNING)
        params |= {
            "b_verdicts": verdicts,
            "b_run": taken.run_id,
            "b_window": self.dispatch_window,
            "b_group": self.release_group,
            "b_lease": self.queue_lease(),
        } | charge_params(charges)
        with self._db.single_statement() as conn:
            row = conn.execute(ended_statement(frozenset(values)), params).one()
        if not row.owned:
            self._refuse(taken, charges, move)
            return None
        metrics.items_moved(values["status"], 1)
        released = tuple(sorted(row.released or ()))
        if released:
            metrics.items_moved(ItemStatus.QUEUED, len(released))
        # Items still pending (as the statement started, less those it released) end only
        # after this write commits, and each looks for the run's completion then: this item
        # cannot be the run's last. (Were one released, run and ended within this very
        # statement, the reaper's sweep, which dispatches every active run, completes it.)
        return Ended(taken.run_id, released, pending_left=row.pending > len(released))

    def defer(
        self,
        taken: Taken,
        delay: float,
        usage: Usage,
        stage: Stage,
        waiting_since: datetime | None,
        relevance: Usage = NO_USAGE,
    ) -> Deferred | Skipped:
        """running → queued, due in `delay` seconds, keeping its claims and usage: its worker
        slot is given back, and the reaper sends the item again when its lease runs out.
        `waiting_since` is when it started to wait out a provider incident (None: it waits
        for something sure to come, as rate-limit capacity)."""
        until = self._lease(delay)
        spent = spent_values(usage, stage)
        if relevance != NO_USAGE:
            spent = add_values(spent, spent_values(relevance, Stage.RELEVANCE))
        values = spent | {
            "status": ItemStatus.QUEUED,
            "owner": None,
            "lease_until": until,
            "deferrals": 1,
            "waiting_since": waiting_since,
        }
        with self.charges.charging(taken, (usage, stage), (relevance, Stage.RELEVANCE)) as charges:
            if not self._write_owned_alone(taken, values, charges, "defer"):
                return Skipped(SkipReason.NOT_OWNED)
        return Deferred(until)

    # --- lost work --------------------------------------------------------------------------

    def requeue_lost(self, item_ids: list[int]) -> list[int]:
        """queued|running → queued for items whose message or worker is gone (the reaper's
        finding); returns those requeued, whose messages are the caller's to send."""
        if not item_ids:
            return []
        with self._db.transaction() as conn:
            return update_items_in_id_order(
                conn,
                items.c.id.in_(item_ids),
                items.c.status.in_(ITEM_IN_FLIGHT),
                values={
                    "status": ItemStatus.QUEUED,
                    "owner": None,
                    "lease_until": self.queue_lease(),
                },
                skip_locked=True,
            )

    def wake_waiting(self, model: str, limit: int | None = None) -> list[int]:
        """queued → queued, due now: items of running runs of `model` that wait out a provider
        incident (deferred, `waiting_since` set), the `limit` first by id (None: all). Its
        breaker closed, or its next probe is due (recallq.execution.breaker_wakes); returns
        the ids, whose messages are the caller's to send."""
        of_model = select(runs.c.id).where(
            runs.c.model == model, runs.c.status == RunStatus.RUNNING
        )
        with self._db.transaction() as conn:
            return update_items_in_id_order(
                conn,
                items.c.run_id.in_(of_model.scalar_subquery()),
                items.c.status == ItemStatus.QUEUED,
                items.c.owner.is_(None),
                items.c.waiting_since.is_not(None),
                items.c.lease_until > utcnow(),
                values={"lease_until": self.queue_lease()},
                skip_locked=True,
                limit=limit,
            )

    def expire_lease(self, item_id: int, worker_id: str) -> None:
        """running → running, due for the reaper now (its message may be lost in an outage),
        while a pass of `worker_id` still owns it: a worker back from a partition hands back
        only what nobody took over meanwhile (a live worker's item, made due, was taken from
        it at the next sweep)."""
        statement = (
            update(items)
            .where(
                items.c.id == item_id,
                items.c.status == ItemStatus.RUNNING,
                items.c.owner.startswith(f"{worker_id}/", autoescape=True),
            )
            .values(lease_until=self._lease(1))
        )
        with self._db.single_statement() as conn:
            if not conn.execute(statement).rowcount:
                _refused(item_id, "expire_lease", worker_id)

    # --- internals --------------------------------------------------------------------------

    def _write_owned(
        self,
        conn: Connection,
        taken: Taken,
        values: dict[str, Any],
        charges: list[Charge],
        move: str,
    ) -> bool:
        """Write only while this pass owns the running item (`move` names the write, for the
        line a refusal logs), with the charges of the usage it counts. A refused write still
        counts those charges: the calls this pass made were sent and billed."""
        owned = update_item(
            conn, taken.item_id, values, owner=taken.owner, status=ItemStatus.RUNNING
        )
        if owned:
            record_charges(conn, charges)
        else:
            _refused(taken.item_id, move, taken.owner)
            write_charges(conn, charges)
        return bool(owned)

    def _write_owned_alone(
        self, taken: Taken, values: dict[str, Any], charges: list[Charge], move: str
    ) -> bool:
        """`_write_owned` as a write of its own: on Postgres one statement in autocommit (the
        refusal's charges, rare, in a transaction after it)."""
        if self._db.dialect != "postgresql":
            with self._db.transaction() as conn:
                return self._write_owned(conn, taken, values, charges, move)
        params = item_update_params(taken.item_id, values, taken.owner, ItemStatus.RUNNING)
        with self._db.single_statement() as conn:
            owned = conn.execute(owned_write(frozenset(values)), params | charge_params(charges))
            owned = owned.scalar_one()
        if not owned:
            self._refuse(taken, charges, move)
        return bool(owned)

    def _refuse(self, taken: Taken, charges: list[Charge], move: str) -> None:
        """After a stage's end written in one statement found the item no longer its pass's:
        the charges of the usage the refused write carried still count (see `_write_owned`)."""
        _refused(taken.item_id, move, taken.owner)
        self.charges.write(charges)

    def write_spooled(self) -> int:
        """Write the usage the spool keeps: see ItemCharges.write_spooled."""
        return self.charges.write_spooled()

    def _release_next(self, conn: Connection, run_id: str) -> tuple[int, ...]:
        """pending → queued: when a group's worth of places in a running run's dispatch
        window is free, that many of its pending items take them."""
        free = self.dispatch_window - conn.execute(IN_FLIGHT, {"b_run": run_id}).scalar_one()
        if free < self.release_group:
            return ()
        params = {"b_run": run_id, "b_lease": self.queue_lease(), "b_limit": free}
        released = tuple(conn.execute(RELEASE_NEXT, params).scalars())
        metrics.items_moved(ItemStatus.QUEUED, len(released))
        return released

    @staticmethod
    def _stored_claims(conn: Connection, item_id: int) -> tuple[str, ...]:
        return tuple(conn.execute(STORED_CLAIMS, {"item_id": item_id}).scalars())
