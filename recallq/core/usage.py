"""What judge calls used: the one usage value every layer counts, stores and reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    """What judge calls used. A value: calls add up with `+`.

    `llm_calls` and the tokens and cost count what the provider answered (what is billed);
    `call_attempts` counts every request sent, `failed_calls` those answered with an error or
    not at all (timeouts, connection errors)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    call_attempts: int = 0
    failed_calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.llm_calls + other.llm_calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost_usd + other.cost_usd,
            self.call_attempts + other.call_attempts,
            self.failed_calls + other.failed_calls,
        )

    def __sub__(self, other: Usage) -> Usage:
        """What this used beyond `other` (a part of it); a cost never goes below 0 (float
        sums of the same costs can differ in their last digits)."""
        return Usage(
            self.llm_calls - other.llm_calls,
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
            max(0.0, self.cost_usd - other.cost_usd),
            self.call_attempts - other.call_attempts,
            self.failed_calls - other.failed_calls,
        )

    def spent(self) -> dict[str, Any]:
        """What a view shows of it: what the provider answered, and its cost (to the micro-$)."""
        return {
            "llm_calls": self.llm_calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost_usd, 6),
        }


NO_USAGE = Usage()
