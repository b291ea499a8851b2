"""Context resolution for context recall: which passages an item is judged against.

Pure functions, no I/O. Resolution order for one item:

1. the item's own ``context`` when it is present (not ``None``), even an empty list;
2. else the run's ``context_extractor`` when the item is agent-shaped (an applicable
   extractor that finds nothing yields ``[]``; there is no further fallback);
3. else the run's static ``context``.

Agent-shape rule (see :func:`is_agent_shaped`): ``output`` is a non-empty list of message
dicts, each with a string ``role`` and a ``content`` key (``id`` and ``createdAt`` are
tolerated when missing), and ``input`` is either ``None`` or a dict holding at least one of
Mastra's agent-input keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError

AGENT_INPUT_KEYS = ("inputMessages", "rememberedMessages", "systemMessages", "taggedSystemMessages")
# Input lists whose assistant messages may carry tool results (oldest first).
_HISTORY_KEYS = ("rememberedMessages", "inputMessages")
# Keys holding a retrieved document's text, in order of preference.
_DOC_TEXT_KEYS = ("text", "content", "snippet")
_EXTRACTOR_FIELDS = {"tool_results": {"type", "tools"}, "jmespath": {"type", "expression"}}
_MISSING = object()


class ContextError(ValueError):
    """Bad extractor spec or failed extraction; the message is user-facing (HTTP 422)."""


# --- extractor specs -------------------------------------------------------------------------


def validate_extractor(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """Check a ``context_extractor`` spec and return it normalised (``None`` stays ``None``).

    Normalised forms: ``{"type": "tool_results", "tools": [...] | None}`` and
    ``{"type": "jmespath", "expression": "..."}``.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ContextError("context_extractor must be an object with a 'type' field")
    kind = spec.get("type")
    if kind not in _EXTRACTOR_FIELDS:
        allowed = ", ".join(repr(k) for k in _EXTRACTOR_FIELDS)
        raise ContextError(f"context_extractor.type must be one of {allowed}, got {kind!r}")
    unknown = sorted(str(key) for key in set(spec) - _EXTRACTOR_FIELDS[kind])
    if unknown:
        raise ContextError(
            f"context_extractor of type {kind!r} has unknown field(s): {', '.join(unknown)}"
        )
    if kind == "tool_results":
        return {"type": kind, "tools": _validate_tools(spec.get("tools"))}
    return {"type": kind, "expression": _validate_expression(spec.get("expression"))}


def _validate_tools(tools: Any) -> list[str] | None:
    if tools is None:
        return None
    if (
        not isinstance(tools, list)
        or not tools
        or not all(isinstance(name, str) and name.strip() for name in tools)
    ):
        raise ContextError("context_extractor.tools must be a non-empty list of tool names")
    return list(dict.fromkeys(tools))


def _validate_expression(expression: Any) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise ContextError(
            "context_extractor.expression is required for type 'jmespath' (a JMESPath string)"
        )
    try:
        jmespath.compile(expression)
    except JMESPathError as exc:
        raise ContextError(f"context_extractor.expression is not valid JMESPath: {exc}") from exc
    return expression


# --- agent shapes ----------------------------------------------------------------------------


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and "content" in value


def is_agent_shaped(input: Any, output: Any) -> bool:
    """True when ``output`` is a non-empty list of messages and ``input`` is None or agent input."""
    input_ok = input is None or (
        isinstance(input, dict) and any(key in input for key in AGENT_INPUT_KEYS)
    )
    output_ok = isinstance(output, list) and bool(output) and all(map(_is_message, output))
    return input_ok and output_ok


# --- extraction ------------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def to_passages(value: Any) -> list[str]:
    """Normalise a context value to passages: strings as-is, other values as JSON text.

    ``None`` -> ``[]``; a list gives one passage per (non-``None``) element; blank strings drop.
    """
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    texts = (item if isinstance(item, str) else _json(item) for item in items if item is not None)
    return [text for text in texts if text.strip()]


def _assistant_messages(input: Any, output: Any) -> Iterator[dict[str, Any]]:
    sources = [input.get(key) for key in _HISTORY_KEYS] if isinstance(input, dict) else []
    sources.append(output)
    for messages in sources:
        if isinstance(messages, list):
            yield from (m for m in messages if _is_message(m) and m["role"] == "assistant")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _tool_invocations(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Raw tool invocations of a message: ``content.toolInvocations`` then ``content.parts``."""
    content = message["content"]
    if isinstance(content, dict):
        invocations, parts = _dicts(content.get("toolInvocations")), _dicts(content.get("parts"))
    else:  # a bare list of parts, or a string (no tool data)
        invocations, parts = [], _dicts(content)
    yield from invocations
    for part in parts:
        if part.get("type") == "tool-invocation" and isinstance(part.get("toolInvocation"), dict):
            yield part["toolInvocation"]
        elif part.get("type") == "tool-result":
            yield part


def _completed_result(invocation: dict[str, Any]) -> Any:
    """The invocation's result when it has completed (state "result" or absent), else _MISSING."""
    if invocation.get("state", "result") != "result":
        return _MISSING
    for key in ("result", "output"):
        if key in invocation:
            return invocation[key]
    return _MISSING


def _doc_text(element: Any) -> str | None:
    if isinstance(element, str):
        return element
    if isinstance(element, dict):
        for key in _DOC_TEXT_KEYS:
            text = element.get(key)
            if isinstance(text, str):
                return text
    return None


def _result_passages(result: Any) -> list[str]:
    """One passage per result, or per document when the result is a list of documents."""
    if isinstance(result, list) and result:
        texts = [_doc_text(element) for element in result]
        if all(text is not None for text in texts):
            return to_passages(texts)
    return to_passages([result])


def _tool_result_passages(tools: list[str] | None, input: Any, output: Any) -> list[str]:
    passages: list[str] = []
    seen: set[tuple[str, str]] = set()
    for message in _assistant_messages(input, output):
        for invocation in _tool_invocations(message):
            result = _completed_result(invocation)
            name = invocation.get("toolName")
            if result is _MISSING or (tools is not None and name not in tools):
                continue
            # The same call may appear in both toolInvocations and parts: key it by its id, or
            # (without one) by its content, which at worst merges identical passages.
            call_id = invocation.get("toolCallId")
            if isinstance(call_id, str) and call_id:
                key = ("id", call_id)
            else:
                key = ("content", _json([name, invocation.get("args"), result]))
            if key not in seen:
                seen.add(key)
                passages.extend(_result_passages(result))
    return passages


def extract_context(spec: dict[str, Any], input: Any, output: Any) -> list[str]:
    """Apply a context extractor to an item's input and output."""
    checked = validate_extractor(spec)
    if checked is None:
        raise ContextError("context_extractor is missing")
    if checked["type"] == "tool_results":
        return _tool_result_passages(checked["tools"], input, output)
    try:
        found = jmespath.search(checked["expression"], {"input": input, "output": output})
    except JMESPathError as exc:
        raise ContextError(f"context_extractor expression failed: {exc}") from exc
    return to_passages(found)


# --- resolution ------------------------------------------------------------------------------


def _extractor_applies(extractor: dict[str, Any] | None, input: Any, output: Any) -> bool:
    return extractor is not None and is_agent_shaped(input, output)


def resolve_context(
    item_context: Any,
    input: Any,
    output: Any,
    run_context: list[str] | None,
    extractor: dict[str, Any] | None,
) -> list[str]:
    """The item's context passages, by the resolution order in the module docstring."""
    if item_context is not None:
        return to_passages(item_context)
    if extractor is not None and _extractor_applies(extractor, input, output):
        return extract_context(extractor, input, output)
    return to_passages(run_context)


def can_resolve_any(
    item_context: Any,
    input: Any,
    output: Any,
    run_context: list[str] | None,
    extractor: dict[str, Any] | None,
) -> bool:
    """True when some context source applies to this item (it may still resolve to nothing)."""
    return (
        item_context is not None
        or _extractor_applies(extractor, input, output)
        or bool(to_passages(run_context))
    )
