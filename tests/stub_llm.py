"""OpenAI-compatible stub judge server speaking judge protocol v1 (see CONTRACT.md).

Run it as a separate process::

    python -m tests.stub_llm --port 0 --latency-ms 20 --rate-429 0.05 --seed 1

It prints exactly one line ``STUB_READY http://127.0.0.1:PORT`` once listening. Workers reach
it through litellm with ``model="openai/stub-judge"`` and ``api_base="http://127.0.0.1:PORT/v1"``.

Endpoints:

* ``POST /v1/chat/completions`` (also ``/chat/completions``): deterministic judge answers.
* ``GET /v1/models``: one model, ``stub-judge``.
* ``GET|POST /_stub/config``: read / change fault-injection settings at runtime.
* ``GET /_stub/calls[?offset=&limit=]``: recorded requests; ``GET /_stub/stats``: counters.
* ``POST /_stub/reset``: clear records, counters, per-key state, the rpm window; reseed.

Request handling order: parse and validate (malformed input, ``stream=true`` or the
``STUB_HTTP_400`` marker -> 400, not counted in the rpm window), rpm window, random 429 and
500 draws, latency sleep (applied to every non-400 answer, including injected 429/500), then
the judge answer with content markers applied. Every request is recorded, refused ones too.

``StubServer`` (bottom of this file) starts the server as a subprocess for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import hashlib
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
from pathlib import Path
from typing import Any

EXTRACTION = "claim_extraction"
ATTRIBUTION = "claim_attribution"
SCHEMAS = (EXTRACTION, ATTRIBUTION)

MARK_BROKEN_JSON = "STUB_BROKEN_JSON"
MARK_TRUNCATE = "STUB_TRUNCATE"
MARK_WRONG_SHAPE = "STUB_WRONG_SHAPE"
MARK_HTTP_400 = "STUB_HTTP_400"
MARK_DROP_VERDICT = "STUB_DROP_VERDICT"
MARK_ALWAYS_DROP = "STUB_ALWAYS_DROP"

RPM_WINDOW_S = 60.0
READY_PREFIX = "STUB_READY "
REPO_ROOT = Path(__file__).resolve().parent.parent

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])[ \t]+|[\r\n]+")
_WORD = re.compile(r"[^\W_]+")
_FENCE = "```json"


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass
class StubConfig:
    """Fault-injection settings; every field is a CLI flag and a ``/_stub/config`` key."""

    latency_ms: float = 0.0
    latency_jitter_ms: float = 0.0
    rate_429: float = 0.0
    rate_500: float = 0.0
    retry_after_s: str = "1"
    rpm_limit: int | None = None
    seed: int | None = 0
    record_messages: bool = True

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
    if key in ("latency_ms", "latency_jitter_ms"):
        number = float(value)
        if number < 0:
            raise ValueError(f"{key} must be >= 0")
        return number
    if key in ("rate_429", "rate_500"):
        rate = float(value)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{key} must be within 0..1")
        return rate
    if key == "retry_after_s":
        return _format_seconds(value)
    if key == "rpm_limit":
        return None if value is None or int(value) <= 0 else int(value)
    if key == "seed":
        return None if value is None else int(value)
    if key == "record_messages":
        if not isinstance(value, bool):
            raise ValueError("record_messages must be a boolean")
        return value
    raise ValueError(f"unknown config key: {key}")


def _format_seconds(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if not text:
        raise ValueError("retry_after_s must not be empty")
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
            return json_schema["name"]
    if not data:
        return None
    if "ground_truth" in data:
        return EXTRACTION
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


def ground_truth_text(data: dict[str, Any]) -> str:
    value = data.get("ground_truth")
    return value if isinstance(value, str) else json.dumps(value)


def marker_text(schema: str, data: dict[str, Any]) -> str:
    """The text searched for STUB_* markers: ground truth, or claim and context texts."""
    if schema == EXTRACTION:
        return ground_truth_text(data)
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
    if not isinstance(body, dict):
        return {}, None, None, "request body must be a JSON object"
    if body.get("stream"):
        return body, None, None, "stream=true is not supported by the stub"
    data = extract_data(body.get("messages"))
    schema = schema_name(body.get("response_format"), data)
    return body, data, schema, validate_data(schema, data)


def data_key(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- server state


@dataclasses.dataclass
class Answer:
    content: str
    finish_reason: str = "stop"
    fault: str | None = None


class StubState:
    """Configuration, RNG, recordings, counters and per-key state of one server process."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        # Each record is kept as compact JSON text: ~6x smaller than the parsed dicts, which
        # matters for 200k+ request benchmarks, and /_stub/calls only has to join them.
        self.records: list[str] = []
        self.by_status: collections.Counter[str] = collections.Counter()
        self.by_schema: collections.Counter[str] = collections.Counter()
        self.by_fault: collections.Counter[str] = collections.Counter()
        self.window: collections.deque[float] = collections.deque()
        self.dropped_once: set[str] = set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.ids = itertools.count(1)

    def configure(self, changes: dict[str, Any]) -> None:
        self.config.update(changes)
        if "seed" in changes:
            self.rng = random.Random(self.config.seed)

    def reset(self) -> None:
        self.records.clear()
        self.by_status.clear()
        self.by_schema.clear()
        self.by_fault.clear()
        self.window.clear()
        self.dropped_once.clear()
        self.max_in_flight = self.in_flight
        self.rng = random.Random(self.config.seed)

    # -- faults -------------------------------------------------------------------------

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

    def answer(self, schema: str, data: dict[str, Any]) -> Answer:
        marked = marker_text(schema, data)
        if MARK_BROKEN_JSON in marked:
            opening = '{"claims": [' if schema == EXTRACTION else '{"verdicts": ['
            return Answer(opening, fault=MARK_BROKEN_JSON)
        if MARK_WRONG_SHAPE in marked:
            return Answer(json.dumps({"answer": 42}), fault=MARK_WRONG_SHAPE)
        payload, fault = self._payload(schema, data, marked)
        content = json.dumps(payload)
        if MARK_TRUNCATE in marked:
            return Answer(content[: max(1, len(content) // 2)], "length", MARK_TRUNCATE)
        return Answer(content, fault=fault)

    def _payload(self, schema: str, data: dict[str, Any], marked: str) -> tuple[dict, str | None]:
        if schema == EXTRACTION:
            return {"claims": split_claims(ground_truth_text(data))}, None
        claims = indexed_texts(data["claims"], "claims")
        verdicts = attribute(claims, indexed_texts(data["contexts"], "contexts"))
        if verdicts and self._drop_last(data, claims, marked):
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

    # -- recording ----------------------------------------------------------------------

    def record(self, entry: dict[str, Any]) -> None:
        self.records.append(json.dumps(entry, separators=(",", ":")))
        self.by_status[str(entry["status"])] += 1
        self.by_schema[entry["schema"] or "unknown"] += 1
        if entry.get("fault"):
            self.by_fault[entry["fault"]] += 1

    def stats(self) -> dict[str, Any]:
        return {
            "total": len(self.records),
            "by_status": dict(self.by_status),
            "by_schema": dict(self.by_schema),
            "by_fault": dict(self.by_fault),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }


# --------------------------------------------------------------------------- HTTP layer


def error_body(message: str, err_type: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


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

        def refuse(status: int, payload: dict, fault: str, headers: dict | None = None) -> Response:
            entry.update(status=status, fault=fault)
            state.record(entry)
            return json_response(payload, status, headers)

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
            message = "The server had an error while processing your request."
            return refuse(500, error_body(message, "server_error", None), "injected_500")
        assert schema is not None and data is not None
        answer = state.answer(schema, data)
        entry.update(status=200, fault=answer.fault)
        state.record(entry)
        prompt_chars = sum(len(message_text(m)) for m in body.get("messages") or [])
        request_id = f"chatcmpl-stub-{next(state.ids)}"
        payload = completion_body(request_id, str(body.get("model", "")), answer, prompt_chars)
        return json_response(payload, headers={"x-request-id": request_id, **rate_headers()})

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

    async def config_endpoint(request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("config body must be a JSON object")
                state.configure(changes)
            except (ValueError, TypeError) as exc:
                return json_response(error_body(str(exc), "invalid_request_error", None), 400)
        return json_response(state.config.as_dict())

    async def calls(request: Request) -> Response:
        offset = int(request.query_params.get("offset", 0))
        limit = request.query_params.get("limit")
        end = None if limit is None else offset + int(limit)
        body = "[" + ",".join(state.records[offset:end]) + "]"
        return Response(body, media_type="application/json")

    async def stats(_: Request) -> Response:
        return json_response(state.stats())

    async def reset(_: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/_stub/config", config_endpoint, methods=["GET", "POST"]),
        Route("/_stub/calls", calls, methods=["GET"]),
        Route("/_stub/stats", stats, methods=["GET"]),
        Route("/_stub/reset", reset, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.stub = state
    return app


# --------------------------------------------------------------------------- process entry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.stub_llm", description=__doc__)
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
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> StubConfig:
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
        self._client.post("/_stub/config", json=config).raise_for_status()

    def calls(self) -> list[dict[str, Any]]:
        return self._get("/_stub/calls")

    def stats(self) -> dict[str, Any]:
        return self._get("/_stub/stats")

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
    """CLI flags for StubConfig keys (``record_messages=False`` -> ``--no-record-messages``)."""
    flags: list[str] = []
    for key, value in config.items():
        if key == "record_messages":
            flags += [] if value else ["--no-record-messages"]
        elif value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


if __name__ == "__main__":
    main()
