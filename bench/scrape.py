"""What a Prometheus scrape of GET /metrics costs the API while a large run is scored.

The API's CPU (psutil) is compared between windows of the same length with and without
scrapes, alternating, while two workers score the run (the API answers the run's status polls
in both). The work-waiting query is cached for recallq.observability.gauges.CACHE_SECONDS, so
scrapes are timed at Prometheus's shortest usual interval (1 s: one in five runs the query) and,
apart, the query itself (uncached) from this process against the same database.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from functools import partial
from typing import Any

import httpx

from bench import harness
from recallq.execution import work
from recallq.observability import gauges as metrics_state
from recallq.state.db import Database

WINDOW_S = 5.0


def _api_cpu_window(api: Any, url: str | None, interval: float) -> tuple[float, int]:
    """API CPU seconds over one window, scraping every `interval` s when `url` is given."""
    before = harness.cpu_seconds([api])
    scrapes, started = 0, time.monotonic()
    while time.monotonic() - started < WINDOW_S:
        if url is not None:
            response = httpx.get(f"{url}/metrics", timeout=10)
            assert response.status_code == 200, response.text
            scrapes += 1
        time.sleep(interval if url is not None else 0.05)
    return harness.cpu_seconds([api]) - before, scrapes


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with harness.environment(args.big_latency_ms) as env:
        procs = [harness.start_worker(env["env"], args.big_concurrency) for _ in range(2)]
        api, url = harness.start_api(env["env"])
        path = harness.ndjson_file(args.scrape_items, "scrape", env["dir"])
        run_id, _ = harness.submit_file(url, path)
        done = threading.Event()
        poller = threading.Thread(target=lambda: (harness.wait(url, run_id), done.set()))
        poller.start()
        quiet: list[float] = []
        scraped: list[float] = []
        count = 0
        size = len(httpx.get(f"{url}/metrics", timeout=10).content)
        while not done.is_set() and len(scraped) < args.scrape_rounds:
            cpu, _ = _api_cpu_window(api, None, 0)
            quiet.append(cpu)
            cpu, n = _api_cpu_window(api, url, args.scrape_interval)
            scraped.append(cpu)
            count += n
        rounds = len(scraped)
        waiting_query = _uncached_query_ms(env["db"])
        poller.join()
        for p in [api, *procs]:
            p.stop()
    extra = (sum(scraped) - sum(quiet)) / max(count, 1) * 1000
    return {
        "items": args.scrape_items,
        "rounds": rounds,
        "scrapes": count,
        "interval": args.scrape_interval,
        "quiet_ms": statistics.mean(quiet) * 1000 / WINDOW_S if quiet else 0.0,
        "extra_ms": extra,
        "query_ms": waiting_query,
        "bytes": size,
    }


def _uncached_query_ms(database_url: str) -> float:
    """The work-waiting read (metrics_state.WorkCollector) run here, uncached, median of 20."""
    collector = metrics_state.WorkCollector(
        partial(work.read_work, Database(database_url)), lambda: [harness.MODEL]
    )
    times = []
    for _ in range(20):
        started = time.perf_counter()
        list(collector._read())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)
