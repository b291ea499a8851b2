"""RAGAS 0.4.3's context recall over a JSONL file of bench items, against the stub judge.

Run with RAGAS's own interpreter (not recallq's venv), e.g. by ``bench/percore.py``::

    /path/to/ragas-venv/bin/python bench/ragas_run.py --base-url http://127.0.0.1:PORT/v1 \\
        --warmup items-40.jsonl items-400.jsonl

The items are the percore bench's (``bench.harness.items``: ``ground_truth`` and ``context``),
given to RAGAS as ``reference`` and ``retrieved_contexts`` with a fixed question (RAGAS requires
``user_input``; recallq's items have none). The judge is ``ChatOpenAI`` (the openai client)
pointed at the stub, wrapped as RAGAS's ``LangchainLLMWrapper``; ``ragas.aevaluate`` with
``RunConfig(max_workers=16)`` keeps 16 calls in flight. A warm-up evaluation runs first in the
same process and event loop (imports, clients, the first calls), then the timed one. Prints one
JSON line: ``{"items", "seconds", "cpu_s", "score"}``, CPU being this whole process's user +
system time (every thread) over the timed evaluation.

langchain-community 0.4 dropped ``chat_models.vertexai``, which RAGAS 0.4.3's ``ragas.llms``
still imports at module level (never used here): an empty stand-in is registered before the
import, the only change to RAGAS's code path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import types
from typing import Any

QUESTION = "What is known about this item?"


def _vertexai_stand_in() -> None:
    name = "langchain_community.chat_models.vertexai"
    try:
        __import__(name)
    except ImportError:
        module = types.ModuleType(name)
        module.ChatVertexAI = type("ChatVertexAI", (), {})  # type: ignore[attr-defined]
        sys.modules[name] = module


def _samples(path: str) -> list[dict[str, Any]]:
    with open(path) as handle:
        items = [json.loads(line) for line in handle if line.strip()]
    return [
        {
            "user_input": QUESTION,
            "reference": item["ground_truth"],
            "retrieved_contexts": list(item["context"]),
        }
        for item in items
    ]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", help="JSONL of bench items, timed")
    parser.add_argument("--warmup", help="JSONL of bench items, run first, not timed")
    parser.add_argument("--base-url", required=True, help="the stub's /v1 URL")
    parser.add_argument("--model", default="stub-judge")
    parser.add_argument("--max-workers", type=int, default=16)
    args = parser.parse_args(argv)

    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # no analytics calls out
    _vertexai_stand_in()
    from langchain_openai import ChatOpenAI
    from ragas import EvaluationDataset, aevaluate
    from ragas.llms import LangchainLLMWrapper
    from ragas.metrics import LLMContextRecall
    from ragas.run_config import RunConfig

    llm = LangchainLLMWrapper(
        ChatOpenAI(model=args.model, base_url=args.base_url, api_key="sk-bench", max_retries=0)
    )
    config = RunConfig(max_workers=args.max_workers)

    async def score(path: str) -> float:
        result = await aevaluate(
            EvaluationDataset.from_list(_samples(path)),
            metrics=[LLMContextRecall()],
            llm=llm,
            run_config=config,
            show_progress=False,
            raise_exceptions=True,
        )
        values = result["context_recall"]
        assert all(v == v for v in values), "RAGAS scored an item NaN (the stub's answer?)"
        return sum(values) / len(values)

    async def runs() -> tuple[float, float, float]:
        # one event loop for both runs: the client's connections belong to it
        if args.warmup:
            await score(args.warmup)
        cpu, started = _cpu(), time.perf_counter()
        mean = await score(args.items)
        return time.perf_counter() - started, _cpu() - cpu, mean

    n = len(_samples(args.items))
    seconds, cpu_s, mean = asyncio.run(runs())
    print(json.dumps({"items": n, "seconds": seconds, "cpu_s": cpu_s, "score": mean}), flush=True)


if __name__ == "__main__":
    main()
