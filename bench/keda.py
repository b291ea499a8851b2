"""What the KEDA trigger's query (deploy/kubernetes/autoscaling.yaml) costs Postgres.

A migrated throwaway database gets a large items table: ended runs' items (what months of use
leave), one active run of many pending items with its window queued, and a few small active
runs. The query is timed as KEDA sends it (one connection, every call planned again), beside
the recallq_items_waiting gauge's own statement (recallq.execution.work.IN_FLIGHT_BY_MODEL),
once with the plan the statistics give and once with plain index scans turned off (the bitmap
scan the planner may pick when it expects few rows: it reads every matching entry of the
index before the LIMIT, the worst case of the query's one read of the items table).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg
import yaml
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from recallq.execution import work
from tests.services import REPO, migrated_database

ROUNDS = 40
ENDED_RUN_ITEMS = 1000


def keda_query() -> str:
    path = REPO / "deploy" / "kubernetes" / "autoscaling.yaml"
    scaled = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    query: str = trigger["metadata"]["query"]
    return query


def _fill(conn: psycopg.Connection[Any], ended_items: int, active_items: int) -> None:
    ended_runs = max(1, ended_items // ENDED_RUN_ITEMS)
    conn.execute(
        "INSERT INTO runs (id, project, model, scale, status, total_items, created_at, mode) "
        "SELECT 'ended-' || r, 'bench', 'local/lexical', 1, 'completed', %s, now(), 'online' "
        "FROM generate_series(1, %s) AS r",
        (ENDED_RUN_ITEMS, ended_runs),
    )
    conn.execute(
        "INSERT INTO items (run_id, idx, key, status, attempts, llm_calls, prompt_tokens, "
        "completion_tokens, cost_usd, cache_hits) "
        "SELECT 'ended-' || r, i, 'k' || i, 'succeeded', 1, 2, 0, 0, 0, 0 "
        "FROM generate_series(1, %s) AS r, generate_series(0, %s) AS i",
        (ended_runs, ENDED_RUN_ITEMS - 1),
    )
    sizes = [active_items, 1000, 1000, 100, 10]
    for size in sizes:
        run_id = str(uuid.uuid4())
        conn.execute(
            "INSERT INTO runs (id, project, model, scale, status, total_items, created_at, "
            "mode) VALUES (%s, 'bench', 'local/lexical', 1, 'running', %s, now(), 'online')",
            (run_id, size),
        )
        conn.execute(
            "INSERT INTO items (run_id, idx, key, status, attempts, llm_calls, prompt_tokens, "
            "completion_tokens, cost_usd, cache_hits) "
            "SELECT %s, i, 'k' || i, CASE WHEN i < 256 THEN 'queued' ELSE 'pending' END, "
            "0, 0, 0, 0, 0, 0 FROM generate_series(0, %s) AS i",
            (run_id, size - 1),
        )
    conn.execute("VACUUM ANALYZE runs")  # as autovacuum leaves a table of this size
    conn.execute("VACUUM ANALYZE items")


def _timed(conn: psycopg.Connection[Any], sql: str) -> tuple[float, float, Any]:
    """Median and 95th percentile in ms over ROUNDS (after a few to warm the cache), and the
    last answer."""
    for _ in range(5):
        conn.execute(sql).fetchall()
    times, answer = [], None
    for _ in range(ROUNDS):
        started = time.perf_counter()
        answer = conn.execute(sql).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1], answer


def _items_access(conn: psycopg.Connection[Any], sql: str) -> str:
    (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()  # type: ignore[misc]
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "items" or "Index Name" in node:
            found.append(node["Node Type"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return " + ".join(sorted(set(found)))


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    query = keda_query()
    gauge = str(
        work.IN_FLIGHT_BY_MODEL.compile(
            dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]
            compile_kwargs={"literal_binds": True},
        )
    )
    rows = []
    with migrated_database() as url:
        libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(libpq, autocommit=True) as conn:
            _fill(conn, args.keda_ended_items, args.keda_active_items)
            (total,) = conn.execute("SELECT count(*) FROM items").fetchone()  # type: ignore[misc]
            for plan in ("as planned", "no plain index scans"):
                if plan != "as planned":
                    conn.execute("SET enable_indexscan = off")
                    conn.execute("SET enable_indexonlyscan = off")
                median, p95, answer = _timed(conn, query)
                gauge_median, _, _ = _timed(conn, gauge)
                rows.append(
                    {
                        "items": total,
                        "plan": plan,
                        "access": _items_access(conn, query),
                        "pods": answer[0][0] if answer else None,
                        "median_ms": median,
                        "p95_ms": p95,
                        "gauge_ms": gauge_median,
                    }
                )
    return rows
