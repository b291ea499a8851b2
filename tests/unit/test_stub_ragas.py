"""The stub judge answers RAGAS 0.4.3's context-recall call (tests/stub_ragas.py), over HTTP.

The prompt in tests/data is the one RAGAS 0.4.3 renders
(``ContextRecallClassificationPrompt().to_string(QCA(...))``), sent as ``ChatOpenAI`` sends
it: one user message, no ``response_format``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.stub_llm import StubServer
from tests.stub_ragas import CONTEXT_RECALL

PROMPT = (
    Path(__file__).parent.parent / "data" / "ragas_0.4.3_context_recall_prompt.txt"
).read_text()


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(latency_ms=0) as server:
        yield server


def post(stub: StubServer, prompt: str) -> httpx.Response:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "model": "stub-judge",
        "n": 1,
        "stream": False,
        "temperature": 0.01,
    }
    return httpx.post(f"{stub.base_url}/chat/completions", json=body, timeout=10.0)


def test_answers_every_statement_attributed(stub: StubServer) -> None:
    stub.reset()
    response = post(stub, PROMPT)
    assert response.status_code == 200, response.text
    answer = json.loads(response.json()["choices"][0]["message"]["content"])
    assert answer == {
        "classifications": [
            {
                "statement": "Item 7 was made in 1907.",
                "reason": "stub: attributed",
                "attributed": 1,
            },
            {
                "statement": "Item 7 weighs 7 kilograms.",
                "reason": "stub: attributed",
                "attributed": 1,
            },
        ]
    }
    stats = stub.stats()
    assert stats["by_schema"] == {CONTEXT_RECALL: 1}
    assert stats["usage_by_schema"][CONTEXT_RECALL]["calls"] == 1


def test_the_instruction_without_an_input_is_still_refused(stub: StubServer) -> None:
    cut = PROMPT[: PROMPT.rindex("\ninput: ")]
    assert post(stub, cut).status_code == 400
    assert post(stub, "Classify these sentences.").status_code == 400
