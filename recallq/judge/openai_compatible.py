"""The direct lane: chat completions of an OpenAI-compatible provider over one pooled HTTP client.

litellm spends about 4-5 ms of CPU on each call (request and response objects, its logging
object, provider dispatch); a judge call needs one POST and one JSON body read, about 1 ms.
This transport sends what litellm sends for an `openai/` or `hosted_vllm/` model (the model
name without its prefix, the messages, response_format and temperature 0, with the key as a
Bearer token) and reads the answer, its usage and its failures the way recallq.judge.llm
expects them (recallq.judge.transport). Which models take it: recallq.judge.lanes.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import httpx

from recallq.judge.prices import Price
from recallq.judge.transport import (
    CONNECTION_ERRORS,
    CONNECTION_REFUSED,
    TIMEOUTS,
    Answer,
    PermanentProviderError,
    TransientProviderError,
    causes,
    reported_tokens,
    retry_after_seconds,
    status_error,
    unavailable,
)

#: Connections kept open for reuse: one per worker thread calling the model at once (a worker
#: has 32 by default); beyond this many, a connection is closed after its call.
KEEP_ALIVE = 256
#: How much of an error response is read for its message.
ERROR_BODY_BYTES = 64 * 1024
#: An answer whose JSON escapes every character (\\uXXXX) is six times its text: a body within
#: this many times the answer limit can always hold an answer the limit accepts.
BODY_PER_ANSWER_BYTE = 6
_TAIL_BYTES = 8 * 1024
_USAGE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*(\d+)')
    for name in ("prompt_tokens", "completion_tokens")
}


@dataclass(frozen=True)
class Endpoint:
    """Where and how a model's chat completions go."""

    url: str  # {api_base}/chat/completions
    model: str  # the provider's name of the model (no litellm prefix)
    headers: dict[str, str] = field(default_factory=dict)


class OpenAICompatibleTransport:
    def __init__(self, endpoint: Endpoint, price: Price | None, max_answer_bytes: int) -> None:
        """`price`: None when the model is not priced (it then costs nothing, as with litellm);
        `max_answer_bytes`: the answer limit (protocol.AnswerLimits.answer_bytes)."""
        self._endpoint = endpoint
        self._price = price
        self._cap = BODY_PER_ANSWER_BYTE * max_answer_bytes + 64 * 1024
        # httpx says every request at INFO ("HTTP Request: POST ... 200 OK"): one line per
        # judge call, each redacted and written, is CPU spent on noise. Warnings still show.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # The pooled transport without httpx.Client around it: a judge call needs none of the
        # client's per-request work (merging the URL and headers, cookies, auth, redirects,
        # event hooks), which cost as much CPU as the HTTP exchange itself (issue 29).
        # It honours the proxy the environment names for the endpoint, as the client would.
        self._url = httpx.URL(endpoint.url)
        self._transport = httpx.HTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=KEEP_ALIVE),
            proxy=environment_proxy(self._url),
        )
        with httpx.Client(trust_env=False) as client:  # its default headers (Accept, ...)
            self._headers = httpx.Headers(client.headers)
        self._headers.update({"Content-Type": "application/json", **endpoint.headers})

    def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], timeout: float
    ) -> Answer:
        body = {
            "model": self._endpoint.model,
            "messages": messages,
            "temperature": 0,
            "response_format": response_format,
        }
        content = json.dumps(body, separators=(",", ":")).encode()
        request = httpx.Request(
            "POST",
            self._url,
            headers=self._headers,
            content=content,
            extensions={"timeout": httpx.Timeout(timeout).as_dict()},
        )
        deadline = time.monotonic() + timeout
        try:
            response = self._transport.handle_request(request)
            response.request = request
            try:
                if response.status_code != 200:
                    raise _status_error(response, _read_error(response, deadline))
                return self._answer(response, deadline)
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            raise TransientProviderError("Timeout", _text(exc), TIMEOUTS) from None
        except httpx.ConnectError as exc:
            refused = any(isinstance(cause, ConnectionRefusedError) for cause in causes(exc))
            reason = CONNECTION_REFUSED if refused else CONNECTION_ERRORS
            raise TransientProviderError("APIConnectionError", _text(exc), reason) from None
        except httpx.RequestError as exc:  # the connection broke, a body that cannot decode
            raise TransientProviderError(
                "APIConnectionError", _text(exc), CONNECTION_ERRORS
            ) from None

    def _answer(self, response: httpx.Response, deadline: float) -> Answer:
        body, total, tail = _read_capped(response, self._cap, deadline)
        if body is None:  # over the cap: the usage is near the end of the body
            prompt, completion = (_usage_in(tail, name) for name in _USAGE)
            return Answer(None, None, prompt, completion, self._cost(prompt, completion), total)
        try:
            data = json.loads(body)
            choice = data["choices"][0]
            content = choice["message"].get("content")
            if content is not None and not isinstance(content, str):
                raise TypeError("content is not a text")
            usage = data.get("usage") or {}
            prompt = reported_tokens(usage.get("prompt_tokens"))
            completion = reported_tokens(usage.get("completion_tokens"))
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError):
            raise TransientProviderError(
                "APIError",
                f"the provider answered 200 without a chat completion: {_clip(body)}",
                unavailable(None),
            ) from None
        finish = choice.get("finish_reason")
        return Answer(
            content,
            finish if isinstance(finish, str) else None,
            prompt,
            completion,
            self._cost(prompt, completion),
        )

    def _cost(self, prompt: int, completion: int) -> float:
        return self._price.cost(prompt, completion) if self._price is not None else 0.0


def environment_proxy(url: httpx.URL) -> str | None:
    """The proxy that HTTP_PROXY / HTTPS_PROXY / ALL_PROXY name for `url`, unless NO_PROXY
    exempts its host (the variables httpx.Client and the OpenAI SDK read)."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # untyped
    if not proxy or bypass(url.host, proxies):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _read_capped(
    response: httpx.Response, cap: int, deadline: float
) -> tuple[bytes | None, int, bytes]:
    """The body when it is at most `cap` bytes (None otherwise), its size, and its last bytes.
    A body over the cap is read on to its end (within the call's timeout), and dropped but
    for its tail, where the usage is: the call was billed all the same."""
    chunks: list[bytes] = []
    total = 0
    tail = b""
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total <= cap:
            chunks.append(chunk)
        else:
            if chunks:
                tail = b"".join(chunks)[-_TAIL_BYTES:]
                chunks = []
            tail = (tail + chunk)[-_TAIL_BYTES:]
        if time.monotonic() > deadline:  # a body that trickles in: the timeout is the call's
            raise httpx.ReadTimeout("the answer took longer than the timeout to arrive")
    if total > cap:
        return None, total, tail
    return b"".join(chunks), total, b""


def _read_error(response: httpx.Response, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= ERROR_BODY_BYTES or time.monotonic() > deadline:
            break
    return b"".join(chunks)[:ERROR_BODY_BYTES]


def _status_error(response: httpx.Response, body: bytes) -> Exception:
    status = response.status_code
    if 300 <= status < 400:  # the OpenAI SDK follows no redirect either: api_base is wrong
        location = response.headers.get("location", "")
        return PermanentProviderError(
            "APIError", f"Error code: {status} - redirected to {location}: is api_base right?"
        )
    message = f"Error code: {status} - {_error_message(body)}"
    return status_error(status, message, retry_after_seconds(response.headers.get("retry-after")))


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), else the body."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return _clip(body)
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail")
        code = error.get("code")
        if isinstance(message, str):
            return f"{message} ({code})" if isinstance(code, str) and code else message
    if isinstance(error, str):
        return error
    return _clip(body)


def _usage_in(tail: bytes, name: str) -> int:
    found = _USAGE[name].findall(tail)
    return reported_tokens(found[-1].decode()) if found else 0


def _text(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _clip(body: bytes, limit: int = 300) -> str:
    return body[:limit].decode("utf-8", "replace")
