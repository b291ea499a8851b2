"""recallq: context-recall scoring for RAG evaluation, from a notebook to a cluster.

    import recallq
    result = recallq.evaluate("data.jsonl")          # in-process, SQLite, offline judge
    result.to_pandas()

    client = recallq.Client("http://127.0.0.1:8000")  # the service
    run = client.submit("data.jsonl", model="gpt-4o-mini")
    run.wait()

`import recallq` is light: the names below load on first use, and the in-process path never
imports litellm (unless the judge is an LLM), Celery or a web server.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recallq.client import ApiError, Client, Run
    from recallq.evaluation import evaluate
    from recallq.results import Result
    from recallq.runs.dataset import DatasetError
    from recallq.runs.ingest import SubmissionError

__all__ = [
    "ApiError",
    "Client",
    "DatasetError",
    "Result",
    "Run",
    "SubmissionError",
    "__version__",
    "evaluate",
]

_LAZY = {
    "evaluate": "recallq.evaluation",
    "Result": "recallq.results",
    "Client": "recallq.client",
    "Run": "recallq.client",
    "ApiError": "recallq.client",
    # what evaluate raises for bad input (both ValueErrors), wherever the modules live
    "SubmissionError": "recallq.runs.ingest",
    "DatasetError": "recallq.runs.dataset",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recallq")
    except PackageNotFoundError:  # a source tree that was not installed
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module 'recallq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
