"""Stalled /results readers against the API: `python -m bench --sections streams`.

A 3,000-item run and a 50 MB run (1,000 items of 50 KB) are submitted to an API with no cap
on streams per key (`RECALLQ_MAX_RESULT_STREAMS_PER_KEY=0`: the worst case of one process).
Then 40 readers of the first, and 4 of the second, each ask for the run's results, read the
first bytes and stop reading. The table gives the API's RSS before and with them (its peak
over `settle` seconds) and the median time of a small run's `GET /v1/runs/{id}` meanwhile,
against the issue's bounds (under 100 MB more, under 200 ms).
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from typing import Any
from urllib.parse import urlparse

import httpx
import psutil

from bench import harness

MEMORY_BOUND_MB = 100.0
READ_BOUND_MS = 200.0


def _run(url: str, items: list[dict[str, Any]]) -> str:
    lines = "".join(json.dumps(item) + "\n" for item in items)
    response = httpx.post(
        f"{url}/v1/runs",
        content=lines.encode(),
        headers={"content-type": "application/x-ndjson"},
        timeout=600,
    )
    response.raise_for_status()
    return str(response.json()["id"])


def _stalled(url: str, run_id: str) -> socket.socket:
    parsed = urlparse(url)
    reader = socket.create_connection((parsed.hostname, parsed.port))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.sendall(
        f"GET /v1/runs/{run_id}/results HTTP/1.1\r\nHost: {parsed.netloc}\r\n\r\n".encode()
    )
    reader.recv(1024)
    return reader


def _read_ms(url: str, run_id: str, requests: int) -> float:
    times = []
    with httpx.Client(timeout=120) as client:
        for _ in range(requests):
            started = time.perf_counter()
            client.get(f"{url}/v1/runs/{run_id}").raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def stalled_readers(settle: float = 10.0, requests: int = 20) -> list[dict[str, Any]]:
    rows = []
    extra = {"RECALLQ_MAX_RESULT_STREAMS_PER_KEY": "0"}
    with harness.environment(0, **extra) as env:
        api, url = harness.start_api(env["env"])
        try:
            many = _run(url, list(harness.items(3000, "s")))
            filler = "x" * 50_000
            big = _run(
                url,
                [
                    {"id": f"b{i}", "ground_truth": f"Fact {i}.", "context": [filler]}
                    for i in range(1000)
                ],
            )
            small = _run(url, list(harness.items(3, "r")))
            process = psutil.Process(api.proc.pid)
            _read_ms(url, small, 5)  # warm
            for label, run_id, readers in (
                ("40 stalled readers, 3,000-item run", many, 40),
                ("4 stalled readers, 50 MB run", big, 4),
            ):
                before = process.memory_info().rss
                idle_ms = _read_ms(url, small, requests)
                sockets = [_stalled(url, run_id) for _ in range(readers)]
                peak = before
                deadline = time.monotonic() + settle
                while time.monotonic() < deadline:
                    peak = max(peak, process.memory_info().rss)
                    time.sleep(0.25)
                busy_ms = _read_ms(url, small, requests)
                peak = max(peak, process.memory_info().rss)
                for reader in sockets:
                    reader.close()
                time.sleep(2)
                rows.append(
                    {
                        "label": label,
                        "before_mb": before / 2**20,
                        "peak_mb": peak / 2**20,
                        "grown_mb": (peak - before) / 2**20,
                        "idle_ms": idle_ms,
                        "busy_ms": busy_ms,
                    }
                )
        finally:
            api.stop()
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out = [("scenario", "API RSS before", "peak", "grown", "run read idle", "with readers", "")]
    for row in rows:
        within = row["grown_mb"] < MEMORY_BOUND_MB and row["busy_ms"] < READ_BOUND_MS
        out.append(
            (
                row["label"],
                f"{row['before_mb']:.0f} MB",
                f"{row['peak_mb']:.0f} MB",
                f"{row['grown_mb']:+.0f} MB",
                f"{row['idle_ms']:.0f} ms",
                f"{row['busy_ms']:.0f} ms",
                "within bounds" if within else "OVER",
            )
        )
    return out
