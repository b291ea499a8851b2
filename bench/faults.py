"""Fault-injection scenario: `python -m bench.faults`. Prints a table; asserts nothing.

A larger run against a stub that answers 10% of calls with 429 (Retry-After) and 5% with 500,
while two worker processes are SIGKILLed mid-run and replaced, and Redis restarts once.
Lost (items that never ended) and duplicated (items with a second set of claims, or usage
counted twice) must both be 0.
"""

from __future__ import annotations

import argparse
import time

from sqlalchemy import create_engine, text

from bench import harness
from tests.services import redis_server

FAULT_ENV = {
    "RECALLQ_MAX_ATTEMPTS": "8",
    "RECALLQ_RETRY_BASE_DELAY": "0.1",
    "RECALLQ_RETRY_MAX_DELAY": "5",
    "RECALLQ_REAPER_INTERVAL": "2",
    "RECALLQ_HEARTBEAT_TTL": "6",
    "RECALLQ_QUEUE_LEASE_SECONDS": "20",
}


def audit(database_url: str, run_id: str) -> dict[str, int]:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        row = conn.execute(
            text(
                """
                SELECT count(*) AS submitted,
                       count(*) FILTER (WHERE i.status = 'succeeded') AS scored,
                       count(*) FILTER (WHERE i.status = 'failed') AS failed,
                       count(*) FILTER (WHERE i.status NOT IN ('succeeded', 'failed', 'cancelled'))
                           AS lost,
                       count(*) FILTER (WHERE i.status = 'succeeded' AND (
                           coalesce(c.n, 0) <> i.claims_total OR i.llm_calls <> 2)) AS duplicated,
                       max(i.attempts) AS max_takes
                FROM items i
                LEFT JOIN (SELECT item_id, count(*) AS n FROM claims GROUP BY item_id) c
                       ON c.item_id = i.id
                WHERE i.run_id = :run
                """
            ),
            {"run": run_id},
        ).one()
    engine.dispose()
    return dict(row._mapping)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--latency-ms", type=float, default=50)
    parser.add_argument("--verbose", action="store_true", help="print progress every 5 s")
    args = parser.parse_args()
    with harness.environment(args.latency_ms, **FAULT_ENV) as env:
        env["stub"].configure(rate_429=0.10, rate_500=0.05, retry_after_s="1")
        api, url = harness.start_api(env["env"])
        workers = [harness.start_worker(env["env"], 16) for _ in range(2)]
        started = time.perf_counter()
        run_id, _ = harness.submit_file(url, harness.ndjson_file(args.items, "f", env["dir"]))
        events = []
        for fraction, action in ((0.2, "kill"), (0.4, "redis"), (0.6, "kill")):
            while _progress(url, run_id) < fraction * args.items:
                time.sleep(0.2)
            if args.verbose:
                print(f"  {time.perf_counter() - started:6.1f}s  {action}", flush=True)
            if action == "kill":
                workers.pop(0).kill()
                workers.append(harness.start_worker(env["env"], 16))
                events.append(f"SIGKILL a worker at {fraction:.0%}")
            else:
                redis_server().restart()
                events.append(f"Redis restarted (data lost) at {fraction:.0%}")
        while (done := _progress(url, run_id)) < args.items and args.verbose:
            print(f"  {time.perf_counter() - started:6.1f}s  {done} ended", flush=True)
            time.sleep(5)
        run = harness.wait(url, run_id)
        elapsed = time.perf_counter() - started
        result = audit(env["db"], run_id)
        stats = env["stub"].stats()
        for p in [api, *workers]:
            p.stop()
    print(
        f"\nFault injection: {args.items} items, stub latency {args.latency_ms:.0f} ms, "
        "10% 429 + 5% 500, 2 workers x 16 threads"
    )
    for event in events:
        print(f"  - {event}")
    header = ("submitted", "scored", "failed", "lost", "duplicated", "run status", "seconds")
    values = (
        result["submitted"],
        result["scored"],
        result["failed"],
        result["lost"],
        result["duplicated"],
        run["status"],
        f"{elapsed:.0f}",
    )
    widths = [max(len(str(h)), len(str(v))) for h, v in zip(header, values, strict=True)]
    print("  " + "  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  " + "  ".join("-" * w for w in widths))
    print("  " + "  ".join(str(v).ljust(w) for v, w in zip(values, widths, strict=True)))
    print(
        f"  stub answers by status: {stats['by_status']}; most takes of one item: "
        f"{result['max_takes']}"
    )


def _progress(url: str, run_id: str) -> int:
    import httpx

    counts = httpx.get(f"{url}/v1/runs/{run_id}", timeout=30).json()["counts"]
    return counts["succeeded"] + counts["failed"]


if __name__ == "__main__":
    main()
