"""Helpers for the fault-injection tests: unique items, submission, and direct database checks."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import create_engine, text


def make_items(tag: str, n: int, marked: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Items with unique ground truths (no claim-cache hits) that score 1 against the stub."""
    items = []
    for i in range(n):
        first = f"Sample {tag}{i} contains element alpha{tag}{i}"
        second = f"Sample {tag}{i} weighs {i + 10} grams"
        marker = (marked or {}).get(i, "")
        items.append(
            {
                "id": f"{tag}-{i}",
                "ground_truth": f"{first}. {second}. {marker}".strip(),
                "context": [f"{first} and more.", f"{second} exactly."],
            }
        )
    return items


def submit(api: str, items: list[dict[str, Any]], **fields: Any) -> str:
    response = httpx.post(f"{api}/v1/runs", json={"model": "stub-judge", **fields, "items": items})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def calls_for_tag(stub, tag: str) -> list[dict[str, Any]]:
    return [c for c in stub.calls() if c["data"] and f"Sample {tag}" in json.dumps(c["data"])]


def answered_calls(stub, tag: str) -> list[dict[str, Any]]:
    """The calls of items tagged `tag` that the stub answered (what the provider billed)."""
    return [c for c in calls_for_tag(stub, tag) if c["status"] == 200]


def settled_run(
    api: str,
    run_id: str,
    expected: Callable[[], int],
    counted: Callable[[dict[str, Any]], int] = lambda run: run["usage"]["llm_calls"],
    quiet_s: float = 3.0,
) -> dict[str, Any]:
    """The run once what it `counted` (by default its calls) is what the provider says it
    should be (`expected`, by default the stub's count of answered calls), or else once
    neither has changed for `quiet_s`: usage can land after the run completed (a refused write
    of a worker that went on after a pause or was taken for dead, usage kept through a
    database outage and written at the next heartbeat)."""

    def read() -> dict[str, Any]:
        return dict(httpx.get(f"{api}/v1/runs/{run_id}", timeout=30).json())

    return settled(read, expected, counted, quiet_s)


def settled(
    read: Callable[[], dict[str, Any]],
    expected: Callable[[], int],
    counted: Callable[[dict[str, Any]], int] = lambda run: run["usage"]["llm_calls"],
    quiet_s: float = 3.0,
    within_s: float = 120.0,
) -> dict[str, Any]:
    """settled_run for a run `read` some other way."""
    last: tuple[int, int] | None = None
    since = time.monotonic()
    deadline = since + within_s
    while True:
        run = read()
        seen = (counted(run), expected())
        if seen[0] == seen[1] or time.monotonic() > deadline:
            return run
        if seen != last:
            last, since = seen, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return run
        time.sleep(0.3)


def attempts_per_request(calls: list[dict[str, Any]]) -> Counter:
    """How often the same request (schema + data) reached the stub."""
    return Counter((c["schema"], json.dumps(c["data"], sort_keys=True)) for c in calls)


def item_rows(database_url: str, run_id: str) -> list[dict[str, Any]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            items = (
                conn.execute(
                    text(
                        "SELECT id, key, status, score, claims_total, llm_calls, error "
                        "FROM items WHERE run_id = :run ORDER BY idx"
                    ),
                    {"run": run_id},
                )
                .mappings()
                .all()
            )
            claims = conn.execute(
                text(
                    "SELECT c.item_id, c.idx FROM claims c JOIN items i ON i.id = c.item_id "
                    "WHERE i.run_id = :run"
                ),
                {"run": run_id},
            ).all()
    finally:
        engine.dispose()
    by_item: dict[int, list[int]] = defaultdict(list)
    for item_id, idx in claims:
        by_item[item_id].append(idx)
    return [{**row, "claim_indices": sorted(by_item[row["id"]])} for row in items]


def assert_exactly_once(
    database_url: str,
    run: dict[str, Any],
    answered: list[dict[str, Any]],
    crashed: bool = False,
    repeated: bool = False,
) -> list[dict[str, Any]]:
    """Every item scored, each with one set of claims, and usage that counts every call the
    provider answered for the run (`answered`, from the stub) exactly once (a packed extraction
    call is counted on one of its items). When calls were made again (`repeated`: a restart
    of Redis or Postgres under the run), each still counts: the usage is still the stub's
    count. When workers `crashed` (SIGKILL), calls in flight in a killed worker are counted
    nowhere: the usage is at most the stub's count."""
    rows = item_rows(database_url, run["id"])
    assert run["status"] == "completed"
    assert [r["status"] for r in rows] == ["succeeded"] * len(rows), [
        (r["key"], r["status"], r["error"]) for r in rows if r["status"] != "succeeded"
    ]
    for row in rows:
        assert row["claim_indices"] == list(range(row["claims_total"])), row
        assert row["score"] == 1.0, row
    assert run["counts"]["succeeded"] == run["counts"]["total"] == len(rows)
    answered_ok = [c for c in answered if c["status"] == 200]
    attributions = [c for c in answered_ok if c["schema"] == "claim_attribution"]
    if not (crashed or repeated):
        assert len(attributions) == len(rows)  # one per item: no second attribution call
    stored = sum(r["llm_calls"] for r in rows)
    assert stored == run["usage"]["llm_calls"]
    assert all(r["llm_calls"] >= 1 for r in rows), rows
    if crashed:
        assert stored <= len(answered_ok)
    else:
        assert stored == len(answered_ok)
    assert run["summary"]["claims_total"] == sum(r["claims_total"] for r in rows)
    return rows


def wait_until(predicate, timeout: float = 60, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError("condition not met")


def progress(api: str, run_id: str) -> int:
    counts = httpx.get(f"{api}/v1/runs/{run_id}").json()["counts"]
    return counts["succeeded"] + counts["failed"]
