"""The usage an item's writes count, as charges (recallq.state.usage_spool.Charge): made before a
stage's end is written, recorded by the write that counts them (recallq.state.item_writes), kept
in the spool when the database does not take the write, and written from it once it is back.

    ItemCharges.charging(pass, (usage, stage), ...)   the charges a write counts; kept if it fails
    ItemCharges.write(charges)                        a refused write still counts them
    ItemCharges.write_spooled()                       the spool's charges, once per charge id
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError

from recallq.core.outcomes import Stage, Taken
from recallq.core.usage import NO_USAGE, Usage
from recallq.state.db import Database
from recallq.state.item_writes import write_charges
from recallq.state.usage_spool import Charge, UsageSpool


class ItemCharges:
    """The charges of an item store's writes, with the spool that keeps those not written."""

    def __init__(self, database: Database, spool: UsageSpool) -> None:
        self._db = database
        self.spool = spool

    @contextmanager
    def charging(self, taken: Taken, *spent: tuple[Usage, Stage]) -> Iterator[list[Charge]]:
        """Around a write that counts what stages `spent`, as the charges it yields, which the
        write records with their usage (once per charge id: see item_writes.write_charges). If
        the database does not take the write (it is down), the charges are kept in the spool,
        written once it is back, and the error goes on (the task hands its items back). A write
        whose commit was lost on its way back recorded them: the spool's copy counts nothing."""
        charges = charges_of(taken, *spent)
        try:
            yield charges
        except SQLAlchemyError:
            self.keep(charges)
            raise

    def keep(self, charges: Sequence[Charge]) -> None:
        """Charges a write did not get into the database: written from the spool later."""
        for charge in charges:
            self.spool.keep(charge)

    def write(self, charges: Sequence[Charge]) -> None:
        """Add the charges' usage to their items, once per charge id, in one transaction: a
        refused write's (the calls were sent and billed, so their usage counts on the item
        whatever its state), or the spool's."""
        with self._db.transaction() as conn:
            write_charges(conn, charges)

    def write_spooled(self) -> int:
        """Write the usage the spool keeps (once per charge); how many charges were written.
        While the database is still down the spool keeps them, and says so once."""
        try:
            return self.spool.flush(self.write)
        except SQLAlchemyError as exc:
            self.spool.waiting(exc)
            return 0


def charges_of(taken: Taken, *spent: tuple[Usage, Stage]) -> list[Charge]:
    """The charges of what a pass's stages `spent` (none for a stage that spent nothing)."""
    return [
        Charge.new(taken.item_id, taken.run_id, stage, usage)
        for usage, stage in spent
        if usage != NO_USAGE
    ]
