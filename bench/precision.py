"""What context precision costs: `python -m bench.precision [--items N]`. Prints a table;
asserts nothing.

N synthetic items (`bench.harness` facts), each with 4 passages: its 2 relevant ones and 2
unrelated ones, in one of 4 orders (mean average precision 0.6875 by hand). `recallq.evaluate`
scores them in local mode with the stub judge over HTTP through litellm, on a fresh SQLite
file each time (no claim cache), with precision `off` (recall alone), `cited` and `judged`;
the run's usage gives calls and prompt tokens per item. The last row is RAGAS's context
precision on the same items: one call per passage (K = 4 an item), each sized here as
recallq's context_relevance prompt for that one passage (a lower bound: RAGAS's own prompt
adds few-shot examples), on top of recall's calls.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from bench import harness
from recallq.judge import protocol
from tests.services import write_models_file
from tests.stub_llm import StubServer


def items(n: int) -> list[dict[str, Any]]:
    base = list(harness.items(n, "pr"))
    made = []
    for i, item in enumerate(base):
        junk = [f"Lighthouse {i} guides ships along rocky coasts.", f"Volcanoes erupt basalt {i}."]
        passages = [*item["context"], *junk]
        order = [(0, 1, 2, 3), (2, 0, 3, 1), (2, 3, 0, 1), (0, 2, 1, 3)][i % 4]
        made.append({**item, "context": [passages[j] for j in order]})
    return made


def score(stub: StubServer, data: list[dict[str, Any]], precision: str) -> dict[str, float]:
    import recallq

    stub.reset()
    database = Path(tempfile.mkdtemp(prefix="recallq-bench-precision-")) / "recallq.db"
    result = recallq.evaluate(
        data,
        model=harness.MODEL,
        progress=False,
        database_url=f"sqlite:///{database}",
        precision=precision,
    )
    n = len(data)
    return {
        "calls": result.usage["llm_calls"] / n,
        "prompt_tokens": result.usage["prompt_tokens"] / n,
        "precision": result.summary.get("mean_context_precision") or 0.0,
    }


def ragas_style(data: list[dict[str, Any]], recall: dict[str, float]) -> dict[str, float]:
    """Recall's calls plus one call a passage, each prompt one passage with the ground truth."""
    tokens = 0
    for item in data:
        for index, passage in enumerate(item["context"]):
            messages = protocol.relevance_messages(item["ground_truth"], [(index, passage)])
            tokens += sum(len(m["content"]) for m in messages) // 4
    n = len(data)
    per_item = sum(len(item["context"]) for item in data) / n
    return {
        "calls": recall["calls"] + per_item,
        "prompt_tokens": recall["prompt_tokens"] + tokens / n,
        "precision": float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=200, help="synthetic items")
    args = parser.parse_args()
    data = items(args.items)
    rows: list[tuple[str, dict[str, float]]] = []
    with StubServer() as stub:
        directory = Path(tempfile.mkdtemp(prefix="recallq-bench-precision-"))
        os.environ.update(
            RECALLQ_MODELS_FILE=str(write_models_file(directory, stub.base_url)),
            STUB_API_KEY="sk-bench",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        for precision, label in (
            ("off", "recall alone"),
            ("cited", "recall + cited"),
            ("judged", "recall + judged"),
        ):
            rows.append((label, score(stub, data, precision)))
    rows.append(("recall + RAGAS-style (K calls)", ragas_style(data, rows[0][1])))
    recall = rows[0][1]
    print(f"{args.items} items, 4 passages each (2 relevant), stub judge through litellm")
    print(
        f"{'':<32} {'calls/item':>10} {'prompt tokens/item':>19} {'vs recall':>10} {'mean AP':>8}"
    )
    for label, row in rows:
        extra = row["prompt_tokens"] / recall["prompt_tokens"] - 1
        shown = "-" if row["precision"] != row["precision"] else f"{row['precision']:.4f}"
        if label == "recall alone":
            shown = "-"
        print(
            f"{label:<32} {row['calls']:>10.3f} {row['prompt_tokens']:>19.1f} "
            f"{extra:>+10.1%} {shown:>8}"
        )


if __name__ == "__main__":
    main()
