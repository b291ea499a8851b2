"""The same input gets the same answer from local mode, `recallq.evaluate` and the service.

One table of good and bad submissions goes through `recallq run FILE` (a subprocess on its
own SQLite file), `recallq.evaluate` (in this process) and the HTTP API (a real API process
on Postgres, a real worker scoring the good ones). Good ones must score the same per item;
bad ones must be refused with the same message (and, where the adapter shows one, the same
error code). Before the run service, local mode ignored the context limits, scored a 2 MB
ground truth, and worded duplicate ids differently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import recallq
from recallq.runs.ingest import SubmissionError
from tests.launcher import run_recallq
from tests.services import Process, start_api, start_worker, wait_for_run

ONE_PASSAGE = {"RECALLQ_MAX_CONTEXT_PASSAGES": "1"}
AGENT_INPUT = {"inputMessages": [{"role": "user", "content": "When was Einstein born?"}]}


def _agent_output(text: str) -> list[dict[str, Any]]:
    return [
        {
            "id": "m1",
            "role": "assistant",
            "createdAt": "2026-01-01T00:00:00Z",
            "content": {"parts": [{"type": "text", "text": text}]},
            "facts": text,
        }
    ]


def _items(n: int = 3) -> list[dict[str, Any]]:
    return [
        {
            "id": f"q{i}",
            "ground_truth": f"Einstein was born in {1879 + i}. He won the Nobel Prize.",
            "context": [f"Einstein was born in {1879 + i}."],
        }
        for i in range(n)
    ]


@dataclass(frozen=True)
class Case:
    name: str
    items: list[dict[str, Any]]
    fields: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    #: None: it scores; else the error code the service answers
    refused: str | None = None


BIG = "Fact. " * (2 * 1024 * 1024 // 6)
CASES = [
    Case("three items", _items()),
    Case(
        "static context, scale 10",
        [{"id": f"s{i}", "ground_truth": "Paris is in France."} for i in range(2)],
        {"context": ["Paris is the capital of France."], "scale": 10},
    ),
    Case(
        "jmespath extractor",
        [
            {
                "id": "agent",
                "ground_truth": "Einstein was born in 1879.",
                "input": AGENT_INPUT,
                "output": _agent_output("Einstein was born in 1879 in Ulm."),
            }
        ],
        {"context_extractor": {"type": "jmespath", "expression": "output[*].facts"}},
    ),
    Case(
        "three passages under a limit of one",
        [{"id": "a", "ground_truth": "x.", "context": ["x", "y", "z"]}],
        settings=ONE_PASSAGE,
        refused="invalid_request",
    ),
    Case(
        "a 2 MB ground truth",
        [{"id": "a", "ground_truth": BIG, "context": ["x"]}],
        refused="item_too_large",
    ),
    Case(
        "a duplicate id",
        [{"id": "a", "ground_truth": "x.", "context": ["x"]}] * 2,
        refused="duplicate_id",
    ),
    Case("scale 0", _items(1), {"scale": 0}, refused="invalid_request"),
    Case("scale 1.7e308", _items(1), {"scale": 1.7e308}, refused="invalid_request"),
    Case("an unknown model", _items(1), {"model": "no-such-model"}, refused="unknown_model"),
    Case(
        "context_extractor.type a list",
        _items(1),
        {"context_extractor": {"type": ["jmespath"]}},
        refused="invalid_request",
    ),
    Case(
        "context_extractor not an object",
        _items(1),
        {"context_extractor": [1]},
        refused="invalid_request",
    ),
    Case(
        "jmespath with thousands of brackets",
        _items(1),
        {"context_extractor": {"type": "jmespath", "expression": "[" * 3000 + "]" * 3000}},
        refused="invalid_request",
    ),
    Case(
        "jmespath nested 300 deep by projections",
        _items(1),
        {"context_extractor": {"type": "jmespath", "expression": "[*]" * 300}},
        refused="invalid_request",
    ),
    Case(
        "no item can resolve a context",
        [{"id": "a", "ground_truth": "x."}],
        refused="no_context",
    ),
    Case(
        "a passage object without text",
        [{"id": "a", "ground_truth": "x.", "context": [{"body": "x"}]}],
        refused="invalid_request",
    ),
    Case(
        "an id that is a list",
        [{"id": ["a"], "ground_truth": "x.", "context": ["x"]}],
        refused="invalid_request",
    ),
    Case(
        "a typo of a field",
        [{"id": "a", "ground_trth": "x.", "context": ["x"]}],
        refused="invalid_request",
    ),
]


@dataclass(frozen=True)
class Outcome:
    scores: dict[str, float] | None = None
    message: str | None = None
    code: str | None = None  # None where the adapter shows none (the CLI prints the message)


def _words(text: str) -> str:
    return " ".join(text.split())


# --- the three adapters ---------------------------------------------------------------------


def _local(case: Case, env: dict[str, str], directory: Path) -> Outcome:
    data = directory / "data.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in case.items))
    out = directory / "results.jsonl"
    args = ["run", str(data), "--quiet", "--out", str(out)]
    for name, value in case.fields.items():
        option = "--" + name.replace("_", "-")
        args += [option, value if isinstance(value, str) else json.dumps(value)]
    local_env = {
        **env,
        **case.settings,
        "RECALLQ_DATABASE_URL": f"sqlite:///{directory / 'local.db'}",
    }
    done = run_recallq(args, env=local_env, cwd=directory, timeout=300)
    if done.returncode == 0:
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        return Outcome(scores={row["id"]: row["score"] for row in rows})
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("recallq: "), done.stderr
    return Outcome(message=_words(last.removeprefix("recallq: ")))


def _evaluate(
    case: Case, env: dict[str, str], directory: Path, monkeypatch: pytest.MonkeyPatch
) -> Outcome:
    with monkeypatch.context() as patch:
        for name, value in {**env, **case.settings}.items():
            if name.startswith("RECALLQ_") or name == "STUB_API_KEY":
                patch.setenv(name, value)
        try:
            result = recallq.evaluate(
                case.items,
                progress=False,
                database_url=f"sqlite:///{directory / 'evaluate.db'}",
                **case.fields,
            )
        except SubmissionError as exc:
            return Outcome(message=_words(exc.message), code=exc.code)
    return Outcome(scores={item["id"]: item["score"] for item in result.items})


def _service(case: Case, api: str) -> Outcome:
    response = httpx.post(f"{api}/v1/runs", json={"items": case.items, **case.fields}, timeout=120)
    if response.status_code != 202:
        assert 400 <= response.status_code < 500, response.text
        error = response.json()["error"]
        return Outcome(message=_words(error["message"]), code=error["code"])
    run = wait_for_run(api, response.json()["id"])
    assert run["status"] == "completed", run
    items = httpx.get(f"{api}/v1/runs/{run['id']}/items", params={"limit": 1000}).json()
    return Outcome(scores={item["id"]: item["score"] for item in items["items"]})


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def apis(service_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """An API per settings variant (the default, and a limit of one passage), one worker."""
    started: list[Process] = []
    urls = {}
    try:
        for variant, settings in (("default", {}), ("one_passage", ONE_PASSAGE)):
            process, url = start_api({**service_env, **settings})
            started.append(process)
            urls[variant] = url
        started.append(start_worker(service_env, concurrency=4))
        yield urls
    finally:
        for process in started:
            process.stop()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_local_mode_evaluate_and_the_service_answer_alike(
    case: Case,
    apis: dict[str, str],
    service_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {k: v for k, v in service_env.items() if k != "RECALLQ_DATABASE_URL"}
    api = apis["one_passage" if case.settings == ONE_PASSAGE else "default"]
    served = _service(case, api)
    evaluated = _evaluate(case, env, tmp_path, monkeypatch)
    local = _local(case, env, tmp_path)
    if case.refused is None:
        assert served.scores is not None, served
        assert evaluated.scores == served.scores
        assert local.scores == served.scores
        return
    assert served.code == case.refused, served
    assert evaluated == served
    # a file's reader names where in the file the item is: the rest is the service's text
    assert local.message is not None and served.message is not None
    if served.message.startswith("no item can resolve a context"):
        # a file refused as a whole: the CLI names it, lists its fields and suggests --map
        assert local.message.split(": ", 1)[1].startswith("no item has a context"), local
        return
    assert re.sub(r"^\S+ line \d+: ", "", local.message) == served.message, (local, served)
