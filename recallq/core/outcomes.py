"""What a stage did with an item: the values the store and the engine hand back, never `None`.

take ──► Taken ──► extract ──► Continue(Taken with claims) ──► attribute ──► Ended
             └──────────────┴──► Ended | Skipped(reason) | Deferred(until)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Taken:
    """One pass of an item through the stages, owned under `owner`. It travels in the broker
    message from extraction to attribution."""

    item_id: int
    owner: str
    run_id: str
    model: str
    scale: float
    ground_truth: str | None
    claims: tuple[str, ...] | None = None  # known already (a retry reuses extracted claims)
    retry_deadline_s: float | None = None  # the run's; None: the setting
    waiting_since: float | None = None  # unix seconds: waiting out a provider incident since
    project: str = "default"  # the run's: the claim cache is the project's own
    key: str = ""  # the user's id of the item, for logs (an older message has none)
    precision: str = "cited"  # the run's precision mode (recallq.core.precision.PrecisionMode)

    @property
    def label(self) -> str:
        """The item in a log line: the user's id (the internal number if unknown) and the
        start of its run's id."""
        item = repr(self.key) if self.key else f"#{self.item_id}"
        return f"item {item} of run {self.run_id[:8]}"

    def to_message(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Taken:
        claims = message.get("claims")
        return cls(**{**message, "claims": None if claims is None else tuple(claims)})


class Stage(StrEnum):
    """Which judge call usage belongs to (runs show their usage split by stage)."""

    EXTRACTION = "extraction"
    ATTRIBUTION = "attribution"
    #: the context_relevance call of a run with precision "judged"
    RELEVANCE = "relevance"


class SkipReason(StrEnum):
    ENDED = "the item had already ended"
    RUN_CANCELLED = "its run was cancelled"
    NOT_RELEASED = "it waits for a place in its run's dispatch window"
    HELD = "a live worker holds it"
    NOT_OWNED = "this pass no longer owns it: another took it over or its run was cancelled"
    IN_BATCH = "its run's provider batch lane owns it"


@dataclass(frozen=True)
class Continue:
    """The next stage goes on with this pass."""

    taken: Taken


@dataclass(frozen=True)
class Ended:
    """The item ended. `released` are the run's pending items now queued in its place (their
    messages are the caller's to send); none released means the run may be complete, unless
    `pending_left`: the write saw items of the run still pending after its release, so the
    run cannot be complete yet (whoever ends after them looks)."""

    run_id: str
    released: tuple[int, ...] = ()
    pending_left: bool = False


@dataclass(frozen=True)
class Skipped:
    """Nothing to do for this message."""

    reason: SkipReason


@dataclass(frozen=True)
class Deferred:
    """The item went back to the queue, due again at `until` (the reaper sends it then)."""

    until: datetime


StageOutcome = Continue | Ended | Skipped | Deferred
