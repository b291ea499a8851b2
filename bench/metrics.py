"""Measurements read from the processes, the stub and the database."""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import httpx
import psutil
from sqlalchemy import create_engine, text


class PeakMemory:
    """Samples a process's resident memory in a thread; `.growth_mb` after `stop()`."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self._process = psutil.Process(pid)
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / 2**20


def item_latencies(database_url: str, run_id: str) -> dict[str, float]:
    """Per-item latency (taken to ended), time to first result and to completion."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT EXTRACT(EPOCH FROM i.finished_at - i.started_at) AS latency, "
                "EXTRACT(EPOCH FROM i.finished_at - r.created_at) AS since_submit "
                "FROM items i JOIN runs r ON r.id = i.run_id "
                "WHERE i.run_id = :run AND i.finished_at IS NOT NULL"
            ),
            {"run": run_id},
        ).all()
    engine.dispose()
    latencies = sorted(float(r.latency) for r in rows)
    since = [float(r.since_submit) for r in rows]
    return {
        "p50": statistics.median(latencies),
        "p99": latencies[int(0.99 * (len(latencies) - 1))],
        "first_result": min(since),
        "completion": max(since),
    }


def raw_http_cpu_ms(stub_base_url: str, calls: int = 300) -> float:
    """CPU of one chat-completion call made with raw httpx: the floor for any client."""
    from recallq.judge import protocol

    body = {
        "model": "stub-judge",
        "messages": protocol.extraction_messages("Ada Lovelace was born in 1815."),
        "response_format": protocol.response_format(protocol.EXTRACTION),
    }
    with httpx.Client(base_url=stub_base_url) as client:
        for _ in range(20):
            client.post("/chat/completions", json=body)
        start = time.process_time()
        for _ in range(calls):
            client.post("/chat/completions", json=body).json()
        return (time.process_time() - start) / calls * 1000


def litellm_cpu_ms(stub_base_url: str, calls: int = 200) -> float:
    """CPU of one call through recallq's judge on its litellm lane (litellm's cost included)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from recallq.coordination.breaker import LocalCircuitBreaker
    from recallq.coordination.call_gate import OpenGate
    from recallq.coordination.ratelimit import Unlimited
    from recallq.core.usage import Usage
    from recallq.judge.backoff import Backoff
    from recallq.judge.llm import LLMJudge
    from recallq.judge.models import LITELLM, ModelConfig

    config = ModelConfig(
        "stub-judge",
        {"model": "openai/stub-judge", "api_base": stub_base_url, "api_key": "sk-bench"},
        transport=LITELLM,
    )
    judge = LLMJudge(config, Backoff(), Unlimited(), OpenGate(), LocalCircuitBreaker(), 60)
    for _ in range(20):
        judge.extract_claims("Ada Lovelace was born in 1815.", "bench")
    start = time.process_time()
    usage = Usage()
    for _ in range(calls):
        usage += judge.extract_claims("Ada Lovelace was born in 1815.", "bench").usage
    return (time.process_time() - start) / calls * 1000


def accepted_rate_per_minute(calls: list[dict[str, Any]]) -> tuple[float, int, int]:
    """Sustained rate of accepted calls over their window; and accepted, refused counts."""
    accepted = sorted(c["t"] for c in calls if c["status"] == 200)
    refused = sum(1 for c in calls if c["status"] == 429)
    if len(accepted) < 2:
        return 0.0, len(accepted), refused
    return (len(accepted) - 1) / (accepted[-1] - accepted[0]) * 60, len(accepted), refused


def read_latencies(api: str, run_id: str, repeats: int = 5) -> dict[str, float]:
    """Milliseconds for the reads a client makes on a large run (best of `repeats`), and
    seconds to stream every item of it."""
    with httpx.Client(base_url=api, timeout=600) as client:
        total = client.get(f"/v1/runs/{run_id}").json()["counts"]["total"]

        def best(path: str, **params: Any) -> float:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                response = client.get(path, params=params)
                response.raise_for_status()
                times.append(time.perf_counter() - start)
            return min(times) * 1000

        deep = client.get(f"/v1/runs/{run_id}/items", params={"limit": 1000}).json()
        for _ in range(total // 2000):  # walk half-way in with the cursor
            deep = client.get(
                f"/v1/runs/{run_id}/items", params={"limit": 1000, "cursor": deep["next_cursor"]}
            ).json()
        result = {
            "run_view_ms": best(f"/v1/runs/{run_id}"),
            "first_page_ms": best(f"/v1/runs/{run_id}/items", limit=100),
            "deep_page_ms": best(f"/v1/runs/{run_id}/items", limit=100, cursor=deep["next_cursor"]),
            "status_page_ms": best(f"/v1/runs/{run_id}/items", limit=100, status="failed"),
        }
        start = time.perf_counter()
        with client.stream("GET", f"/v1/runs/{run_id}/results") as response:
            lines = sum(chunk.count(b"\n") for chunk in response.iter_bytes())
        result["stream_s"] = time.perf_counter() - start
        result["streamed"] = lines
    return result
