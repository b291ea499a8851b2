"""CPU of one judge call (issue 29): the direct OpenAI-compatible lane against the litellm lane,
in-process against the stub (no latency), `python -m bench --sections calls`.

Each lane is measured twice: its transport alone (the HTTP request and the answer read), and
a whole call through LLMJudge with real coordination in a Redis of its own (the call gate and
the circuit breaker in Redis; a model without rpm/tpm has no rate-limiter round trip, as in a
worker), i.e. what a worker thread spends per call besides the pipeline. A POST of the same
request through one pooled httpx.Client is the reference (the direct lane's transport skips the
client's per-request work and goes below it). CPU is this process's (time.process_time: the
stub and Redis run in processes of their own); rounds alternate the paths, and the median
round is shown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

FLOOR = "httpx.Client POST, one pooled client (reference)"
GROUND_TRUTH = "Ada Lovelace was born in 1815. She wrote the first program."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls-n", type=int, default=300, help="calls per path and round")
    parser.add_argument("--calls-rounds", type=int, default=5, help="rounds, paths alternating")


def _timed(call: Callable[[], object], n: int) -> tuple[float, float]:
    """CPU ms and wall ms per call, after a warm-up."""
    for _ in range(20):
        call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        call()
    return (time.process_time() - cpu) / n * 1000, (time.perf_counter() - wall) / n * 1000


def measure(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from redis import Redis

    from recallq.coordination.breaker import RedisCircuitBreaker
    from recallq.coordination.call_gate import RedisCallGate
    from recallq.coordination.ratelimit import Unlimited
    from recallq.judge import lanes, protocol
    from recallq.judge.backoff import Backoff
    from recallq.judge.llm import LLMJudge
    from recallq.judge.models import AUTO, LITELLM, ModelConfig
    from tests.services import RedisServer
    from tests.stub_llm import StubServer

    redis_server = RedisServer().start()
    try:
        with StubServer(latency_ms=0, record_messages=False) as stub:
            redis = Redis.from_url(redis_server.url(), socket_timeout=5)
            params = {"model": "openai/stub-judge", "api_base": stub.base_url, "api_key": "sk-b"}
            messages = protocol.extraction_messages(GROUND_TRUTH)
            schema = protocol.response_format(protocol.EXTRACTION)
            paths: dict[str, Callable[[], object]] = {}
            for label, transport in (("direct lane", AUTO), ("litellm lane", LITELLM)):
                config = ModelConfig("stub-judge", params, transport=transport)
                alone = lanes.build_transport(config, protocol.DEFAULT_LIMITS.answer_bytes)
                judge = LLMJudge(
                    config, Backoff(), Unlimited(), RedisCallGate(redis, 60),
                    RedisCircuitBreaker(redis), 60,
                )  # fmt: skip
                paths[f"{label}: transport alone"] = _bind(alone.complete, messages, schema)
                paths[f"{label}: LLMJudge + Redis gate/breaker"] = _judged(judge)
            body = {"model": "stub-judge", "messages": messages, "response_format": schema}
            raw = httpx.Client(base_url=stub.base_url, headers={"Authorization": "Bearer sk-b"})
            paths = {FLOOR: lambda: raw.post("/chat/completions", json=body).json(), **paths}
            rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
            for _ in range(args.calls_rounds):
                for name, call in paths.items():
                    rounds[name].append(_timed(call, args.calls_n))
            raw.close()
    finally:
        redis_server.stop()
    return {
        name: (
            statistics.median(cpu for cpu, _ in figures),
            statistics.median(wall for _, wall in figures),
        )
        for name, figures in rounds.items()
    }


def _bind(complete: Any, messages: Any, schema: Any) -> Callable[[], object]:
    return lambda: complete(messages, schema, 60)


def _judged(judge: Any) -> Callable[[], object]:
    return lambda: judge.extract_claims(GROUND_TRUTH, "bench")


def rows(args: argparse.Namespace) -> list[tuple[str, ...]]:
    figures = measure(args)
    floor = figures[FLOOR][0]
    table: list[tuple[str, ...]] = [("path", "CPU ms/call", "wall ms/call", "CPU vs reference")]
    for name, (cpu, wall) in figures.items():
        table.append((name, f"{cpu:.2f}", f"{wall:.2f}", f"{cpu / floor:.1f}x"))
    return table
