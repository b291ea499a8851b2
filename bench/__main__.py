"""recallq benchmark: `python -m bench` (see --help). Prints a table; asserts nothing.

Everything runs for real on this machine: Postgres, Redis, the API, Celery worker processes
and the stub LLM server (with a set latency) that they call over HTTP through litellm.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench import (
    bounds,
    calls,
    harness,
    keda,
    metrics,
    pages,
    percore,
    processes,
    scrape,
    startup,
    streams,
)

Row = tuple[str, ...]


def throughput(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    latency = args.latency_ms / 1000
    with harness.environment(args.latency_ms) as env:
        procs = [harness.start_worker(env["env"], args.concurrency) for _ in range(workers)]
        api, url = harness.start_api(env["env"])
        warm, _ = harness.submit_file(url, harness.ndjson_file(workers * 4, "warm", env["dir"]))
        harness.wait(url, warm)
        n = args.items * workers
        cpu_before = harness.cpu_seconds(procs)
        started = time.perf_counter()
        run_id, _ = harness.submit_file(url, harness.ndjson_file(n, f"t{workers}", env["dir"]))
        run = harness.wait(url, run_id)
        elapsed = time.perf_counter() - started
        cpu = harness.cpu_seconds(procs) - cpu_before
        calls = run["usage"]["llm_calls"] / n
        for p in [api, *procs]:
            p.stop()
    # each item holds a worker thread for one latency per call it makes (packed: 1/8 + 1)
    bound = workers * args.concurrency / latency / calls
    return {
        "workers": workers,
        "items_per_s": n / elapsed,
        "bound": bound,
        "cpu_ms": cpu / n * 1000,
        "calls_per_item": calls,
        "failed": run["counts"]["failed"],
    }


def cpu_split(args: argparse.Namespace) -> dict[str, float]:
    """Worker CPU per item on one worker, with the stub judge (HTTP calls through litellm,
    extraction packed) and with the offline local/lexical judge (the same queue and database
    work, no HTTP)."""
    result = {}
    with harness.environment(args.big_latency_ms, transport=args.cpu_transport) as env:
        procs = [harness.start_worker(env["env"], args.big_concurrency)]
        api, url = harness.start_api(env["env"])
        for model in (harness.MODEL, "local/lexical"):
            warm, _ = harness.submit_file(url, harness.ndjson_file(8, "w" + model[:5], env["dir"]))
            harness.wait(url, warm)
            n = args.cpu_items
            path = harness.ndjson_file(n, "cpu" + model[:5], env["dir"])
            before = harness.cpu_seconds(procs)
            run = harness.wait(url, harness.submit_file(url, path, model=model)[0])
            result[model] = (harness.cpu_seconds(procs) - before) / n * 1000
            if model == harness.MODEL:
                result["calls_per_item"] = run["usage"]["llm_calls"] / n
        result["raw_ms"] = metrics.raw_http_cpu_ms(env["stub"].base_url)
        result["litellm_ms"] = metrics.litellm_cpu_ms(env["stub"].base_url)
        for p in [api, *procs]:
            p.stop()
    return result


def rate_limited(args: argparse.Namespace) -> dict[str, Any]:
    with harness.environment(50, rpm=args.rpm) as env:
        env["stub"].configure(rpm_limit=args.rpm)
        # one `recallq worker` command with its defaults: a process per CPU, each with the
        # default threads, under one limit
        worker = harness.Process(["worker"], env["env"], "worker")
        worker.wait_for_output(" ready.", timeout=180)
        procs = [worker]
        api, url = harness.start_api(env["env"])
        n = int(args.rpm / 60 / 2 * args.rate_window)  # items for about rate_window seconds
        run_id, _ = harness.submit_file(url, harness.ndjson_file(n, "rl", env["dir"]))
        run = harness.wait(url, run_id)
        rate, accepted, refused = metrics.accepted_rate_per_minute(env["stub"].calls())
        for p in [api, *procs]:
            p.stop()
    return {"rate": rate, "accepted": accepted, "refused": refused, "scored": run["counts"]}


# RAGAS (context recall, one LLM call per item, its own asyncio concurrency, no shared limiter)
# measured on the same setup: one stub judge enforcing 300 requests/minute, the same 400 items.
# Source: the side-by-side run that opened issue "Fewer and cheaper judge calls" (RAGAS is not
# installed here; these are its figures, passed in as constants).
RAGAS_ITEMS_PER_MIN = 237
RAGAS_REFUSED, RAGAS_CALLS, RAGAS_LOST = 127, 527, 1


def under_a_provider_limit(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A first run (packed extraction) and a re-run (claim cache) of the same items under a
    provider limit the stub enforces, with recallq's limiter set to it."""
    rows = []
    with harness.environment(args.big_latency_ms, rpm=args.ragas_rpm) as env:
        env["stub"].configure(rpm_limit=args.ragas_rpm)
        # one `recallq worker` command with its defaults: a process per CPU, each with the
        # default threads, under one limit
        worker = harness.Process(["worker"], env["env"], "worker")
        worker.wait_for_output(" ready.", timeout=180)
        procs = [worker]
        api, url = harness.start_api(env["env"])
        path = harness.ndjson_file(args.ragas_items, "rl", env["dir"])
        for label in ("first run", "re-run"):
            env["stub"].reset()
            started = time.perf_counter()
            run = harness.wait(url, harness.submit_file(url, path)[0])
            elapsed = time.perf_counter() - started
            calls = env["stub"].calls()
            n = args.ragas_items
            rows.append(
                {
                    "label": label,
                    "items_per_min": n / elapsed * 60,
                    "calls_per_item": run["usage"]["llm_calls"] / n,
                    "prompt_tokens": run["usage"]["prompt_tokens"] / n,
                    "refused": sum(1 for c in calls if c["status"] == 429),
                    "sent": len(calls),
                    "lost": n - run["counts"]["succeeded"],
                }
            )
        for p in [api, *procs]:
            p.stop()
    return rows


def claim_cache(args: argparse.Namespace) -> tuple[float, float, int]:
    """Calls per item on a first run and on a re-run of the same eval set."""
    with harness.environment(args.big_latency_ms) as env:
        procs = [harness.start_worker(env["env"], args.concurrency) for _ in range(2)]
        api, url = harness.start_api(env["env"])
        path = harness.ndjson_file(args.cache_items, "cache", env["dir"])
        first = harness.wait(url, harness.submit_file(url, path)[0])
        again = harness.wait(url, harness.submit_file(url, path)[0])
        for p in [api, *procs]:
            p.stop()
    n = args.cache_items
    return (
        first["usage"]["llm_calls"] / n,
        again["usage"]["llm_calls"] / n,
        again["usage"]["claim_cache_hits"],
    )


def submission_and_big_run(args: argparse.Namespace) -> dict[str, Any]:
    """NDJSON submissions (10k, 100k) measured at the API; the big run's submission is one of
    them, scored by two workers that were running all along, then read back."""
    import httpx

    results: dict[str, Any] = {}
    with harness.environment(args.big_latency_ms) as env:
        api, url = harness.start_api(env["env"])
        procs = [harness.start_worker(env["env"], args.big_concurrency) for _ in range(2)]
        warm, _ = harness.submit_file(url, harness.ndjson_file(8, "warm", env["dir"]))
        harness.wait(url, warm)  # litellm loaded in both workers before anything is timed
        sizes = sorted(set(args.submit_sizes) | ({args.big} if args.big else set()))
        for size in sizes:
            path = harness.ndjson_file(size, f"s{size}", env["dir"])
            memory = metrics.PeakMemory(api.proc.pid)
            if size == args.big:
                cpu_before = harness.cpu_seconds(procs)
            run_id, seconds = harness.submit_file(url, path)
            growth = memory.stop()
            results.setdefault("submissions", []).append((size, seconds, growth))
            print(f"  (submitted {size} items: {seconds:.1f} s, API +{growth:.1f} MB)", flush=True)
            if size == args.big:
                big_id = run_id
            else:  # only its submission is measured
                httpx.post(f"{url}/v1/runs/{run_id}/cancel", timeout=120)
                results["reads"] = (size, metrics.read_latencies(url, run_id))
        if args.big:
            big_run = harness.wait(url, big_id)
            cpu = harness.cpu_seconds(procs) - cpu_before
            results["big"] = metrics.item_latencies(env["db"], big_id) | {
                "counts": big_run["counts"],
                "cpu_ms": cpu / args.big * 1000,
                "calls": big_run["usage"]["llm_calls"] / args.big,
            }
            # reads of the scored run: every item with its claims
            results["reads"] = (args.big, metrics.read_latencies(url, big_id))
        for p in [api, *procs]:
            p.stop()
    return results


def print_table(title: str, rows: list[Row]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\n{title}")
    for i, row in enumerate(rows):
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--latency-ms", type=float, default=500, help="stub latency")
    parser.add_argument("--items", type=int, default=300, help="items per worker, throughput")
    parser.add_argument("--rpm", type=int, default=1200, help="provider limit scenario")
    parser.add_argument("--rate-window", type=float, default=45, help="seconds at the limit")
    parser.add_argument("--cache-items", type=int, default=300)
    parser.add_argument("--big", type=int, default=100_000, help="items of the big run (0: skip)")
    parser.add_argument("--submit-sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--cpu-items", type=int, default=2000, help="items per judge, cpu")
    parser.add_argument(
        "--cpu-transport", choices=["auto", "litellm"], default="auto", help="the stub's lane, cpu"
    )
    parser.add_argument("--ragas-rpm", type=int, default=300, help="limit of the RAGAS setup")
    parser.add_argument("--ragas-items", type=int, default=400)
    parser.add_argument("--pages-items", type=int, default=100_000, help="items per run, pages")
    parser.add_argument("--pages-requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--scrape-items", type=int, default=10_000, help="run while scraping")
    parser.add_argument("--scrape-rounds", type=int, default=6, help="5 s windows of each kind")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="s between scrapes")
    parser.add_argument("--keda-ended-items", type=int, default=1_000_000, help="keda: ended")
    parser.add_argument("--keda-active-items", type=int, default=200_000, help="keda: biggest")
    sections = ["throughput", "cpu", "limit", "ragas", "cache", "big", "pages", "scrape", "streams"]
    sections += ["bounds", "keda", "processes", "startup", "percore", "calls"]
    parser.add_argument("--sections", nargs="+", default=sections, choices=sections)
    parser.add_argument("--big-latency-ms", type=float, default=20)
    parser.add_argument("--big-concurrency", type=int, default=16)
    parser.add_argument("--processes-items", type=int, default=1000, help="items, processes")
    parser.add_argument("--processes-latency-ms", type=float, default=20)
    startup.add_arguments(parser)
    percore.add_arguments(parser)
    calls.add_arguments(parser)
    args = parser.parse_args()

    if "throughput" in args.sections:
        throughput_table(args)
    if "cpu" in args.sections:
        cpu_table(args)
    if "limit" in args.sections:
        limit_table(args)
    if "ragas" in args.sections:
        ragas_table(args)
    if "cache" in args.sections:
        cache_table(args)
    if "big" in args.sections:
        big_tables(args)
    if "streams" in args.sections:
        print_table(
            "Stalled /results readers (issue 19)", streams.table_rows(streams.stalled_readers())
        )
    if "pages" in args.sections:
        pages_table(args)
    if "bounds" in args.sections:
        print_table("in-process bounds (the unit tests' former clock targets)", bounds.rows())
    if "scrape" in args.sections:
        scrape_table(args)
    if "startup" in args.sections:
        print_table(
            f"Start-up (issue 25): medians of {args.startup_runs} runs, the `recallq` script in a "
            "new directory; CPU is the process's own",
            startup.rows(args),
        )
    if "processes" in args.sections:
        print_table(
            f"`recallq worker --processes 2` vs two commands: {args.processes_items} items, stub "
            f"latency {args.processes_latency_ms:.0f} ms (CPU-bound), {args.big_concurrency} "
            "threads per process; memory once warm, summed over every process",
            processes.rows(args),
        )
    if "keda" in args.sections:
        keda_table(args)
    if "calls" in args.sections:
        print_table(
            f"CPU of one judge call (issue 29), in-process against the stub (no latency): "
            f"medians of {args.calls_rounds} rounds of {args.calls_n} calls per path",
            calls.rows(args),
        )
    if "percore" in args.sections:
        print_table(
            f"Worker CPU per item (issue 29): one `recallq worker` (--processes "
            f"{args.percore_processes or 'default'}, --concurrency "
            f"{args.percore_threads or 'default'}), "
            f"{args.percore_items} items, stub latency {args.percore_latency_ms:.0f} ms, "
            "measured warm; ranges over the rounds (before, after and RAGAS interleaved)",
            percore.rows(args),
        )


def keda_table(args: argparse.Namespace) -> None:
    rows = keda.measure(args)
    print_table(
        f"KEDA's query (deploy/kubernetes) on {rows[0]['items']:,} items: 5 active runs "
        f"(the biggest {args.keda_active_items:,} items), the rest ended; {keda.ROUNDS} calls",
        [
            ("plan", "items read by", "pods", "median ms", "p95 ms", "gauge's query ms"),
            *[
                (
                    r["plan"],
                    r["access"],
                    str(r["pods"]),
                    f"{r['median_ms']:.2f}",
                    f"{r['p95_ms']:.2f}",
                    f"{r['gauge_ms']:.2f}",
                )
                for r in rows
            ],
        ],
    )


def scrape_table(args: argparse.Namespace) -> None:
    r = scrape.measure(args)
    print_table(
        f"GET /metrics during a {r['items']}-item run (2 workers; {r['rounds']} pairs of 5 s "
        f"windows, scraped every {r['interval']:g} s or not)",
        [
            ("API CPU quiet ms/s", "added API CPU ms/scrape", "waiting query ms", "page bytes"),
            (
                f"{r['quiet_ms']:.1f}",
                f"{r['extra_ms']:.2f}",
                f"{r['query_ms']:.2f}",
                str(r["bytes"]),
            ),
        ],
    )


def throughput_table(args: argparse.Namespace) -> None:
    rows: list[Row] = [
        ("workers", "items/s", "in-flight bound", "worker CPU ms/item", "LLM calls/item")
    ]
    base = None
    for workers in args.workers:
        r = throughput(workers, args)
        base = base or r["items_per_s"]
        rows.append(
            (
                str(workers),
                f"{r['items_per_s']:.1f} ({r['items_per_s'] / base:.2f}x of 1)",
                f"{r['bound']:.0f} items/s ({r['items_per_s'] / r['bound']:.0%})",
                f"{r['cpu_ms']:.1f}",
                f"{r['calls_per_item']:.2f}",
            )
        )
    print_table(
        f"Throughput, stub latency {args.latency_ms:.0f} ms, {args.concurrency} threads/worker, "
        "extraction packed (bound = workers x threads / latency / calls per item)",
        rows,
    )


def _lane(args: argparse.Namespace) -> str:
    return "direct" if args.cpu_transport == "auto" else "litellm"


def cpu_table(args: argparse.Namespace) -> None:
    split = cpu_split(args)
    llm, lexical = split[harness.MODEL], split["local/lexical"]
    print_table(
        f"Worker CPU per item, 1 worker x {args.big_concurrency} threads, "
        f"{args.cpu_items} items per judge, stub latency {args.big_latency_ms:.0f} ms",
        [
            ("judge", "worker CPU ms/item", "what it holds", ""),
            (
                harness.MODEL,
                f"{llm:.1f}",
                f"{split['calls_per_item']:.3f} HTTP calls ({_lane(args)} lane) + queue + database",
                "",
            ),
            ("local/lexical", f"{lexical:.1f}", "queue + database, no HTTP", ""),
            ("difference", f"{llm - lexical:.1f}", "the judge calls in a busy worker", ""),
        ],
    )
    print_table(
        "CPU of one judge call, in-process against the stub",
        [
            ("raw httpx POST (floor)", "recallq's judge, litellm lane", "ratio", ""),
            (
                f"{split['raw_ms']:.2f} ms",
                f"{split['litellm_ms']:.2f} ms",
                f"{split['litellm_ms'] / split['raw_ms']:.1f}x",
                "",
            ),
        ],
    )


def limit_table(args: argparse.Namespace) -> None:
    limited = rate_limited(args)
    print_table(
        f"Provider limit {args.rpm} requests/min enforced by the stub, one `recallq worker` "
        "with its defaults",
        [
            ("sustained calls/min", "of the limit", "accepted", "refused (429)"),
            (
                f"{limited['rate']:.0f}",
                f"{limited['rate'] / args.rpm:.1%}",
                str(limited["accepted"]),
                f"{limited['refused']} ({limited['refused'] / max(1, limited['accepted']):.2%})",
            ),
        ],
    )


def ragas_table(args: argparse.Namespace) -> None:
    rows: list[Row] = [
        ("", "items/min", "LLM calls/item", "prompt tokens/item", "refused (429)", "lost")
    ]
    for r in under_a_provider_limit(args):
        rows.append(
            (
                f"recallq, {r['label']}",
                f"{r['items_per_min']:.0f}",
                f"{r['calls_per_item']:.3f}",
                f"{r['prompt_tokens']:.0f}",
                f"{r['refused']} of {r['sent']}",
                str(r["lost"]),
            )
        )
    rows.append(
        (
            "RAGAS, first run (measured)",
            str(RAGAS_ITEMS_PER_MIN),
            "1",
            "-",
            f"{RAGAS_REFUSED} of {RAGAS_CALLS}",
            str(RAGAS_LOST),
        )
    )
    print_table(
        f"Under a provider limit of {args.ragas_rpm} requests/min (the stub enforces it), "
        f"{args.ragas_items} items, 2 workers x 16 threads, extraction packed 8 to a call",
        rows,
    )


def cache_table(args: argparse.Namespace) -> None:
    first, again, hits = claim_cache(args)
    print_table(
        "Claim cache (same eval set run twice)",
        [
            ("first run calls/item", "re-run calls/item", "re-run cache hits", ""),
            (f"{first:.2f}", f"{again:.2f}", str(hits), ""),
        ],
    )


def big_tables(args: argparse.Namespace) -> None:
    big = submission_and_big_run(args)
    rows = [("items", "submission s", "API memory growth MB", "")]
    for size, seconds, growth in big["submissions"]:
        rows.append((str(size), f"{seconds:.1f}", f"{growth:.1f}", ""))
    print_table("NDJSON submission over HTTP (the API's resident memory, sampled)", rows)
    size, reads = big["reads"]
    print_table(
        f"Reads on a {size}-item run (best of 5, ms)",
        [
            ("run view", "first page", "page half-way (cursor)", "page by status", "stream all"),
            (
                f"{reads['run_view_ms']:.0f}",
                f"{reads['first_page_ms']:.0f}",
                f"{reads['deep_page_ms']:.0f}",
                f"{reads['status_page_ms']:.0f}",
                f"{reads['stream_s']:.1f} s ({reads['streamed']} lines)",
            ),
        ],
    )
    if "big" in big:
        b = big["big"]
        print_table(
            f"{args.big}-item run, 2 workers x {args.big_concurrency} threads, "
            f"stub latency {args.big_latency_ms:.0f} ms",
            [
                (
                    "first result s",
                    "completion s",
                    "item latency p50 / p99 s",
                    "worker CPU ms/item",
                ),
                (
                    f"{b['first_result']:.1f}",
                    f"{b['completion']:.0f} ({args.big / b['completion']:.1f} items/s)",
                    f"{b['p50']:.2f} / {b['p99']:.2f}",
                    f"{b['cpu_ms']:.1f}",
                ),
            ],
        )
        print(f"  counts: {b['counts']}, LLM calls/item {b['calls']:.2f}")


def pages_table(args: argparse.Namespace) -> None:
    measured = pages.measure(args.pages_items, args.pages_requests, budget_s=15)
    rows: list[Row] = [
        ("page", "first ms", "median ms", "p95 ms", "p95 of bound", "requests", "status", "KB")
    ]
    for t in measured["timings"]:
        rows.append(
            (
                t.label,
                f"{t.first_ms:.0f}",
                f"{t.median_ms:.0f}",
                f"{t.p95_ms:.0f}",
                f"{t.p95_ms / pages.BOUND_MS:.2f}x",
                str(t.requests),
                t.status,
                f"{t.size_kb:.0f}",
            )
        )
    print_table(
        f"Viewer pages and their /v1 twins on {args.pages_items}-item runs over HTTP "
        f"(bound {pages.BOUND_MS:.0f} ms; runs seeded with COPY in {measured['seed_s']:.0f} s; "
        "first: the first request, no view kept; median and p95: then, the views kept)",
        rows,
    )


if __name__ == "__main__":
    main()
