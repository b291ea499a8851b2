"""RAGAS 0.4.3's context-recall call, as the stub judge answers it (for side-by-side benches).

RAGAS's ``ContextRecallClassificationPrompt`` (``ragas/metrics/_context_recall.py``) is one
plain-text user message: its instruction, the JSON Schema of ``ContextRecallClassifications``,
one example, then ``input: {"question", "context", "answer"}`` and ``Output: ``. No
``response_format``. The stub recognises it by the instruction and the output model's name,
and answers ``{"classifications": [{"statement", "reason", "attributed": 1}]}``: one entry per
sentence of the answer (the reference), every one attributed. Recall is 1.0 for every item;
the point is the cost of the call, not the verdict. The stub's latency, rpm window, outages
and random 429/500 apply to it as to any call; recallq's content markers do not.
"""

from __future__ import annotations

import json
import re
from typing import Any

CONTEXT_RECALL = "ragas_context_recall"
#: two pieces of RAGAS's prompt that together identify it
INSTRUCTION = "classify if the sentence can be attributed to the given context"
OUTPUT_MODEL = "ContextRecallClassifications"
_INPUT = "\ninput: "
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])[ \t]+|[\r\n]+")


def _prompt_text(messages: Any) -> str:
    """The last user message's text (string content or OpenAI content parts)."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if isinstance(p, dict)]
                return "".join(p for p in parts if isinstance(p, str))
            return content if isinstance(content, str) else ""
    return ""


def context_recall_data(messages: Any) -> dict[str, Any] | None:
    """RAGAS's input object ``{"question", "context", "answer"}`` when these messages are its
    context-recall prompt, else None."""
    text = _prompt_text(messages)
    if INSTRUCTION not in text or OUTPUT_MODEL not in text:
        return None
    start = text.rfind(_INPUT)
    if start == -1:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start + len(_INPUT) :].lstrip())
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("answer"), str):
        return None
    return value


def context_recall_answer(data: dict[str, Any]) -> str:
    """Every sentence of the answer, attributed to the context."""
    pieces = (p.strip() for p in _SENTENCE_SPLIT.split(data["answer"]))
    statements = [p for p in pieces if p]
    return json.dumps(
        {
            "classifications": [
                {"statement": s, "reason": "stub: attributed", "attributed": 1} for s in statements
            ]
        }
    )
