"""OpenAI-compatible stub judge server speaking judge protocol v1 (recallq.judge.protocol).

Run it as a separate process::

    python -m tests.stub_llm --port 0 --latency-ms 20 --rate-429 0.05 --seed 1

It prints exactly one line ``STUB_READY http://127.0.0.1:PORT`` once listening. Workers reach
it through litellm with ``model="openai/stub-judge"`` and ``api_base="http://127.0.0.1:PORT/v1"``.

Endpoints:

* ``POST /v1/chat/completions`` (also ``/chat/completions``): deterministic judge answers.
* ``GET /v1/models``: one model, ``stub-judge``.
* ``POST /v1/files`` (multipart ``file`` + ``purpose``), ``GET /v1/files/{id}``,
  ``GET /v1/files/{id}/content`` (raw bytes), ``DELETE /v1/files/{id}``: the Files API, enough
  for batches (see below).
* ``POST /v1/batches``, ``GET /v1/batches[?limit=&after=]``, ``GET /v1/batches/{id}``,
  ``POST /v1/batches/{id}/cancel``: the Batch API for ``/v1/chat/completions``.
* ``GET|POST /_stub/config``: read / change fault-injection settings at runtime.
* ``GET /_stub/calls[?offset=&limit=]``: recorded requests; ``GET /_stub/stats``: counters,
  with ``usage_by_schema``: calls and prompt/completion tokens of the answered live calls of
  each schema (what a run's usage by stage must add up to), and under ``batches``
  ``lines_by_schema`` / ``usage_by_schema``: the same for the batch lines of each schema
  (``context_relevance`` lines included: the Batch API answers every schema a live call does).
* ``GET /_stub/batches``: every batch object plus its ``custom_ids`` and ``key_suffix``, in
  creation order, so tests can check that nothing was submitted twice.
* ``POST /_stub/reset``: clear records, counters, per-key state, the rpm window, files and
  batches; end an outage; reseed.

Judge schemas: ``claim_extraction`` (data ``{"ground_truth"}`` -> ``{"claims"}``),
``claim_attribution`` (data ``{"claims", "contexts"}`` -> ``{"verdicts"}``),
``claim_extraction_packed`` (data ``{"ground_truths": [{"index", "text"}]}`` ->
``{"items": [{"index", "claims"}]}``, each item's claims exactly those of a single extraction
of its text) and ``context_relevance`` (data ``{"ground_truth", "contexts"}`` ->
``{"verdicts": [{"context_index", "verdict", "reason"}]}``: a passage is relevant when it holds
every content word of one of the ground truth's claims, ``STUB_RELEVANCE_DROP_ONCE`` /
``STUB_RELEVANCE_DROP_ALWAYS`` leave the last passage without a verdict
once / always, ``STUB_RELEVANCE_BROKEN_ONCE`` makes the first answer to those passages broken
JSON, so its repair request is answered). The schema is the ``response_format`` json_schema
name, else inferred from the data keys. Besides these, RAGAS 0.4.3's context-recall prompt
(schema ``ragas_context_recall``, ``tests/stub_ragas.py``) is answered every statement
attributed, for side-by-side benches.

Content markers (in a ground truth, claim or context text):

* single calls: ``STUB_BROKEN_JSON``, ``STUB_TRUNCATE`` (finish_reason ``length``),
  ``STUB_WRONG_SHAPE``, ``STUB_DROP_VERDICT`` (first time only), ``STUB_ALWAYS_DROP``.
* packed calls: ``STUB_PACK_DROP`` leaves that item out of the packed answer;
  ``STUB_PACK_BROKEN`` anywhere makes the whole packed answer broken JSON. The single-call
  markers above do not apply to a packed answer (its items are plain claim lists), so the
  same text can fail a single call and still be packed, or the other way round.
* any call: ``STUB_HTTP_400`` -> 400 for the whole request.
* hostile answers: ``STUB_HUGE_CLAIMS`` in a ground truth adds 20,000 filler claims (about
  4.3 MB) to its extraction, single or packed; ``STUB_HUGE_REASON`` in a claim or context
  gives every verdict a 100,000-character reason. ``STUB_INJECT`` in a packed ground truth is
  an instruction the stub obeys only with ``follow_injections`` set (below).

Request handling order for chat completions: parse; an outage answers with its status; a key
in ``reject_keys`` gets 401; validation (malformed input, ``stream=true``, ``STUB_HTTP_400``
-> 400); none of those count in the rpm window or sleep. Then the rpm window (a refusal
does not sleep either), random 429 and 500 draws, latency sleep (for injected 429/500 and
answers alike), then the judge answer with content markers applied. Every request is
recorded, refused ones too, with ``key_suffix``: the last 4 characters of the bearer key
(never the whole key; null without a key or for a key of 4 characters or fewer), and
``client``: the address the request came from (which host, in the multi-host tests).

Config keys (``/_stub/config``, ``StubServer(**config)``; CLI flags for the first eight,
``--config JSON`` for any):

* ``latency_ms``, ``latency_jitter_ms``: answer delay; ``rate_429``, ``rate_500``: chances
  of an injected error, 429s sending ``Retry-After: retry_after_s``; ``rpm_limit``: a sliding
  60 s request window; ``seed``: of every random draw; ``record_messages``: keep prompts in
  ``/_stub/calls``.
* ``outage_s`` (float, 0 = none): an outage lasting that many seconds from the moment it is
  set; every chat completion is answered ``outage_status`` (default 503) with an OpenAI
  error body, plus a ``Retry-After: outage_retry_after`` header unless that is null.
  Recorded with fault ``outage``.
* ``reject_keys`` (list of keys): such a bearer key gets 401 whose message echoes the whole
  Authorization header, as real providers do (recallq must redact it). Fault
  ``rejected_key``. Applies to the Files and Batch endpoints too.
* ``batch_delay_s`` (default 1.0): a batch is ``validating`` when created, ``in_progress``
  while its lines are answered (in file order, in proportion to the time elapsed) and
  ``completed`` once that many seconds have passed since its creation.
* ``batch_line_fail_rate`` (0..1): seeded chance that a line fails with a 500 in the error
  file instead of being answered.
* ``follow_injections`` (null, ``"prepend"``, ``"replace"`` or ``"once"``): a judge that
  follows an instruction in a packed ground truth holding ``STUB_INJECT``: every *other*
  index of the pack is answered with that ground truth's first claim, either in extra
  entries before the honest ones (``prepend``: those indices are answered twice) or instead
  of them (``replace``); or (``once``) instead of them, each index once, with a claim that
  shares no word with any ground truth of the pack (``UNRELATED_CLAIMS``: the first such).
* ``echo_authorization`` (bool): every answer carries the request's ``Authorization``
  header: each claim list (single or packed) gets the claims ``"Authorization: <header>"``
  and ``"The request key is <key>"``, and each verdict's reason ends with the key.
* ``flip_rate`` (0..1), ``flip_seed`` (int), ``flip_per_call`` (bool): a judge that errs. Each
  attribution verdict of the rule below is flipped with probability ``flip_rate``: decided by
  a hash of the claim's text and ``flip_seed`` (the same claim flips in every call and every
  run), or with ``flip_per_call`` drawn afresh in each call from the seeded RNG. The rule
  (``attribute``) is then the "human" truth and the flip rate the judge's known error.
* ``relevance_verdicts`` (null or a list): a hostile judge that answers every
  ``context_relevance`` call ``{"verdicts": <that list>}`` verbatim, whatever it was asked
  (out-of-range or duplicated indices, verdicts that are neither yes nor no, any reason).
* ``batch_max_requests`` (default 50,000), ``batch_max_bytes`` (default 200 MB): larger input
  files are refused (400) when a batch is created from them, as are duplicate custom_ids,
  lines that are not ``{"custom_id", "method": "POST", "url": <endpoint>, "body"}`` and
  lines naming different models.

Batches: each line is answered by the same judge logic as a live call (markers apply,
including the packed form and the once-only drop state) but never meets rpm_limit, outages,
latency or random 429/500. Output lines, ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``, are written in a seeded shuffled order, so clients
must match them by custom_id; failed lines (injected 500s, and 400s for unusable bodies) go
to the error file in the same shape. Processing is lazy: it happens when the batch (or the
list, or the stats) is read. Cancelling answers ``cancelling``; the next read shows
``cancelled``, with output and error files holding only the lines answered before the
cancel (none if no line was). Batches and files stay in memory until the process ends or
``/_stub/reset``; batch lines are not in ``/_stub/calls`` but are counted in the
``batches`` section of ``/_stub/stats``.

``StubServer`` (bottom of this file) starts the server as a subprocess for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import email.parser
import email.utils
import hashlib
import http
import itertools
import json
import math
import os
import queue
import random
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests import stub_ragas

EXTRACTION = "claim_extraction"
ATTRIBUTION = "claim_attribution"
EXTRACTION_PACKED = "claim_extraction_packed"
RELEVANCE = "context_relevance"
SCHEMAS = (EXTRACTION, ATTRIBUTION, EXTRACTION_PACKED, RELEVANCE)
MARK_RELEVANCE_DROP_ONCE = "STUB_RELEVANCE_DROP_ONCE"
MARK_RELEVANCE_DROP_ALWAYS = "STUB_RELEVANCE_DROP_ALWAYS"
MARK_RELEVANCE_BROKEN_ONCE = "STUB_RELEVANCE_BROKEN_ONCE"

MARK_BROKEN_JSON = "STUB_BROKEN_JSON"
MARK_TRUNCATE = "STUB_TRUNCATE"
MARK_WRONG_SHAPE = "STUB_WRONG_SHAPE"
MARK_HTTP_400 = "STUB_HTTP_400"
MARK_DROP_VERDICT = "STUB_DROP_VERDICT"
MARK_ALWAYS_DROP = "STUB_ALWAYS_DROP"
MARK_PACK_DROP = "STUB_PACK_DROP"
MARK_PACK_BROKEN = "STUB_PACK_BROKEN"
# hostile judges (judge answers are untrusted input)
MARK_INJECT = "STUB_INJECT"
MARK_HUGE_CLAIMS = "STUB_HUGE_CLAIMS"
MARK_HUGE_REASON = "STUB_HUGE_REASON"
HUGE_CLAIMS = 20_000  # about 4.3 MB of claims, as the judge of issue 19 answered
HUGE_REASON_CHARS = 100_000
INJECT_STYLES = ("prepend", "replace", "once")
#: what a judge following an injection in the "once" style answers for every other index
UNRELATED_CLAIMS = (
    "The moon is made of green cheese",
    "Purple elephants juggle quietly",
    "Seven owls recite sonnets",
)

RPM_WINDOW_S = 60.0
READY_PREFIX = "STUB_READY "
REPO_ROOT = Path(__file__).resolve().parent.parent

BATCH_ENDPOINT = "/v1/chat/completions"
BATCH_WINDOW = "24h"
BATCH_WINDOW_S = 24 * 3600
SERVER_ERROR_MESSAGE = "The server had an error while processing your request."
API_KEYS_URL = "https://platform.openai.com/account/api-keys"
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])[ \t]+|[\r\n]+")
_WORD = re.compile(r"[^\W_]+")
_FENCE = "```json"


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass
class StubConfig:
    """Fault-injection settings; every field is a ``/_stub/config`` key (module docstring)."""

    latency_ms: float = 0.0
    latency_jitter_ms: float = 0.0
    rate_429: float = 0.0
    rate_500: float = 0.0
    retry_after_s: str = "1"
    rpm_limit: int | None = None
    seed: int | None = 0
    record_messages: bool = True
    outage_s: float = 0.0
    outage_status: int = 503
    outage_retry_after: str | None = None
    reject_keys: list[str] = dataclasses.field(default_factory=list)
    batch_delay_s: float = 1.0
    batch_line_fail_rate: float = 0.0
    batch_max_requests: int = 50_000
    batch_max_bytes: int = 200 * 1024 * 1024
    follow_injections: str | None = None  # None or one of INJECT_STYLES (module docstring)
    echo_authorization: bool = False
    flip_rate: float = 0.0
    flip_per_call: bool = False
    flip_seed: int = 0
    relevance_verdicts: list[Any] | None = None  # a hostile judge's verdicts (module docstring)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` after validating every key and value (all or nothing)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        coerced = {key: _coerce(key, value) for key, value in changes.items()}
        for key, value in coerced.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(key: str, value: Any) -> Any:
    if key in ("latency_ms", "latency_jitter_ms", "outage_s", "batch_delay_s"):
        number = float(value)
        if not number >= 0:  # also refuses NaN
            raise ValueError(f"{key} must be >= 0")
        return number
    if key in ("rate_429", "rate_500", "batch_line_fail_rate", "flip_rate"):
        rate = float(value)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{key} must be within 0..1")
        return rate
    if key == "retry_after_s":
        return _format_seconds(value)
    if key == "outage_retry_after":
        return None if value is None else _format_seconds(value)
    if key == "outage_status":
        status = int(value)
        if not 400 <= status <= 599:
            raise ValueError("outage_status must be an HTTP error status (400..599)")
        return status
    if key == "reject_keys":
        # A bare string would otherwise be taken as a list of one-character keys.
        if not isinstance(value, list | tuple) or not all(isinstance(k, str) for k in value):
            raise ValueError("reject_keys must be a list of strings")
        return list(value)
    if key in ("batch_max_requests", "batch_max_bytes"):
        limit = int(value)
        if limit < 1:
            raise ValueError(f"{key} must be >= 1")
        return limit
    if key == "rpm_limit":
        return None if value is None or int(value) <= 0 else int(value)
    if key == "seed":
        return None if value is None else int(value)
    if key in ("record_messages", "echo_authorization", "flip_per_call"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be a boolean")
        return value
    if key == "follow_injections":
        if value is not None and value not in INJECT_STYLES:
            raise ValueError(f"follow_injections must be null or one of {INJECT_STYLES}")
        return value
    if key == "flip_seed":
        return int(value)
    if key == "relevance_verdicts":
        if value is not None and not isinstance(value, list):
            raise ValueError("relevance_verdicts must be null or a list")
        return value
    raise ValueError(f"unknown config key: {key}")


def _format_seconds(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if not text:
        raise ValueError("a Retry-After value must not be empty")
    return text


# --------------------------------------------------------------------------- judge protocol


def message_text(message: Any) -> str:
    """Text of one chat message; list content (OpenAI content parts) is joined."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def extract_data(messages: Any) -> dict[str, Any] | None:
    """Parse the fenced ```json block of the last user message, or None."""
    if not isinstance(messages, list):
        return None
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None
    return parse_json_block(message_text(users[-1]))


def parse_json_block(text: str) -> dict[str, Any] | None:
    """First ```json fence whose body decodes to a JSON object (backticks in strings are fine)."""
    decoder = json.JSONDecoder()
    start = text.find(_FENCE)
    while start != -1:
        body = text[start + len(_FENCE) :].lstrip()
        try:
            value, _ = decoder.raw_decode(body)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find(_FENCE, start + len(_FENCE))
    return None


def schema_name(response_format: Any, data: dict[str, Any] | None) -> str | None:
    """The json_schema name when known, else inferred from the data keys."""
    if isinstance(response_format, dict):
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, dict) and json_schema.get("name") in SCHEMAS:
            return str(json_schema["name"])
    if not data:
        return None
    if "ground_truth" in data and "contexts" in data:
        return RELEVANCE
    if "ground_truth" in data:
        return EXTRACTION
    if "ground_truths" in data:
        return EXTRACTION_PACKED
    if "claims" in data and "contexts" in data:
        return ATTRIBUTION
    return None


def split_claims(ground_truth: str) -> list[str]:
    """Sentences split on '. ', '! ', '? ' and newlines, trailing punctuation stripped."""
    pieces = (piece.rstrip(".!? \t").strip() for piece in _SENTENCE_SPLIT.split(ground_truth))
    return [piece for piece in pieces if piece]


def content_words(text: str) -> set[str]:
    """Lowercase alphanumeric tokens of length >= 4."""
    return {word for word in _WORD.findall(text.lower()) if len(word) >= 4}


def unrelated_claim(texts: list[str]) -> str:
    """The first of UNRELATED_CLAIMS that shares no word with any of these texts."""
    words = set().union(*(_WORD.findall(text.lower()) for text in texts))
    for claim in UNRELATED_CLAIMS:
        if not words & set(_WORD.findall(claim.lower())):
            return claim
    raise ValueError("every one of UNRELATED_CLAIMS shares a word with these texts")


def indexed_texts(items: Any, field: str) -> list[tuple[int, str]]:
    """``[{"index", "text"}]`` (or plain strings, indexed by position) as (index, text) pairs."""
    if not isinstance(items, list):
        raise ValueError(f"'{field}' must be a list")
    pairs: list[tuple[int, str]] = []
    for position, item in enumerate(items):
        if isinstance(item, str):
            pairs.append((position, item))
        elif isinstance(item, dict) and isinstance(item.get("index"), int) and "text" in item:
            text = item["text"]
            pairs.append((item["index"], text if isinstance(text, str) else json.dumps(text)))
        else:
            raise ValueError(f"'{field}[{position}]' must be {{index: int, text: str}}")
    return pairs


def attribute(claims: list[tuple[int, str]], contexts: list[tuple[int, str]]) -> list[dict]:
    """A claim is supported by a context holding every one of the claim's content words."""
    context_words = [(index, content_words(text)) for index, text in contexts]
    verdicts = []
    for claim_index, text in claims:
        words = content_words(text)
        supporting = [index for index, ctx in context_words if words <= ctx]
        verdicts.append(
            {
                "claim_index": claim_index,
                "verdict": "yes" if supporting else "no",
                "context_indices": supporting,
                "reason": f"stub: supported by {supporting}" if supporting else "stub: unsupported",
            }
        )
    return verdicts


def relevance(ground_truth: str, contexts: list[tuple[int, str]]) -> list[dict]:
    """A passage is relevant when it states a fact of the ground truth: it holds every content
    word of one of its claims (the rule `attribute` supports a claim by, so a passage is
    relevant exactly when a supported claim cites it)."""
    claims = [content_words(claim) for claim in split_claims(ground_truth)]
    verdicts = []
    for index, text in contexts:
        words = content_words(text)
        relevant = any(claim <= words for claim in claims)
        verdicts.append(
            {
                "context_index": index,
                "verdict": "yes" if relevant else "no",
                "reason": "stub: states a fact" if relevant else "stub: states none",
            }
        )
    return verdicts


def flips_claim(text: str, rate: float, seed: int) -> bool:
    """Whether the deterministic flip mode flips the verdict on a claim of this text: the
    same answer for the same text, seed and rate in every call and every process."""
    if rate <= 0:
        return False
    digest = hashlib.sha256(f"{seed}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def flipped(verdict: dict[str, Any], contexts: list[tuple[int, str]]) -> dict[str, Any]:
    """The opposite verdict: a flipped "yes" cites the first context."""
    if verdict["verdict"] == "yes":
        return {**verdict, "verdict": "no", "context_indices": [], "reason": "stub: flipped"}
    cited = [contexts[0][0]] if contexts else []
    return {**verdict, "verdict": "yes", "context_indices": cited, "reason": "stub: flipped"}


def packed_items(ground_truths: list[tuple[int, str]]) -> tuple[list[dict[str, Any]], int]:
    """The packed answer's items (request order) and how many STUB_PACK_DROP left out.

    Each item holds exactly the claims a single extraction of its text would give, so a
    client may mix packed and single answers for the same ground truths.
    """
    items = [
        {"index": index, "claims": extraction_claims(text)}
        for index, text in ground_truths
        if MARK_PACK_DROP not in text
    ]
    return items, len(ground_truths) - len(items)


def extraction_claims(ground_truth: str) -> list[str]:
    """The honest claims of a ground truth, plus 20,000 filler claims for STUB_HUGE_CLAIMS."""
    claims = split_claims(ground_truth)
    if MARK_HUGE_CLAIMS in ground_truth:
        filler = "This filler claim was answered by a judge that never stops talking " * 3
        claims += [f"{filler}(number {n})" for n in range(HUGE_CLAIMS)]
    return claims


def ground_truth_text(data: dict[str, Any]) -> str:
    value = data.get("ground_truth")
    return value if isinstance(value, str) else json.dumps(value)


def marker_text(schema: str, data: dict[str, Any]) -> str:
    """The text searched for STUB_* markers: ground truth(s), or claim and context texts."""
    if schema == EXTRACTION:
        return ground_truth_text(data)
    if schema == RELEVANCE:
        pairs = [(-1, ground_truth_text(data))] + indexed_texts(data.get("contexts"), "contexts")
        return "\n".join(text for _, text in pairs)
    if schema == EXTRACTION_PACKED:
        pairs = indexed_texts(data.get("ground_truths"), "ground_truths")
    else:
        pairs = indexed_texts(data.get("claims"), "claims")
        pairs += indexed_texts(data.get("contexts"), "contexts")
    return "\n".join(text for _, text in pairs)


def validate_data(schema: str | None, data: dict[str, Any] | None) -> str | None:
    """An error message for an unusable request, else None."""
    if data is None:
        return "last user message must carry one fenced ```json block holding an object"
    if schema is None:
        return "cannot tell the judge schema from response_format or data keys"
    try:
        text = marker_text(schema, data)
    except ValueError as exc:
        return str(exc)
    if MARK_HTTP_400 in text:
        return f"{MARK_HTTP_400} marker in request data"
    return None


def parse_request(raw: bytes) -> tuple[dict, dict | None, str | None, str | None]:
    """(body, data, schema, problem): problem is the 400 message for an unusable request."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return parse_body(body)


def parse_body(body: Any) -> tuple[dict, dict | None, str | None, str | None]:
    """``parse_request`` for an already decoded body (a batch line's ``body``)."""
    if not isinstance(body, dict):
        return {}, None, None, "request body must be a JSON object"
    if body.get("stream"):
        return body, None, None, "stream=true is not supported by the stub"
    data = extract_data(body.get("messages"))
    if data is None:  # not recallq's protocol: RAGAS's context-recall call (benches), else 400
        ragas = stub_ragas.context_recall_data(body.get("messages"))
        if ragas is not None:
            return body, ragas, stub_ragas.CONTEXT_RECALL, None
    schema = schema_name(body.get("response_format"), data)
    return body, data, schema, validate_data(schema, data)


def data_key(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- HTTP helpers


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (None without one)."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def key_suffix(key: str | None) -> str | None:
    """The last 4 characters of a key, enough to tell keys apart in records; None for keys
    too short to show part of them without showing all of them."""
    return key[-4:] if key is not None and len(key) > 4 else None


def error_body(message: str, err_type: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def rejected_key_body(authorization: str) -> dict[str, Any]:
    """OpenAI's 401 body. It quotes the header, key and all: that is what providers do and
    what recallq has to redact before it stores or logs an error."""
    message = (
        f"Incorrect API key provided: {authorization}. You can find your API key at {API_KEYS_URL}."
    )
    return error_body(message, "invalid_request_error", "invalid_api_key")


def outage_body(status: int) -> dict[str, Any]:
    """An OpenAI-style error body for an outage answered with ``status``."""
    if status == 429:
        return error_body("Rate limit reached", "requests", "rate_limit_exceeded")
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    message = "The server is overloaded or not ready yet." if status == 503 else phrase
    return error_body(message, "server_error" if status >= 500 else "invalid_request_error", None)


def completion_body(request_id: str, model: str, answer: Answer, prompt_chars: int) -> dict:
    prompt_tokens = prompt_chars // 4
    completion_tokens = len(answer.content) // 4
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "stub",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer.content, "refusal": None},
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Fields of a multipart/form-data body: name -> (filename or None, raw bytes).

    Done here rather than with Starlette's ``request.form()`` because that needs the
    python-multipart package, which recallq does not otherwise depend on.
    """
    headers = email.parser.HeaderParser().parsestr(f"Content-Type: {content_type}\r\n\r\n")
    boundary = headers.get_param("boundary")
    if headers.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise ValueError("expected a multipart/form-data body with a boundary")
    delimiter = b"--" + boundary.encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise ValueError("multipart body is not terminated by its closing boundary")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for chunk in chunks[1:-1]:
        head, separator, content = chunk.partition(b"\r\n\r\n")
        if not separator or not content.endswith(b"\r\n"):
            raise ValueError("malformed multipart part")
        part = email.parser.BytesHeaderParser().parsebytes(head.lstrip(b"\r\n") + b"\r\n\r\n")
        name = part.get_param("name", header="content-disposition")
        if name is None:
            raise ValueError("multipart part without a name")
        filename = part.get_filename()
        fields[email.utils.collapse_rfc2231_value(name)] = (filename, content[:-2])
    return fields


# --------------------------------------------------------------------------- batches (pure)


@dataclasses.dataclass
class BatchLine:
    custom_id: str
    body: dict[str, Any]


def parse_batch_input(
    content: bytes, endpoint: str, max_requests: int, max_bytes: int
) -> tuple[list[BatchLine], str]:
    """The requests of a batch input file and the one model they name.

    Raises ValueError (a 400 for the client) for a file over either limit, a line that is not
    ``{"custom_id", "method": "POST", "url": endpoint, "body": {"model", ...}}``, a repeated
    custom_id or a second model: a provider checks all of these before it runs a line.
    """
    if len(content) > max_bytes:
        raise ValueError(f"input file is {len(content)} bytes, over the limit of {max_bytes}")
    numbered = [(n, line) for n, line in enumerate(content.splitlines(), 1) if line.strip()]
    if not numbered:
        raise ValueError("input file holds no requests")
    if len(numbered) > max_requests:
        raise ValueError(
            f"input file holds {len(numbered)} requests, over the limit of {max_requests}"
        )
    lines: list[BatchLine] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in numbered:
        try:
            request = json.loads(raw)
        except ValueError:
            raise ValueError(f"line {number}: not valid JSON") from None
        if not isinstance(request, dict):
            raise ValueError(f"line {number}: must be a JSON object")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError(f"line {number}: custom_id must be a non-empty string")
        if custom_id in seen:
            raise ValueError(f"line {number}: duplicate custom_id {custom_id!r}")
        seen.add(custom_id)
        if request.get("method") != "POST":
            raise ValueError(f"line {number}: method must be POST")
        if request.get("url") != endpoint:
            raise ValueError(f"line {number}: url must be {endpoint}, the batch's endpoint")
        body = request.get("body")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise ValueError(f"line {number}: body must be an object naming a model")
        if model is not None and body["model"] != model:
            raise ValueError(f"line {number}: model {body['model']!r} differs from {model!r}")
        model = body["model"]
        lines.append(BatchLine(custom_id, body))
    assert model is not None
    return lines, model


def batch_result_line(line_id: str, custom_id: str, status: int, body: dict) -> str:
    """One line of a batch output or error file, as OpenAI writes them: an HTTP-level
    failure keeps ``error`` null and carries the status and error body in ``response``."""
    response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body}
    record = {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
    return json.dumps(record, separators=(",", ":"))


@dataclasses.dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def as_object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclasses.dataclass
class BatchJob:
    """One batch: what was asked, how far its lines got, and what they produced."""

    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    model: str
    lines: list[BatchLine]
    rng: random.Random
    delay_s: float
    started: float  # time.monotonic() at creation: the delay is measured from it
    created_at: int
    key_suffix: str | None
    status: str = "validating"
    processed: int = 0
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    outputs: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None

    def due(self, now: float) -> int:
        """How many lines should have been answered by ``now``: all of them once the delay
        is over, before that a share in proportion to the time elapsed."""
        elapsed = now - self.started
        if self.delay_s <= 0 or elapsed >= self.delay_s:
            return len(self.lines)
        return min(len(self.lines), int(len(self.lines) * elapsed / self.delay_s))

    def as_object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.created_at + BATCH_WINDOW_S,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {
                "total": len(self.lines),
                "completed": self.completed,
                "failed": self.failed,
            },
            "usage": {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
            "metadata": self.metadata,
        }


def batch_request(payload: Any) -> tuple[str, str, dict[str, str] | None]:
    """(input_file_id, endpoint, metadata) of a ``POST /v1/batches`` body; ValueError if bad."""
    if not isinstance(payload, dict):
        raise ValueError("request body must be a JSON object")
    input_file_id = payload.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise ValueError("input_file_id is required")
    endpoint = payload.get("endpoint")
    if endpoint != BATCH_ENDPOINT:
        raise ValueError(f"endpoint must be {BATCH_ENDPOINT} (the stub only batches those)")
    if payload.get("completion_window") != BATCH_WINDOW:
        raise ValueError(f"completion_window must be {BATCH_WINDOW!r}")
    metadata = payload.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ValueError("metadata must map strings to strings")
    return input_file_id, endpoint, metadata


# --------------------------------------------------------------------------- server state


@dataclasses.dataclass
class Answer:
    content: str
    finish_reason: str = "stop"
    fault: str | None = None


class NotFound(LookupError):
    """An unknown file or batch id: a 404 for the client."""


class Conflict(RuntimeError):
    """An operation the object's state does not allow: a 409 for the client."""


class StubState:
    """Configuration, RNG, recordings, counters, per-key state, files and batches of one
    server process."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        # Each record is kept as compact JSON text: ~6x smaller than the parsed dicts, which
        # matters for 200k+ request benchmarks, and /_stub/calls only has to join them.
        self.records: list[str] = []
        self.by_status: collections.Counter[str] = collections.Counter()
        self.by_schema: collections.Counter[str] = collections.Counter()
        self.by_fault: collections.Counter[str] = collections.Counter()
        # what the answered live calls used, per schema: {schema: {calls, prompt_tokens, ...}}
        self.usage_by_schema: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.window: collections.deque[float] = collections.deque()
        self.dropped_once: set[str] = set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.ids = itertools.count(1)
        self.outage_until: float | None = None
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, BatchJob] = {}  # creation order, which /_stub/batches keeps
        self.batch_counts: collections.Counter[str] = collections.Counter()
        self.batch_lines_by_schema: collections.Counter[str] = collections.Counter()
        # what the answered batch lines used, per schema, as usage_by_schema for live calls
        self.batch_usage_by_schema: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self._start_outage()

    def configure(self, changes: dict[str, Any]) -> None:
        self.config.update(changes)
        if "seed" in changes:
            self.rng = random.Random(self.config.seed)
        if "outage_s" in changes:
            self._start_outage()

    def reset(self) -> None:
        self.records.clear()
        self.by_status.clear()
        self.by_schema.clear()
        self.by_fault.clear()
        self.usage_by_schema.clear()
        self.window.clear()
        self.dropped_once.clear()
        self.max_in_flight = self.in_flight
        self.rng = random.Random(self.config.seed)
        # An outage is a window in time, not a standing setting: a reset (what a test's clean
        # fixture does) ends it, so one test's outage never leaks into the next.
        self.config.outage_s = 0.0
        self.outage_until = None
        self.files.clear()
        self.batches.clear()
        self.batch_counts.clear()
        self.batch_lines_by_schema.clear()
        self.batch_usage_by_schema.clear()

    # -- faults -------------------------------------------------------------------------

    def _start_outage(self) -> None:
        seconds = self.config.outage_s
        self.outage_until = time.monotonic() + seconds if seconds > 0 else None

    def in_outage(self) -> bool:
        return self.outage_until is not None and time.monotonic() < self.outage_until

    def admit(self) -> int | None:
        """Enter the rpm window; return Retry-After seconds when the limit refuses the call."""
        now = time.monotonic()
        while self.window and self.window[0] <= now - RPM_WINDOW_S:
            self.window.popleft()
        limit = self.config.rpm_limit
        if limit is not None and len(self.window) >= limit:
            frees_at = self.window[len(self.window) - limit] + RPM_WINDOW_S
            return max(1, math.ceil(frees_at - now))
        self.window.append(now)
        return None

    def rpm_remaining(self) -> int | None:
        limit = self.config.rpm_limit
        return None if limit is None else max(0, limit - len(self.window))

    def latency_s(self) -> float:
        jitter = self.config.latency_jitter_ms
        offset = self.rng.uniform(-jitter, jitter) if jitter > 0 else 0.0
        return max(0.0, self.config.latency_ms + offset) / 1000.0

    # -- judging ------------------------------------------------------------------------

    def answer(self, schema: str, data: dict[str, Any], authorization: str | None = None) -> Answer:
        if schema == stub_ragas.CONTEXT_RECALL:
            return Answer(stub_ragas.context_recall_answer(data))
        marked = marker_text(schema, data)
        if schema == EXTRACTION_PACKED:
            return self._hostile(self._packed_answer(data, marked), authorization)
        if MARK_BROKEN_JSON in marked:
            opening = '{"claims": [' if schema == EXTRACTION else '{"verdicts": ['
            return Answer(opening, fault=MARK_BROKEN_JSON)
        if schema == RELEVANCE and MARK_RELEVANCE_BROKEN_ONCE in marked:
            key = data_key({"broken": data.get("ground_truth"), "contexts": data.get("contexts")})
            if key not in self.dropped_once:
                self.dropped_once.add(key)
                return Answer('{"verdicts": [', fault=MARK_RELEVANCE_BROKEN_ONCE)
        if MARK_WRONG_SHAPE in marked:
            return Answer(json.dumps({"answer": 42}), fault=MARK_WRONG_SHAPE)
        payload, fault = self._payload(schema, data, marked)
        content = json.dumps(payload)
        if MARK_TRUNCATE in marked:
            return Answer(content[: max(1, len(content) // 2)], "length", MARK_TRUNCATE)
        return self._hostile(Answer(content, fault=fault), authorization)

    def _hostile(self, answer: Answer, authorization: str | None) -> Answer:
        """The answer with the request's Authorization header echoed into it, when so set."""
        if not self.config.echo_authorization or authorization is None:
            return answer
        try:
            payload = json.loads(answer.content)
        except ValueError:
            return answer
        key = bearer_key(authorization) or authorization
        echoed = [f"Authorization: {authorization}", f"The request key is {key}"]
        if isinstance(payload.get("claims"), list):
            payload["claims"] += echoed
        for entry in payload.get("items") or []:
            entry["claims"] += echoed
        for verdict in payload.get("verdicts") or []:
            verdict["reason"] += f" (sent with key {key})"
        return Answer(json.dumps(payload), answer.finish_reason, "echoed_authorization")

    def _packed_answer(self, data: dict[str, Any], marked: str) -> Answer:
        if MARK_PACK_BROKEN in marked:
            return Answer('{"items": [', fault=MARK_PACK_BROKEN)
        ground_truths = indexed_texts(data["ground_truths"], "ground_truths")
        items, dropped = packed_items(ground_truths)
        style = self.config.follow_injections
        injector = next((text for _, text in ground_truths if MARK_INJECT in text), None)
        if style is not None and injector is not None:
            if style == "once":
                injected = [unrelated_claim([text for _, text in ground_truths])]
            else:
                injected = split_claims(injector)[:1]
            forged = [
                {"index": index, "claims": injected}
                for index, text in ground_truths
                if text is not injector
            ]
            if style == "prepend":
                items = forged + items
            else:
                by_index = {entry["index"]: entry for entry in forged}
                items = [by_index.get(entry["index"], entry) for entry in items]
            return Answer(json.dumps({"items": items}), fault="followed_injection")
        return Answer(json.dumps({"items": items}), fault="pack_dropped" if dropped else None)

    def _payload(self, schema: str, data: dict[str, Any], marked: str) -> tuple[dict, str | None]:
        if schema == EXTRACTION:
            return {"claims": extraction_claims(ground_truth_text(data))}, None
        if schema == RELEVANCE:
            return self._relevance(data, marked)
        claims = indexed_texts(data["claims"], "claims")
        contexts = indexed_texts(data["contexts"], "contexts")
        verdicts = self._flip(claims, contexts, attribute(claims, contexts))
        if MARK_HUGE_REASON in marked:
            for verdict in verdicts:
                verdict["reason"] = "because " * (HUGE_REASON_CHARS // 8)
        if verdicts and self._drop_last(data, claims, marked):
            return {"verdicts": verdicts[:-1]}, "dropped_verdict"
        return {"verdicts": verdicts}, None

    def _flip(
        self, claims: list[tuple[int, str]], contexts: list[tuple[int, str]], verdicts: list[dict]
    ) -> list[dict]:
        """The judge-error mode: each verdict flipped with probability flip_rate, decided by
        the claim's text (flip_seed) or, with flip_per_call, drawn afresh in every call."""
        rate = self.config.flip_rate
        if rate <= 0:
            return verdicts
        texts = dict(claims)
        out = []
        for verdict in verdicts:
            if self.config.flip_per_call:
                flip = self.rng.random() < rate
            else:
                flip = flips_claim(texts[verdict["claim_index"]], rate, self.config.flip_seed)
            out.append(flipped(verdict, contexts) if flip else verdict)
        return out

    def _relevance(self, data: dict[str, Any], marked: str) -> tuple[dict, str | None]:
        """context_relevance: STUB_RELEVANCE_DROP_ALWAYS always leaves the last passage without
        a verdict, STUB_RELEVANCE_DROP_ONCE the first time those passages are asked."""
        if self.config.relevance_verdicts is not None:
            return {"verdicts": self.config.relevance_verdicts}, "hostile_relevance"
        contexts = indexed_texts(data["contexts"], "contexts")
        verdicts = relevance(ground_truth_text(data), contexts)
        drop = MARK_RELEVANCE_DROP_ALWAYS in marked
        if MARK_RELEVANCE_DROP_ONCE in marked and verdicts:
            # the last passage, the one dropped: a re-ask carries only it, and is answered
            key = data_key({"ground_truth": data.get("ground_truth"), "last": contexts[-1][1]})
            drop = key not in self.dropped_once
            self.dropped_once.add(key)
        if drop and verdicts:
            return {"verdicts": verdicts[:-1]}, "dropped_verdict"
        return {"verdicts": verdicts}, None

    def _drop_last(self, data: dict[str, Any], claims: list[tuple[int, str]], marked: str) -> bool:
        """STUB_ALWAYS_DROP always drops; STUB_DROP_VERDICT drops once per claim set.

        The key hashes the data without claim indices, so both a verbatim repeat and a re-ask
        carrying only the missing (last) claim are treated as the repeat, answered fully.
        """
        if MARK_ALWAYS_DROP in marked:
            return True
        if MARK_DROP_VERDICT not in marked:
            return False
        key = data_key({"last_claim": claims[-1][1], "contexts": data.get("contexts")})
        if key in self.dropped_once:
            return False
        self.dropped_once.add(key)
        return True

    def complete(
        self,
        body: dict[str, Any],
        schema: str,
        data: dict[str, Any],
        authorization: str | None = None,
    ) -> tuple[Answer, dict[str, Any]]:
        """The judge answer and the chat.completion object carrying it (live and batch)."""
        answer = self.answer(schema, data, authorization)
        prompt_chars = sum(len(message_text(m)) for m in body.get("messages") or [])
        request_id = f"chatcmpl-stub-{next(self.ids)}"
        return answer, completion_body(request_id, str(body.get("model", "")), answer, prompt_chars)

    # -- files and batches ----------------------------------------------------------------

    def add_file(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}", filename, purpose, content, int(time.time())
        )
        self.files[stored.id] = stored
        return stored

    def file(self, file_id: str) -> StoredFile:
        try:
            return self.files[file_id]
        except KeyError:
            raise NotFound(f"No such File object: {file_id}") from None

    def batch(self, batch_id: str) -> BatchJob:
        try:
            job = self.batches[batch_id]
        except KeyError:
            raise NotFound(f"No batch found with id '{batch_id}'.") from None
        self.advance(job)
        return job

    def create_batch(self, payload: Any, key: str | None) -> BatchJob:
        """A new batch (status validating); ValueError or NotFound when it cannot be made."""
        input_file_id, endpoint, metadata = batch_request(payload)
        source = self.file(input_file_id)
        if source.purpose != "batch":
            raise ValueError(f"file {input_file_id} has purpose {source.purpose!r}, not 'batch'")
        lines, model = parse_batch_input(
            source.content, endpoint, self.config.batch_max_requests, self.config.batch_max_bytes
        )
        # Each batch draws its failures and output order from its own generator, so one
        # batch's results do not depend on live traffic or on other batches.
        number = self.batch_counts["created"]
        seed = None if self.config.seed is None else f"{self.config.seed}:{number}"
        job = BatchJob(
            id=f"batch_{uuid.uuid4().hex}",
            input_file_id=input_file_id,
            endpoint=endpoint,
            completion_window=BATCH_WINDOW,
            metadata=metadata,
            model=model,
            lines=lines,
            rng=random.Random(seed),
            delay_s=self.config.batch_delay_s,
            started=time.monotonic(),
            created_at=int(time.time()),
            key_suffix=key_suffix(key),
        )
        self.batches[job.id] = job
        self.batch_counts["created"] += 1
        self.batch_counts["lines_total"] += len(lines)
        return job

    def advance(self, job: BatchJob) -> None:
        """Bring a batch up to date: answer the lines now due, finish it when they all are,
        or finish a cancel."""
        if job.status == "cancelling":
            self._finish(job, "cancelled")
            return
        if job.status not in ("validating", "in_progress"):
            return
        if job.status == "validating":
            job.status = "in_progress"
            job.in_progress_at = int(time.time())
        due = job.due(time.monotonic())
        while job.processed < due:
            self._run_line(job, job.lines[job.processed])
            job.processed += 1
        if job.processed == len(job.lines):
            job.finalizing_at = int(time.time())
            self._finish(job, "completed")

    def cancel(self, batch_id: str) -> BatchJob:
        job = self.batch(batch_id)  # answers the lines due so far: they count as done
        if job.status == "in_progress":
            job.status = "cancelling"
            job.cancelling_at = int(time.time())
        elif job.status not in ("cancelling", "cancelled"):
            raise Conflict(f"Cannot cancel a batch with status '{job.status}'.")
        return job

    def _run_line(self, job: BatchJob, line: BatchLine) -> None:
        # Draw for every line, usable or not, so which lines fail depends only on the seed
        # and the line's position.
        fails = job.rng.random() < self.config.batch_line_fail_rate
        body, data, schema, problem = parse_body(line.body)
        line_id = f"batch_req_{job.id.removeprefix('batch_')}_{job.processed}"
        self.batch_lines_by_schema[schema or "unknown"] += 1
        if problem is None and not fails:
            assert schema is not None and data is not None
            _, completion = self.complete(body, schema, data)
            job.outputs.append(batch_result_line(line_id, line.custom_id, 200, completion))
            self.count_usage(schema, completion["usage"], self.batch_usage_by_schema)
            job.completed += 1
            job.prompt_tokens += completion["usage"]["prompt_tokens"]
            job.completion_tokens += completion["usage"]["completion_tokens"]
            self.batch_counts["lines_completed"] += 1
            return
        if problem is not None:  # what a live call would have got as a 400
            status, payload = 400, error_body(problem, "invalid_request_error", None)
        else:
            status, payload = 500, error_body(SERVER_ERROR_MESSAGE, "server_error", None)
        job.errors.append(batch_result_line(line_id, line.custom_id, status, payload))
        job.failed += 1
        self.batch_counts["lines_failed"] += 1

    def _finish(self, job: BatchJob, status: str) -> None:
        """Write the output and error files (shuffled: clients must match by custom_id)."""
        now = int(time.time())
        job.status = status
        if status == "completed":
            job.completed_at = now
        else:
            job.cancelled_at = now
        for results, kind in ((job.outputs, "output"), (job.errors, "error")):
            if not results:
                continue
            job.rng.shuffle(results)
            content = ("\n".join(results) + "\n").encode()
            stored = self.add_file(f"{job.id}_{kind}.jsonl", f"batch_{kind}", content)
            if kind == "output":
                job.output_file_id = stored.id
            else:
                job.error_file_id = stored.id
        self.batch_counts[status] += 1

    def batch_records(self) -> list[dict[str, Any]]:
        records = []
        for job in self.batches.values():
            self.advance(job)
            record = job.as_object()
            record["custom_ids"] = [line.custom_id for line in job.lines]
            record["key_suffix"] = job.key_suffix
            records.append(record)
        return records

    # -- recording ----------------------------------------------------------------------

    def record(self, entry: dict[str, Any]) -> None:
        self.records.append(json.dumps(entry, separators=(",", ":")))
        self.by_status[str(entry["status"])] += 1
        self.by_schema[entry["schema"] or "unknown"] += 1
        if entry.get("fault"):
            self.by_fault[entry["fault"]] += 1

    def count_usage(
        self,
        schema: str,
        usage: dict[str, int],
        into: dict[str, collections.Counter[str]] | None = None,
    ) -> None:
        """What one answered live call (`into` the batch counters: batch line) used, under
        its schema."""
        counted = (self.usage_by_schema if into is None else into)[schema]
        counted["calls"] += 1
        counted["prompt_tokens"] += usage["prompt_tokens"]
        counted["completion_tokens"] += usage["completion_tokens"]

    def stats(self) -> dict[str, Any]:
        for job in self.batches.values():
            self.advance(job)
        batches: dict[str, Any] = {
            key: self.batch_counts[key]
            for key in (
                "created",
                "cancelled",
                "completed",
                "lines_total",
                "lines_completed",
                "lines_failed",
            )
        }
        batches["lines_by_schema"] = dict(self.batch_lines_by_schema)
        batches["usage_by_schema"] = {k: dict(v) for k, v in self.batch_usage_by_schema.items()}
        return {
            "total": len(self.records),
            "by_status": dict(self.by_status),
            "by_schema": dict(self.by_schema),
            "by_fault": dict(self.by_fault),
            "usage_by_schema": {k: dict(v) for k, v in self.usage_by_schema.items()},
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "outage": self.in_outage(),
            "batches": batches,
        }


# --------------------------------------------------------------------------- HTTP layer


def create_app(config: StubConfig | None = None) -> Any:
    """The Starlette app; state lives in ``app.state.stub``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    state = StubState(config or StubConfig())

    def json_response(body: Any, status: int = 200, headers: dict | None = None) -> Response:
        return Response(
            json.dumps(body, separators=(",", ":")),
            status_code=status,
            headers=headers,
            media_type="application/json",
        )

    def invalid(message: str, status: int = 400) -> Response:
        return json_response(error_body(message, "invalid_request_error", None), status)

    def rejected_key(request: Request) -> Response | None:
        """The 401 answer when the request's bearer key is in ``reject_keys``."""
        authorization = request.headers.get("authorization")
        key = bearer_key(authorization)
        if key is None or key not in state.config.reject_keys:
            return None
        assert authorization is not None
        return json_response(rejected_key_body(authorization), 401)

    async def chat_completions(request: Request) -> Response:
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await handle_completion(request)
        finally:
            state.in_flight -= 1

    async def handle_completion(request: Request) -> Response:
        entry: dict[str, Any] = {"t": time.time(), "status": None, "schema": None, "fault": None}
        body, data, schema, problem = parse_request(await request.body())
        fill_entry(entry, body, data, schema)
        entry["key_suffix"] = key_suffix(bearer_key(request.headers.get("authorization")))
        entry["client"] = request.client.host if request.client else None

        def refuse(status: int, payload: dict, fault: str, headers: dict | None = None) -> Response:
            entry.update(status=status, fault=fault)
            state.record(entry)
            return json_response(payload, status, headers)

        if state.in_outage():
            status = state.config.outage_status
            retry = state.config.outage_retry_after
            headers = None if retry is None else {"Retry-After": retry}
            return refuse(status, outage_body(status), "outage", headers)
        refusal = rejected_key(request)
        if refusal is not None:
            entry.update(status=refusal.status_code, fault="rejected_key")
            state.record(entry)
            return refusal
        if problem is not None:
            fault = MARK_HTTP_400 if MARK_HTTP_400 in problem else "invalid_request"
            return refuse(400, error_body(problem, "invalid_request_error", None), fault)
        retry_after = state.admit()
        if retry_after is not None:
            payload = error_body("Rate limit reached", "requests", "rate_limit_exceeded")
            headers = {"Retry-After": str(retry_after), **rate_headers()}
            return refuse(429, payload, "rpm_limit", headers)
        hit_429 = state.rng.random() < state.config.rate_429
        hit_500 = state.rng.random() < state.config.rate_500
        latency = state.latency_s()
        if latency:
            await asyncio.sleep(latency)
        if hit_429:
            payload = error_body("Rate limit reached", "requests", "rate_limit_exceeded")
            headers = {"Retry-After": state.config.retry_after_s, **rate_headers()}
            return refuse(429, payload, "injected_429", headers)
        if hit_500:
            return refuse(
                500, error_body(SERVER_ERROR_MESSAGE, "server_error", None), "injected_500"
            )
        assert schema is not None and data is not None
        answer, payload = state.complete(body, schema, data, request.headers.get("authorization"))
        entry.update(status=200, fault=answer.fault)
        state.record(entry)
        state.count_usage(schema, payload["usage"])
        return json_response(payload, headers={"x-request-id": payload["id"], **rate_headers()})

    def fill_entry(entry: dict, body: dict, data: dict | None, schema: str | None) -> None:
        params = {
            k: v for k, v in body.items() if k not in ("messages", "model", "response_format")
        }
        entry.update(
            schema=schema,
            model=body.get("model"),
            data=data,
            messages=body.get("messages") if state.config.record_messages else None,
            response_format=body.get("response_format"),
            max_tokens=body.get("max_tokens", body.get("max_completion_tokens")),
            params=params,
        )

    def rate_headers() -> dict[str, str]:
        remaining = state.rpm_remaining()
        if remaining is None:
            return {}
        return {
            "x-ratelimit-limit-requests": str(state.config.rpm_limit),
            "x-ratelimit-remaining-requests": str(remaining),
        }

    async def models(_: Request) -> Response:
        model = {"id": "stub-judge", "object": "model", "created": 0, "owned_by": "stub"}
        return json_response({"object": "list", "data": [model]})

    # -- Files API --------------------------------------------------------------------------

    async def files_upload(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        try:
            fields = parse_multipart(request.headers.get("content-type", ""), await request.body())
        except ValueError as exc:
            return invalid(str(exc))
        filename, content = fields.get("file", (None, b""))
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        if "file" not in fields:
            return invalid("a 'file' field is required")
        if purpose not in FILE_PURPOSES:
            return invalid(f"purpose must be one of {list(FILE_PURPOSES)}")
        stored = state.add_file(filename or "upload", purpose, content)
        return json_response(stored.as_object())

    async def file_object(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        file_id = request.path_params["file_id"]
        try:
            stored = state.file(file_id)
        except NotFound as exc:
            return json_response(error_body(str(exc), "invalid_request_error", None, "id"), 404)
        if request.method == "DELETE":
            del state.files[file_id]
            return json_response({"id": file_id, "object": "file", "deleted": True})
        return json_response(stored.as_object())

    async def file_content(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        try:
            stored = state.file(request.path_params["file_id"])
        except NotFound as exc:
            return json_response(error_body(str(exc), "invalid_request_error", None, "id"), 404)
        return Response(stored.content, media_type="application/octet-stream")

    # -- Batch API --------------------------------------------------------------------------

    async def batches_root(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        if request.method == "GET":
            return list_batches(request)
        try:
            payload = json.loads(await request.body() or b"null")
            key = bearer_key(request.headers.get("authorization"))
            job = state.create_batch(payload, key)
        except NotFound as exc:
            return invalid(str(exc), 404)
        except ValueError as exc:
            return invalid(str(exc))
        return json_response(job.as_object())

    def list_batches(request: Request) -> Response:
        try:
            limit = min(100, max(1, int(request.query_params.get("limit", 20))))
        except ValueError:
            return invalid("limit must be an integer")
        newest_first = list(reversed(state.batches))
        after = request.query_params.get("after")
        if after is not None:
            if after not in state.batches:
                return invalid(f"No batch found with id '{after}'.", 404)
            newest_first = newest_first[newest_first.index(after) + 1 :]
        page = [state.batch(batch_id).as_object() for batch_id in newest_first[:limit]]
        return json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(newest_first) > limit,
            }
        )

    async def batch_object(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        try:
            return json_response(state.batch(request.path_params["batch_id"]).as_object())
        except NotFound as exc:
            return invalid(str(exc), 404)

    async def batch_cancel(request: Request) -> Response:
        refusal = rejected_key(request)
        if refusal is not None:
            return refusal
        try:
            job = state.cancel(request.path_params["batch_id"])
        except NotFound as exc:
            return invalid(str(exc), 404)
        except Conflict as exc:
            return invalid(str(exc), 409)
        return json_response(job.as_object())

    # -- stub control -----------------------------------------------------------------------

    async def config_endpoint(request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("config body must be a JSON object")
                state.configure(changes)
            except (ValueError, TypeError) as exc:
                return invalid(str(exc))
        return json_response(state.config.as_dict())

    async def calls(request: Request) -> Response:
        offset = int(request.query_params.get("offset", 0))
        limit = request.query_params.get("limit")
        end = None if limit is None else offset + int(limit)
        body = "[" + ",".join(state.records[offset:end]) + "]"
        return Response(body, media_type="application/json")

    async def stats(_: Request) -> Response:
        return json_response(state.stats())

    async def stub_batches(_: Request) -> Response:
        return json_response(state.batch_records())

    async def reset(_: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/files", files_upload, methods=["POST"]),
        Route("/v1/files/{file_id}", file_object, methods=["GET", "DELETE"]),
        Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
        Route("/v1/batches", batches_root, methods=["GET", "POST"]),
        Route("/v1/batches/{batch_id}", batch_object, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batch_cancel, methods=["POST"]),
        Route("/_stub/config", config_endpoint, methods=["GET", "POST"]),
        Route("/_stub/calls", calls, methods=["GET"]),
        Route("/_stub/stats", stats, methods=["GET"]),
        Route("/_stub/batches", stub_batches, methods=["GET"]),
        Route("/_stub/reset", reset, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.stub = state
    return app


# --------------------------------------------------------------------------- process entry

# StubConfig keys with a CLI flag of their own; every key can also go in --config JSON.
FLAG_KEYS = (
    "latency_ms",
    "latency_jitter_ms",
    "rate_429",
    "rate_500",
    "retry_after_s",
    "rpm_limit",
    "seed",
    "record_messages",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stub_llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--latency-jitter-ms", type=float, default=0.0)
    parser.add_argument("--rate-429", type=float, default=0.0)
    parser.add_argument("--rate-500", type=float, default=0.0)
    parser.add_argument("--retry-after-s", default="1")
    parser.add_argument("--rpm-limit", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record-messages", action="store_true")
    parser.add_argument(
        "--config",
        type=json.loads,
        default={},
        help="more config keys as a JSON object, applied after the flags",
    )
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> StubConfig:
    if not isinstance(args.config, dict):
        raise SystemExit("--config must be a JSON object")
    config = StubConfig()
    config.update(
        {
            "latency_ms": args.latency_ms,
            "latency_jitter_ms": args.latency_jitter_ms,
            "rate_429": args.rate_429,
            "rate_500": args.rate_500,
            "retry_after_s": args.retry_after_s,
            "rpm_limit": args.rpm_limit,
            "seed": args.seed,
            "record_messages": not args.no_record_messages,
            **args.config,
        }
    )
    return config


async def serve(app: Any, host: str, port: int) -> None:
    """Serve on a pre-bound socket and announce STUB_READY once uvicorn is listening."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
    # is TCP; without it Nagle + delayed ACK add ~40 ms to every keep-alive response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        backlog=4096,
        timeout_keep_alive=75,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    print(f"{READY_PREFIX}http://{shown_host}:{bound_port}", flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    app = create_app(config_from_args(args))
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn already shut down cleanly
        asyncio.run(serve(app, args.host, args.port))


# --------------------------------------------------------------------------- test helper


class StubServer:
    """Run the stub as a subprocess; usable directly or as a context manager.

    The process starts in ``__init__`` so ``base_url`` is always set; ``stop()`` (or leaving
    the ``with`` block) terminates it. Config keys are the ``StubConfig`` fields, plus
    ``port`` (default 0, a free port).
    """

    def __init__(self, **config: Any) -> None:
        port = int(config.pop("port", 0))
        StubConfig().update(config)  # reject unknown keys / bad values before spawning
        command = [sys.executable, "-m", "tests.stub_llm", "--port", str(port)]
        command += config_flags(config)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        self.root_url = self._wait_ready(timeout=20.0)
        self.base_url = f"{self.root_url}/v1"
        import httpx

        self._client = httpx.Client(base_url=self.root_url, timeout=10.0)

    def _drain_stdout(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.0, remaining))
            except queue.Empty:
                self._kill()
                raise TimeoutError(f"stub_llm not ready within {timeout} s") from None
            if line is None:
                code = self._process.wait()
                raise RuntimeError(f"stub_llm exited with code {code} before STUB_READY")
            if line.startswith(READY_PREFIX):
                return line[len(READY_PREFIX) :].strip()

    def configure(self, **config: Any) -> None:
        # ASCII JSON: a hostile setting may hold a lone surrogate, which UTF-8 cannot carry
        body = json.dumps(config).encode()
        headers = {"content-type": "application/json"}
        self._client.post("/_stub/config", content=body, headers=headers).raise_for_status()

    def calls(self) -> list[dict[str, Any]]:
        return self._get("/_stub/calls")

    def stats(self) -> dict[str, Any]:
        return self._get("/_stub/stats")

    def batches(self) -> list[dict[str, Any]]:
        """Every batch object with its ``custom_ids`` and ``key_suffix``, oldest first."""
        return self._get("/_stub/batches")

    def outage(self, seconds: float, status: int = 503, retry_after: str | None = None) -> None:
        """Answer every chat completion with ``status`` for ``seconds`` from now."""
        self.configure(outage_s=seconds, outage_status=status, outage_retry_after=retry_after)

    def reset(self) -> None:
        self._client.post("/_stub/reset").raise_for_status()

    def _get(self, path: str) -> Any:
        response = self._client.get(path)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        if hasattr(self, "_client"):
            self._client.close()

    def _kill(self) -> None:
        self._process.kill()
        self._process.wait()

    def __enter__(self) -> StubServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def config_flags(config: dict[str, Any]) -> list[str]:
    """CLI flags for StubConfig keys (``record_messages=False`` -> ``--no-record-messages``);
    keys without a flag of their own go in one ``--config`` JSON object."""
    flags: list[str] = []
    rest: dict[str, Any] = {}
    for key, value in config.items():
        if key not in FLAG_KEYS:
            rest[key] = value
        elif key == "record_messages":
            flags += [] if value else ["--no-record-messages"]
        elif value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    if rest:
        flags += ["--config", json.dumps(rest)]
    return flags


if __name__ == "__main__":
    main()
