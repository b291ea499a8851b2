"""CI gates: whether a finished run is good enough, and why not (exit codes:
recallq.core.exits). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recallq.core.exits import Exit
from recallq.core.status import RUN_ACTIVE, PublicItemStatus, RunStatus


@dataclass(frozen=True)
class Gate:
    """Thresholds a run must meet: its mean score at least `min_score` (in the run's scale),
    at most `max_failed` failed items (0 unless given) and, when given, at most
    `max_no_context` items scored without any context."""

    min_score: float | None = None
    max_failed: int | None = None
    max_no_context: int | None = None
    #: the run's mean context precision at least this (in the run's scale)
    min_precision: float | None = None

    @property
    def has_thresholds(self) -> bool:
        """Whether a threshold was given (a passing gate then says what it checked)."""
        return any(
            value is not None for value in (self.min_score, self.max_failed, self.min_precision)
        )

    @classmethod
    def of(cls, options: Any) -> Gate:
        """The thresholds in parsed command-line options (--min-score, --max-failed,
        --max-no-context, --min-precision)."""
        return cls(
            getattr(options, "min_score", None),
            getattr(options, "max_failed", None),
            getattr(options, "max_no_context", None),
            getattr(options, "min_precision", None),
        )


def number(value: float) -> str:
    """A score as people read it: up to 4 decimals, no trailing zeros (0.7, 0.6999)."""
    return f"{value:.4f}".rstrip("0").rstrip(".") or "0"


def misses(view: dict[str, Any], gate: Gate) -> list[str]:
    """Why the run (a run view) fails: one sentence per reason; empty when it passes."""
    counts, status = view["counts"], view["status"]
    if status in RUN_ACTIVE:
        unended = counts[PublicItemStatus.PENDING] + counts[PublicItemStatus.RUNNING]
        return [
            f"run {view['id']} is {status}: {unended} of {counts['total']} items not scored yet"
        ]
    reasons = []
    if status == RunStatus.CANCELLED:
        why = view.get("cancel_reason")
        reasons.append(f"run {view['id']} was cancelled" + (f" ({why})" if why else ""))
    failed, allowed = counts[PublicItemStatus.FAILED], gate.max_failed or 0
    if failed > allowed:
        items = "item" if failed == 1 else "items"
        reasons.append(
            f"{failed} {items} failed, more than --max-failed {gate.max_failed}"
            if gate.max_failed is not None
            else f"{failed} {items} failed (allow some with --max-failed N)"
        )
    no_context = view["summary"].get("no_context", 0)
    if gate.max_no_context is not None and no_context > gate.max_no_context:
        items = "item was" if no_context == 1 else "items were"
        reasons.append(
            f"{no_context} {items} scored without any context, more than --max-no-context "
            f"{gate.max_no_context}"
        )
    if gate.min_score is not None:
        mean = view["summary"]["mean_score"]
        if mean is None:
            reasons.append(
                f"no item was scored, so the mean score cannot reach --min-score "
                f"{number(gate.min_score)}"
            )
        elif not mean >= gate.min_score:  # fails closed: no mean reaches a NaN threshold
            reasons.append(
                f"mean score {number(mean)} is below --min-score {number(gate.min_score)}"
            )
    if gate.min_precision is not None:
        precision = view["summary"].get("mean_context_precision")
        if precision is None:
            reasons.append(
                "no item has a context precision (precision off, or no item with a context "
                f"and a ground truth), so it cannot reach --min-precision "
                f"{number(gate.min_precision)}"
            )
        elif not precision >= gate.min_precision:  # fails closed, as the mean score
            reasons.append(
                f"mean context precision {number(precision)} is below --min-precision "
                f"{number(gate.min_precision)}"
            )
    return reasons


def exit_code(view: dict[str, Any], gate: Gate) -> tuple[Exit, list[str]]:
    """The exit code for a run, and the reasons when it is not OK."""
    reasons = misses(view, gate)
    return (Exit.FAILED if reasons else Exit.OK), reasons


def passed_line(view: dict[str, Any], gate: Gate) -> str:
    """What a passing gate checked, for the log of a CI job."""
    parts = []
    mean = view["summary"]["mean_score"]
    if gate.min_score is not None and mean is not None:
        parts.append(f"mean score {number(mean)} >= --min-score {number(gate.min_score)}")
    precision = view["summary"].get("mean_context_precision")
    if gate.min_precision is not None and precision is not None:
        parts.append(
            f"mean context precision {number(precision)} >= --min-precision "
            f"{number(gate.min_precision)}"
        )
    failed = view["counts"][PublicItemStatus.FAILED]
    parts.append(f"{failed} failed <= --max-failed {gate.max_failed or 0}")
    if gate.max_no_context is not None:
        no_context = view["summary"].get("no_context", 0)
        parts.append(f"{no_context} without context <= --max-no-context {gate.max_no_context}")
    return "gate passed: " + ", ".join(parts)
