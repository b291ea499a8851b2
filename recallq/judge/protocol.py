"""Judge protocol v1: prompts, JSON schemas and parsing of what the model answers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recallq.core.inputs import safe_text
from recallq.core.outcomes import Stage
from recallq.judge.lexical import STOPWORDS

PROMPT_VERSION = "v1"
EXTRACTION = "claim_extraction"
EXTRACTION_PACKED = "claim_extraction_packed"
ATTRIBUTION = "claim_attribution"
RELEVANCE = "context_relevance"
#: the stage each call of the protocol serves (what usage and metrics count it under)
STAGE_OF = {
    EXTRACTION: Stage.EXTRACTION,
    EXTRACTION_PACKED: Stage.EXTRACTION,
    ATTRIBUTION: Stage.ATTRIBUTION,
    RELEVANCE: Stage.RELEVANCE,
}

EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"claims": {"type": "array", "items": {"type": "string"}}},
    "required": ["claims"],
    "additionalProperties": False,
}


def _verdicts_schema(index: str, **more: dict[str, Any]) -> dict[str, Any]:
    """An answer of verdicts, each naming what it judges by `index`, with `more` fields."""
    verdict = {
        index: {"type": "integer"},
        "verdict": {"type": "string", "enum": ["yes", "no"]},
        **more,
        "reason": {"type": "string"},
    }
    return {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": verdict,
                    "required": list(verdict),
                    "additionalProperties": False,
                },
            }
        },
        "required": ["verdicts"],
        "additionalProperties": False,
    }


ATTRIBUTION_SCHEMA = _verdicts_schema(
    "claim_index", context_indices={"type": "array", "items": {"type": "integer"}}
)

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

RELEVANCE_SCHEMA = _verdicts_schema("context_index")

SCHEMAS = {
    EXTRACTION: EXTRACTION_SCHEMA,
    EXTRACTION_PACKED: EXTRACTION_PACKED_SCHEMA,
    ATTRIBUTION: ATTRIBUTION_SCHEMA,
    RELEVANCE: RELEVANCE_SCHEMA,
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
- context_indices lists the index of every context that supports a "yes" claim: all of them, \
not only the first one found; [] for "no".
- reason: one short sentence citing the supporting text, or saying what is missing.
- Give exactly one verdict per claim, using its claim_index.
- Answer only with JSON of the form {"verdicts": [{"claim_index": 0, "verdict": "yes", \
"context_indices": [0], "reason": "..."}]}."""

RELEVANCE_SYSTEM = """\
You judge whether each retrieved context passage is relevant to a reference answer.

Rules:
- "yes" when the passage states at least one fact of the reference answer (an entity, number, \
date or qualifier of it, stated or directly entailed); "no" when it states none of them, even \
if it is on the same topic.
- Judge each passage on its own; use only its text and the reference answer.
- reason: one short sentence naming the fact it states, or saying it states none.
- Give exactly one verdict per passage, using its index as context_index.
- Answer only with JSON of the form {"verdicts": [{"context_index": 0, "verdict": "yes", \
"reason": "..."}]}."""

REPAIR_INSTRUCTION = (
    "Your previous answer could not be used: {problem}. Answer again for the same data with "
    "only the JSON object described above, complete and valid."
)


class ProtocolError(ValueError):
    """The model's answer is not valid JSON of the expected shape."""


class AnswerTooLarge(ProtocolError):
    """The answer is over one of the answer limits. Never repaired: a repair request would send
    the oversized answer back, and nothing of it is stored; the item fails with this message."""


@dataclass(frozen=True)
class AnswerLimits:
    """How much of a judge's answer recallq takes (RECALLQ_JUDGE_MAX_*, recallq.settings).
    `answer_bytes` is checked before the JSON is parsed, the others on the parsed answer."""

    answer_bytes: int = 1024 * 1024
    claims: int = 500
    claim_chars: int = 2000
    reason_chars: int = 2000


DEFAULT_LIMITS = AnswerLimits()

#: Takes secrets out of one text (a recallq.core.redact.Redactor); the identity when none is given.
Redact = Callable[[str], str]


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


def relevance_messages(
    ground_truth: str, contexts: Sequence[tuple[int, str]]
) -> list[dict[str, str]]:
    """The context_relevance call: the ground truth and the passages (each with its own index
    in the item's context: a re-ask sends only those left without a verdict)."""
    data = {
        "ground_truth": ground_truth,
        "contexts": [{"index": i, "text": text} for i, text in contexts],
    }
    return [
        {"role": "system", "content": RELEVANCE_SYSTEM},
        {
            "role": "user",
            "content": data_message(
                "Judge whether each context passage states a fact of this ground truth.", data
            ),
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
    schema_name: str,
    content: str | None,
    finish_reason: str | None,
    limits: AnswerLimits = DEFAULT_LIMITS,
    redact: Redact | None = None,
) -> dict[str, Any]:
    """The model's JSON answer, checked for the schema's top-level shape and the answer limits
    (AnswerTooLarge), with every string in it made storable (a NUL or a lone surrogate is
    U+FFFD) and passed through `redact`: an answer is untrusted text, and a judge may echo the
    request's key into a claim or a reason."""
    if content is not None:
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > limits.answer_bytes:
            raise AnswerTooLarge(
                f"the judge's answer is {size:,} bytes, over the limit of "
                f"{limits.answer_bytes:,} (RECALLQ_JUDGE_MAX_ANSWER_BYTES)"
            )
    if finish_reason == "length":
        raise ProtocolError("the answer was cut off (finish_reason=length)")
    if not content or not content.strip():
        raise ProtocolError("the answer was empty")
    text = content.strip()
    fenced = _FENCE.search(text)
    if fenced and not text.startswith("{"):
        text = fenced.group(1).strip()
    clip = _clip(safe_text(content if redact is None else redact(content)))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"invalid JSON ({exc.msg} at char {exc.pos}): {clip}") from exc
    except RecursionError:
        raise ProtocolError(f"JSON nested too deeply: {clip}") from None
    key = {EXTRACTION: "claims", EXTRACTION_PACKED: "items"}.get(schema_name, "verdicts")
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ProtocolError(f'expected an object with a "{key}" list, got: {clip}')
    # every string made storable (no NUL, no lone surrogate) and, with `redact`, redacted
    try:
        data = {key: _redacted(value, _storable(redact)) for key, value in data.items()}
    except RecursionError:
        raise ProtocolError(f"JSON nested too deeply: {clip}") from None
    if schema_name == EXTRACTION:
        data["claims"] = _claims(data["claims"])
        check_claims(data["claims"], limits)
    elif schema_name in (ATTRIBUTION, RELEVANCE):
        _check_reasons(data["verdicts"], limits)
    return data


def check_claims(claims: Sequence[str], limits: AnswerLimits) -> None:
    """AnswerTooLarge when one item's claims are over the limits."""
    if len(claims) > limits.claims:
        raise AnswerTooLarge(
            f"the judge answered {len(claims):,} claims, over the limit of {limits.claims:,} "
            "per item (RECALLQ_JUDGE_MAX_CLAIMS)"
        )
    longest = max(map(len, claims), default=0)
    if longest > limits.claim_chars:
        raise AnswerTooLarge(
            f"the judge answered a claim of {longest:,} characters, over the limit of "
            f"{limits.claim_chars:,} (RECALLQ_JUDGE_MAX_CLAIM_CHARS)"
        )


def _check_reasons(verdicts: list[Any], limits: AnswerLimits) -> None:
    reasons = (v.get("reason") for v in verdicts if isinstance(v, dict))
    longest = max((len(r) for r in reasons if isinstance(r, str)), default=0)
    if longest > limits.reason_chars:
        raise AnswerTooLarge(
            f"the judge answered a reason of {longest:,} characters, over the limit of "
            f"{limits.reason_chars:,} (RECALLQ_JUDGE_MAX_REASON_CHARS)"
        )


def _storable(redact: Redact | None) -> Redact:
    """What every string of an answer goes through: NULs and lone surrogates replaced (Postgres
    text holds no NUL, UTF-8 no lone surrogate: such a reason made the item unreadable), then
    `redact`."""
    if redact is None:
        return safe_text
    return lambda text: redact(safe_text(text))


def _redacted(value: Any, redact: Redact) -> Any:
    """`value` with every string in it (keys aside) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v, redact) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, redact) for k, v in value.items()}
    return value


# --- packed answers: one item's text decides nothing about another item's claims ------------

#: A packed answer's claim is taken for its item only when at least this share of its content
#: words is in the item's own ground truth (docs/judge-answers.md).
MIN_GROUNDING = 0.5
_WORD = re.compile(r"[^\W_]+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def content_words(text: str) -> set[str]:
    """The words that tie a claim to the text it came from: lowercase, stop words left out,
    cut to their first five letters so that plurals and tenses of one word agree ("awarded",
    "awards"); a number is kept whole, without its thousands separators ("1,000" is "1000")."""
    words = set()
    for word in _WORD.findall(_THOUSANDS.sub("", text.lower())):
        if _is_number(word):
            words.add(word)
        elif word not in STOPWORDS:
            words.add(word[:5])
    return words


def grounded_claim(claim: str, own: set[str], others: Sequence[set[str]]) -> bool:
    """Whether a claim of a packed answer is its own item's: it has content words, every
    number of it is in its own ground truth (`own`: that text's content words), at least
    MIN_GROUNDING of its words are, and no other ground truth of the pack holds more of them.
    Anything else fails closed: the item is extracted alone."""
    words = content_words(claim)
    if not words or any(_is_number(word) and word not in own for word in words):
        return False
    share = len(words & own) / len(words)
    return share >= MIN_GROUNDING and all(
        len(words & other) / len(words) <= share for other in others
    )


def packed_claims(
    data: dict[str, Any], ground_truths: Sequence[str], limits: AnswerLimits = DEFAULT_LIMITS
) -> dict[int, list[str]]:
    """Claims per index of a packed answer, for the indices of `ground_truths` it answers
    well: once, with at least one claim, every claim grounded in that index's own ground truth
    (`grounded_claim`), within the answer limits. Every other item is extracted alone, in a
    call that carries no other item's text: an entry whose index is out of range or whose
    claims are not a list; every entry of an index answered more than once (which of them is
    honest cannot be told); an item answered with no claim or with one that is not grounded;
    an item over the answer limits."""
    entries: dict[int, Any] = {}
    repeated: set[int] = set()
    for entry in data.get("items") or []:
        if not isinstance(entry, dict):
            continue
        index, claims = entry.get("index"), entry.get("claims")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        if not 0 <= index < len(ground_truths):
            continue
        if index in entries:
            repeated.add(index)
        entries[index] = claims
    words = [content_words(text) for text in ground_truths]
    found: dict[int, list[str]] = {}
    for index, raw in entries.items():
        if index in repeated or not isinstance(raw, list):
            continue
        claims = _claims(raw)
        others = words[:index] + words[index + 1 :]
        if not claims or not all(grounded_claim(c, words[index], others) for c in claims):
            continue
        try:
            check_claims(claims, limits)
        except AnswerTooLarge:
            continue
        found[index] = claims
    return found


def _is_number(word: str) -> bool:
    return any(c.isdigit() for c in word)


def _claims(raw: list[Any]) -> list[str]:
    return [c.strip() for c in raw if isinstance(c, str) and c.strip()]


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
