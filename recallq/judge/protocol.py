"""Judge protocol v1: prompts, JSON schemas and parsing of what the model answers."""

from __future__ import annotations

import json
import re
from typing import Any

PROMPT_VERSION = "v1"
EXTRACTION = "claim_extraction"
EXTRACTION_PACKED = "claim_extraction_packed"
ATTRIBUTION = "claim_attribution"

EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"claims": {"type": "array", "items": {"type": "string"}}},
    "required": ["claims"],
    "additionalProperties": False,
}

ATTRIBUTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "claim_index": {"type": "integer"},
                    "verdict": {"type": "string", "enum": ["yes", "no"]},
                    "context_indices": {"type": "array", "items": {"type": "integer"}},
                    "reason": {"type": "string"},
                },
                "required": ["claim_index", "verdict", "context_indices", "reason"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["verdicts"],
    "additionalProperties": False,
}

EXTRACTION_PACKED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "claims": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["index", "claims"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}

SCHEMAS = {
    EXTRACTION: EXTRACTION_SCHEMA,
    EXTRACTION_PACKED: EXTRACTION_PACKED_SCHEMA,
    ATTRIBUTION: ATTRIBUTION_SCHEMA,
}

EXTRACTION_SYSTEM = """\
You break a reference answer into atomic claims for a fact-checking evaluation.

Rules:
- One claim states exactly one fact that can be checked on its own.
- Each claim is self-contained: replace pronouns and vague references with the entity they \
refer to ("He won" -> "Albert Einstein won").
- Keep every number, date, unit, quantity, name and qualifier exactly as written; never round, \
convert or generalise.
- Cover everything the answer asserts; add nothing it does not say; do not merge facts.
- Skip text that asserts nothing (greetings, questions, filler).
- Answer only with JSON of the form {"claims": ["...", "..."]}."""

EXTRACTION_PACKED_SYSTEM = (
    EXTRACTION_SYSTEM.rsplit("\n", 1)[0]
    + """
- You are given several reference answers, each with an index. Break each one into claims on \
its own, exactly as if it were the only one: never carry a name, fact or pronoun over from \
another.
- Answer only with JSON of the form {"items": [{"index": 0, "claims": ["...", "..."]}]}, with \
one entry for every index you were given."""
)

ATTRIBUTION_SYSTEM = """\
You check whether each claim is supported by retrieved context passages.

Rules:
- Use only the given contexts. Ignore what you know from elsewhere, even if it is true.
- "yes" only when the claim can be inferred from one or more contexts: every entity, number, \
date and qualifier in the claim must be stated or directly entailed there.
- "no" when any part is missing, only implied by general knowledge, or contradicted \
(a different number or date is a contradiction).
- context_indices lists the indices of the contexts that support a "yes" claim; [] for "no".
- reason: one short sentence citing the supporting text, or saying what is missing.
- Give exactly one verdict per claim, using its claim_index.
- Answer only with JSON of the form {"verdicts": [{"claim_index": 0, "verdict": "yes", \
"context_indices": [0], "reason": "..."}]}."""

REPAIR_INSTRUCTION = (
    "Your previous answer could not be used: {problem}. Answer again for the same data with "
    "only the JSON object described above, complete and valid."
)


class ProtocolError(ValueError):
    """The model's answer is not valid JSON of the expected shape."""


def data_message(instruction: str, data: dict[str, Any]) -> str:
    return f"{instruction}\n\n```json\n{json.dumps(data, ensure_ascii=False, indent=1)}\n```"


def extraction_messages(ground_truth: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": EXTRACTION_SYSTEM},
        {
            "role": "user",
            "content": data_message(
                "Extract the atomic claims of this ground truth.", {"ground_truth": ground_truth}
            ),
        },
    ]


def packed_extraction_messages(ground_truths: list[str]) -> list[dict[str, str]]:
    data = {"ground_truths": [{"index": i, "text": text} for i, text in enumerate(ground_truths)]}
    return [
        {"role": "system", "content": EXTRACTION_PACKED_SYSTEM},
        {
            "role": "user",
            "content": data_message(
                "Extract the atomic claims of each of these ground truths.", data
            ),
        },
    ]


def attribution_messages(claims: list[str], contexts: list[str]) -> list[dict[str, str]]:
    data = {
        "claims": [{"index": i, "text": text} for i, text in enumerate(claims)],
        "contexts": [{"index": i, "text": text} for i, text in enumerate(contexts)],
    }
    return [
        {"role": "system", "content": ATTRIBUTION_SYSTEM},
        {
            "role": "user",
            "content": data_message("Judge every claim against the contexts.", data),
        },
    ]


def repair_messages(
    messages: list[dict[str, str]], bad_answer: str | None, problem: str
) -> list[dict[str, str]]:
    """The conversation again, plus the bad answer and a user turn that asks for a valid one.
    That turn repeats the data block, so the last user message still carries the data."""
    data_block = messages[-1]["content"][messages[-1]["content"].index("```json") :]
    instruction = REPAIR_INSTRUCTION.format(problem=problem)
    return [
        *messages,
        {"role": "assistant", "content": bad_answer or ""},
        {"role": "user", "content": f"{instruction}\n\n{data_block}"},
    ]


def response_format(schema_name: str) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": schema_name, "schema": SCHEMAS[schema_name], "strict": True},
    }


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_answer(
    schema_name: str, content: str | None, finish_reason: str | None
) -> dict[str, Any]:
    """The model's JSON answer, checked for the schema's top-level shape."""
    if finish_reason == "length":
        raise ProtocolError("the answer was cut off (finish_reason=length)")
    if not content or not content.strip():
        raise ProtocolError("the answer was empty")
    text = content.strip()
    fenced = _FENCE.search(text)
    if fenced and not text.startswith("{"):
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(
            f"invalid JSON ({exc.msg} at char {exc.pos}): {_clip(content)}"
        ) from exc
    key = {EXTRACTION: "claims", EXTRACTION_PACKED: "items"}.get(schema_name, "verdicts")
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ProtocolError(f'expected an object with a "{key}" list, got: {_clip(content)}')
    if schema_name == EXTRACTION:
        data["claims"] = _claims(data["claims"])
    return data


def packed_claims(data: dict[str, Any], count: int) -> dict[int, list[str]]:
    """Claims per index of a packed answer, for the indices 0..count-1 it answers well (an
    entry whose index is out of range, repeated or whose claims are not a list is ignored:
    that item falls back to an extraction of its own)."""
    found: dict[int, list[str]] = {}
    for entry in data.get("items") or []:
        if not isinstance(entry, dict):
            continue
        index, claims = entry.get("index"), entry.get("claims")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            continue
        if index in found or not isinstance(claims, list):
            continue
        found[index] = _claims(claims)
    return found


def _claims(raw: list[Any]) -> list[str]:
    return [c.strip() for c in raw if isinstance(c, str) and c.strip()]


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
