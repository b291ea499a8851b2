"""Fault-injection scenarios: `python -m bench.faults [--scenario crashes|outage]`. Prints a
table; asserts nothing.

crashes: a larger run against a stub that answers 10% of calls with 429 (Retry-After) and 5%
    with 500, while two worker processes are SIGKILLed mid-run and replaced, and Redis
    restarts once.
outage: the stub answers 10% of calls with 429 throughout; at a quarter of the run every call
    gets 503 for two minutes, and at 60% every call gets 429 (Retry-After 10) for 30 s.

Failed, lost (items that never ended) and duplicated (items with a second set of claims, or
usage counted twice: an item counts its attribution call and at most one packed extraction
call, which is counted on one item of its pack) must all be 0.
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
                           coalesce(c.n, 0) <> i.claims_total OR i.llm_calls NOT IN (1, 2)))
                           AS duplicated,
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


def crashes(args: argparse.Namespace) -> None:
    with harness.environment(args.latency_ms, **FAULT_ENV) as env:
        env["stub"].configure(rate_429=0.10, rate_500=0.05, retry_after_s="1")
        api, url = harness.start_api(env["env"])
        workers = [harness.start_worker(env["env"], 16) for _ in range(2)]
        started = time.perf_counter()
        run_id, _ = harness.submit_file(url, harness.ndjson_file(args.items, "f", env["dir"]))
        events = []
        for fraction, action in ((0.2, "kill"), (0.4, "redis"), (0.6, "kill")):
            _wait_for_progress(url, run_id, fraction * args.items)
            if args.verbose:
                print(f"  {time.perf_counter() - started:6.1f}s  {action}", flush=True)
            if action == "kill":
                workers.pop(0).kill()
                workers.append(harness.start_worker(env["env"], 16))
                events.append(f"SIGKILL a worker at {fraction:.0%}")
            else:
                redis_server().restart()
                events.append(f"Redis restarted (data lost) at {fraction:.0%}")
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
    _table(
        ("submitted", "scored", "failed", "lost", "duplicated", "run status", "seconds"),
        (*_outcome(result), run["status"], f"{elapsed:.0f}"),
    )
    print(
        f"  stub answers by status: {stats['by_status']}; most takes of one item: "
        f"{result['max_takes']}; calls counted in the run's usage: {run['usage']['llm_calls']} "
        "(answers a killed worker never read are not counted)"
    )


def outage(args: argparse.Namespace) -> None:
    """Provider incidents: calls sent while the provider is down, and how soon scoring
    resumes once it is back (bounded by the breaker's cool-down at that moment, plus the
    reaper's interval that sends the waiting items again)."""
    windows = []  # (name, start, seconds)
    with harness.environment(args.latency_ms, **FAULT_ENV) as env:
        stub = env["stub"]
        stub.configure(rate_429=0.10, retry_after_s="1")
        api, url = harness.start_api(env["env"])
        workers = [harness.start_worker(env["env"], 16) for _ in range(2)]
        started = time.perf_counter()
        run_id, _ = harness.submit_file(url, harness.ndjson_file(args.items, "o", env["dir"]))
        for fraction, seconds, status, retry_after in (
            (0.25, args.outage_s, 503, None),
            (0.60, 30.0, 429, "10"),
        ):
            _wait_for_progress(url, run_id, fraction * args.items)
            stub.outage(seconds, status=status, retry_after=retry_after)
            windows.append(
                (f"{status} for {seconds:.0f} s at {fraction:.0%}", time.time(), seconds)
            )
            if args.verbose:
                print(f"  {time.perf_counter() - started:6.1f}s  {windows[-1][0]}", flush=True)
            time.sleep(seconds)
        run = harness.wait(url, run_id)
        elapsed = time.perf_counter() - started
        result = audit(env["db"], run_id)
        calls = stub.calls()
        recovered = [
            _first_scored_after(env["db"], run_id, start + seconds) for _, start, seconds in windows
        ]
        for p in [api, *workers]:
            p.stop()
    print(
        f"\nProvider incidents: {args.items} items, stub latency {args.latency_ms:.0f} ms, "
        "10% 429 throughout, 2 workers x 16 threads, breaker cool-down 5 s doubling to 300 s, "
        f"reaper every {FAULT_ENV['RECALLQ_REAPER_INTERVAL']} s"
    )
    _table(
        ("submitted", "scored", "failed", "lost", "duplicated", "run status", "seconds"),
        (*_outcome(result), run["status"], f"{elapsed:.0f}"),
    )
    rows = []
    for (name, start, seconds), first in zip(windows, recovered, strict=True):
        during = [c for c in calls if start <= c["t"] < start + seconds]
        late = [c for c in during if c["t"] >= start + 5]
        rows.append(
            (
                name,
                str(len(during)),
                str(len(late)),
                "-" if first is None else f"{first - (start + seconds):.1f}",
            )
        )
    _table(
        (
            "incident",
            "calls sent during it",
            "of them after its first 5 s",
            "recovery to first score, s",
        ),
        *rows,
    )


def _first_scored_after(database_url: str, run_id: str, moment: float) -> float | None:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        first = conn.execute(
            text(
                "SELECT min(extract(epoch FROM finished_at)) FROM items "
                "WHERE run_id = :run AND status = 'succeeded' AND finished_at > to_timestamp(:t)"
            ),
            {"run": run_id, "t": moment},
        ).scalar()
    engine.dispose()
    return None if first is None else float(first)


def _outcome(result: dict[str, int]) -> tuple[int, ...]:
    return tuple(result[k] for k in ("submitted", "scored", "failed", "lost", "duplicated"))


def _table(header: tuple[str, ...], *rows: tuple[object, ...]) -> None:
    cells = [tuple(str(v) for v in row) for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--scenario", choices=["crashes", "outage"], default="crashes")
    parser.add_argument("--items", type=int, help="default: 3000 (crashes), 1000 (outage)")
    parser.add_argument("--latency-ms", type=float, default=50)
    parser.add_argument("--outage-s", type=float, default=120, help="the 503 outage (outage)")
    parser.add_argument("--verbose", action="store_true", help="print events as they happen")
    args = parser.parse_args()
    if args.scenario == "crashes":
        args.items = args.items or 3000
        crashes(args)
    else:
        args.items = args.items or 1000
        outage(args)


def _wait_for_progress(url: str, run_id: str, ended: float) -> None:
    while _progress(url, run_id) < ended:
        time.sleep(0.2)


def _progress(url: str, run_id: str) -> int:
    import httpx

    counts = httpx.get(f"{url}/v1/runs/{run_id}", timeout=30).json()["counts"]
    return counts["succeeded"] + counts["failed"]


if __name__ == "__main__":
    main()
