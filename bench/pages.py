"""The viewer's pages on 100k-item runs: `python -m bench --sections pages`.

Two completed runs of the same 100k items (about 3 claims each, metadata, 1% failed) are
written straight into a fresh Postgres database with COPY, as the workers would have left
them (scoring 100k items for real takes half an hour: the `big` section does that), then
VACUUM ANALYZEd as autovacuum would soon after such a load. The API serves them (keys off, as
every bench section runs); each page and its /v1 twin is requested over HTTP: first with no view of
the runs kept (recallq.state.kept: the first view of a completed run computes it), then warmed up
and timed (median and p95, the views kept), against the issue's bound of 300 ms.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from bench import harness

BOUND_MS = 300.0
CATEGORIES = ("science", "history", "geography", "sport", "music")
SUBJECTS = ("Marie Curie", "the Eiffel Tower", "the Amazon", "Ada Lovelace", "the Danube")
WORDS = [
    "archive",
    "record",
    "survey",
    "report",
    "letter",
    "museum",
    "journal",
    "census",
    "atlas",
    "chronicle",
    "register",
    "catalogue",
    "almanac",
    "ledger",
    "gazette",
    "bulletin",
    "digest",
    "review",
    "notebook",
    "index",
]
ITEM_COLUMNS = (
    "id, run_id, idx, key, input, output, ground_truth, contexts, metadata, status, score, "
    "claims_total, claims_attributed, reason, error, attempts, llm_calls, prompt_tokens, "
    "completion_tokens, cost_usd, cache_hits, call_attempts, failed_calls, deferrals, "
    "extraction_calls, extraction_prompt_tokens, extraction_completion_tokens, "
    "extraction_cost_usd, started_at, finished_at"
)


@dataclass(frozen=True)
class Timing:
    label: str
    path: str
    first_ms: float  # the first request, no view of the runs kept yet
    median_ms: float
    p95_ms: float
    requests: int
    status: str  # of the last answer, or the error that ended the measurement
    size_kb: float


def _facts(i: int, rng: random.Random) -> list[str]:
    subject = SUBJECTS[i % len(SUBJECTS)]
    return [
        f"In {1800 + rng.randrange(220)} the {rng.choice(WORDS)} of {subject} named item {i} "
        f"among {rng.randrange(2, 900)} entries of the {rng.choice(WORDS)}."
        for _ in range(3)
    ]


def _item_rows(
    run_id: str, n: int, first_id: int, seed: int, finished: datetime
) -> Iterator[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    """(item row, its claim rows) for items q0..q{n-1}: realistic sizes (a question, an
    answer, three facts, three passages of ~300 characters), one percent failed."""
    rng = random.Random(seed)
    for i in range(n):
        facts = _facts(i, random.Random(i))  # the same ground truth in both runs
        found = [rng.random() < 0.7 for _ in facts]
        passages = [
            f"{fact} " + " ".join(rng.choice(WORDS) for _ in range(30))
            if hit
            else " ".join(rng.choice(WORDS) for _ in range(40))
            for fact, hit in zip(facts, found, strict=True)
        ]
        failed = rng.random() < 0.01
        score = None if failed else round(sum(found) / 3, 2)
        metadata = {"category": CATEGORIES[i % len(CATEGORIES)], "source": f"doc-{i % 997}"}
        item_id = first_id + i
        row = (
            item_id,
            run_id,
            i,
            f"q{i}",
            json.dumps(f"What does the record say about item {i}?"),
            json.dumps(f"Item {i} is listed in the {rng.choice(WORDS)}."),
            " ".join(facts),
            json.dumps(passages),
            json.dumps(metadata),
            "failed" if failed else "succeeded",
            score,
            None if failed else 3,
            None if failed else sum(found),
            None if failed else f"{sum(found)} of 3 claims supported",
            "BadRequestError: the provider refused the request" if failed else None,
            1,
            2,
            900,
            120,
            0.0009,
            0,
            2,
            0,
            0,
            1,
            250,
            60,
            0.0003,
            finished - timedelta(seconds=2),
            finished,
        )
        claims = (
            []
            if failed
            else [
                (
                    item_id * 3 + j,
                    item_id,
                    j,
                    fact.rstrip("."),
                    "yes" if hit else "no",
                    json.dumps([j] if hit else []),
                    f"passage {j} states it" if hit else "no passage states it",
                )
                for j, (fact, hit) in enumerate(zip(facts, found, strict=True))
            ]
        )
        yield row, claims


def seed_run(conn: psycopg.Connection[Any], n: int, name: str, seed: int, first_id: int) -> str:
    """A completed run of n items with their claims, written with COPY; its id."""
    run_id = str(uuid.uuid4())
    finished = datetime.now(UTC)
    conn.execute(
        "INSERT INTO runs (id, project, name, model, scale, status, total_items, mode, "
        "created_at, started_at, finished_at) VALUES "
        "(%s, 'default', %s, 'stub-judge', 1.0, 'completed', %s, 'online', %s, %s, %s)",
        (
            run_id,
            name,
            n,
            finished - timedelta(hours=1),
            finished - timedelta(minutes=59),
            finished,
        ),
    )
    claim_rows: list[tuple[Any, ...]] = []
    with conn.cursor().copy(f"COPY items ({ITEM_COLUMNS}) FROM STDIN") as copy:
        for row, claims in _item_rows(run_id, n, first_id, seed, finished):
            copy.write_row(row)
            claim_rows.extend(claims)
    columns = "id, item_id, idx, text, verdict, context_indices, reason"
    with conn.cursor().copy(f"COPY claims ({columns}) FROM STDIN") as copy:
        for claim in claim_rows:
            copy.write_row(claim)
    return run_id


def seed(database_url: str, n: int) -> tuple[str, str, float]:
    """Two runs (base, candidate) of the same n items; their ids and the seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        base = seed_run(conn, n, "retriever-a", seed=1, first_id=1)
        candidate = seed_run(conn, n, "retriever-b", seed=2, first_id=n + 1)
        for table in ("items", "claims"):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )
        conn.commit()
        conn.autocommit = True
        # what autovacuum does soon after a load of inserts (Postgres 13 on vacuums tables
        # after inserts too): the statistics, and the visibility map that lets a query read
        # an index alone (comparing two runs pairs their items from one)
        conn.execute("VACUUM ANALYZE runs")
        conn.execute("VACUUM ANALYZE items")
        conn.execute("VACUUM ANALYZE claims")
    return base, candidate, time.perf_counter() - started


def forget_kept_views(database_url: str) -> None:
    """Delete every kept view (recallq.state.kept), so that the next request computes its view."""
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("DELETE FROM kept_views")


def time_get(
    url: str, database_url: str, label: str, path: str, requests: int, budget_s: float
) -> Timing:
    """The first request with no view kept, a warm-up one, then up to `requests` timed ones
    (at least 5, within budget_s), on one kept-alive connection. A request that fails ends
    the page's measurement."""
    samples: list[float] = []
    first_ms = float("nan")
    status = "-"
    size_kb = 0.0
    with httpx.Client(base_url=url, timeout=120) as client:
        try:
            forget_kept_views(database_url)
            began = time.perf_counter()
            client.get(path)
            first_ms = (time.perf_counter() - began) * 1000
            client.get(path)
            started = time.perf_counter()
            while len(samples) < requests and (
                len(samples) < 5 or time.perf_counter() - started < budget_s
            ):
                began = time.perf_counter()
                response = client.get(path)
                samples.append((time.perf_counter() - began) * 1000)
                status, size_kb = str(response.status_code), len(response.content) / 1024
        except httpx.HTTPError as exc:
            status = type(exc).__name__
    if not samples:
        return Timing(label, path, first_ms, float("nan"), float("nan"), 0, status, 0.0)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    median = statistics.median(samples)
    return Timing(label, path, first_ms, median, p95, len(samples), status, size_kb)


def measure(n: int, requests: int, budget_s: float) -> dict[str, Any]:
    with harness.environment(latency_ms=0) as env:
        base, candidate, seconds = seed(env["db"], n)
        api, url = harness.start_api(env["env"])
        item = f"q{n // 2}"
        pairs = f"base={base}&candidate={candidate}"
        paths = [
            ("runs page", "/"),
            ("run page", f"/runs/{candidate}"),
            ("items page, first", f"/runs/{candidate}/items"),
            ("items page, score 0.3-0.7", f"/runs/{candidate}/items?min_score=0.3&max_score=0.7"),
            ("items page, sorted by score", f"/runs/{candidate}/items?sort=score"),
            ("items page, text in most items", f"/runs/{candidate}/items?q=chronicle"),
            ("items page, text in one item", f"/runs/{candidate}/items?q=item+{n - 7}+among"),
            ("item page", f"/runs/{candidate}/items/{item}"),
            ("compare page (two runs)", f"/compare?{pairs}"),
            ("compare item page", f"/compare/items/{item}?{pairs}"),
            ("GET /v1/runs", "/v1/runs"),
            ("GET /v1/runs/{id}", f"/v1/runs/{candidate}"),
            ("GET /v1/runs/{id}/items", f"/v1/runs/{candidate}/items"),
            ("GET /v1/runs/{id}/items/{item}", f"/v1/runs/{candidate}/items/{item}"),
            ("GET /v1/compare", f"/v1/compare?{pairs}"),
        ]
        try:
            timings = [
                time_get(url, env["db"], label, path, requests, budget_s) for label, path in paths
            ]
        finally:
            api.stop()
        if any(not t.status.isdigit() for t in timings):
            print(f"  the API's log ends with:\n{api.output()[-2000:]}", flush=True)
    return {"seed_s": seconds, "timings": timings}
