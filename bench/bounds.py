"""How fast the in-process bounds and large computations are: the targets the unit tests used
to assert with a clock (they failed under load), measured here and printed against their
targets. `python -m bench --sections bounds`; asserts nothing."""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from recallq.core import context as ctx
from recallq.core.compare import ItemScores, compare
from recallq.core.redact import Redactor

Row = tuple[str, ...]
# each stage refers to the last one ten times: 10^12 copies of the item after 12 stages
_BOMB = " | ".join(["[" + ",".join(["@"] * 10) + "]"] * 12)
_ITEM = {
    "input": {"inputMessages": []},
    "output": [{"id": "m", "role": "assistant", "content": "doc " * 250, "createdAt": "t"}],
}


def _timed(work: Callable[[], Any]) -> tuple[float, int]:
    """Seconds of one call, and the peak traced bytes of another (tracemalloc slows it)."""
    started = time.perf_counter()
    work()
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    try:
        work()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return elapsed, peak


def _refused(expression: str) -> Callable[[], None]:
    def search() -> None:
        try:
            ctx.search(expression, _ITEM, ctx.DEFAULT_LIMITS)
        except ctx.ContextError:
            return
        raise AssertionError(f"{expression[:40]}... was not refused")

    return search


def _large_comparison() -> None:
    rng = random.Random(9)
    base = [round(rng.random(), 2) for _ in range(50_000)]
    candidate = [round(min(1.0, max(0.0, s + rng.gauss(0.02, 0.2))), 2) for s in base]
    compare(
        [ItemScores(f"k{i}", s) for i, s in enumerate(base)],
        [ItemScores(f"k{i}", s) for i, s in enumerate(candidate)],
        scale=1,
    )


def _shared_json() -> None:
    value: Any = "x" * 100
    for _ in range(40):  # 2^40 copies by reference
        value = [value, value]
    try:
        ctx.bounded_json(value, 10_000)
    except ctx.ValueTooLarge:
        return


def _redactions() -> None:
    redactor = Redactor([f"configured-secret-{n:04d}" for n in range(20)])
    message = "litellm.ServiceUnavailableError: OpenAIException - Error code: 503 - upstream"
    for _ in range(2000):
        redactor(message)


def _token_runs() -> None:
    runs = ["a" * 50_000, "Bearer " + "b" * 50_000, "eyJ" + "c" * 50_000, "sk-" * 20_000]
    runs += [separated * 25_000 for separated in ("d_", "e.", "f:", "g-", "h@", "i/")]
    Redactor([])(" ".join(runs))


def rows() -> list[Row]:
    cases: list[tuple[str, Callable[[], Any], float, float | None]] = [
        # what, work, target seconds, target peak MiB
        ("JMESPath bomb refused (size limit)", _refused(_BOMB), 2.0, 30.0),
        ("2^40 shared JSON refused", _shared_json, 0.5, None),
        ("compare 50k pairs (normal interval)", _large_comparison, 1.0, None),
        ("2000 redactions of a provider error", _redactions, 0.4, None),
        ("redaction of 600 kB of token runs (no backtracking)", _token_runs, 1.0, None),
    ]
    table: list[Row] = [("what", "seconds", "target s", "peak MiB", "target MiB")]
    for what, work, target, target_mib in cases:
        seconds, peak = _timed(work)
        table.append(
            (
                what,
                f"{seconds:.3f}",
                f"< {target:g}",
                f"{peak / 2**20:.1f}",
                "-" if target_mib is None else f"< {target_mib:g}",
            )
        )
    return table
