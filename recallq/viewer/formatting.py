"""How the pages write numbers and times (Jinja2 filters). The raw value always goes in a
data attribute as well; these are only for reading."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from recallq.core.scoring import format_score


def score(value: float | None) -> str:
    return "–" if value is None else format_score(value)


def mean(value: float | None) -> str:
    """A mean or a difference: up to 4 decimals, as the API rounds them."""
    if value is None:
        return "–"
    return f"{value:.4f}".rstrip("0").rstrip(".") or "0"


def signed(value: float | None) -> str:
    """A difference with its sign: +0.25, -0.125, 0."""
    text = mean(value)
    return text if value is None or text == "0" or text.startswith("-") else f"+{text}"


def cost(value: float | None) -> str:
    if value is None:
        return "–"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def spend(usage: Mapping[str, Any] | None) -> str:
    """The cost of a run's (or a stage's) usage. Calls that cost nothing were made to a model
    the models file gives no price: "not priced", not a "$0.0000" that reads as free; and no
    call at all (a stage the claim cache served, the lexical judge) is "no calls", not a
    "$0.0000" beside another stage's "not priced"."""
    if not usage:
        return "–"
    if not usage.get("cost_usd"):
        return "not priced" if usage.get("llm_calls") else "no calls"
    return cost(usage.get("cost_usd"))


def count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def when(value: str | None) -> str:
    """An ISO timestamp as `2026-11-30 19:23:05 UTC` (the pages' script shows it in the
    reader's zone). A timestamp without a zone is UTC: SQLite hands them back naive."""
    if not value:
        return "–"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def percent(part: int, whole: int) -> str:
    return "–" if not whole else f"{100 * part / whole:.0f}%"


def raw(value: Any) -> str:
    """A value for a data attribute: numbers as Python writes them, None as ''."""
    return "" if value is None else str(value)


FILTERS: dict[str, Callable[..., str]] = {
    "score": score,
    "mean": mean,
    "signed": signed,
    "cost": cost,
    "spend": spend,
    "count": count,
    "when": when,
    "percent": percent,
    "raw": raw,
}
