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

Nothing a client sends can make a context blow up (:class:`ContextLimits`): the passages of
one item are limited in bytes and in number; JMESPath expressions are limited in length and
nesting, evaluated under a time bound, and no value they build may grow past the byte limit
(a 300-byte expression can otherwise describe a value of billions of characters, since its
parts share references until they are serialised); values are serialised by a serialiser that
stops as soon as it passes the limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jmespath
from jmespath import functions as jmespath_functions
from jmespath import visitor as jmespath_visitor
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


#: A JMESPath expression longer than this is refused (real ones are a few dozen characters).
MAX_EXPRESSION_LENGTH = 1000
#: Brackets, braces and parentheses nested deeper than this are refused before parsing.
MAX_EXPRESSION_NESTING = 16
#: Nodes of the parsed expression nested deeper than this (`a.b.c...`) are refused.
MAX_EXPRESSION_DEPTH = 64
#: Visits of expression nodes in one evaluation (a projection visits per element).
MAX_EXPRESSION_STEPS = 2_000_000


@dataclass(frozen=True)
class ContextLimits:
    """What one item may be judged against: its resolved passages in UTF-8 bytes and in
    number, and how long its context_extractor may run."""

    max_bytes: int = 1024 * 1024
    max_passages: int = 1000
    jmespath_timeout: float = 0.5


DEFAULT_LIMITS = ContextLimits()


def _clip(value: Any, limit: int = 80) -> str:
    """A client's value quoted in an error message, never more than `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    if not isinstance(kind, str) or kind not in _EXTRACTOR_FIELDS:
        allowed = ", ".join(repr(k) for k in _EXTRACTOR_FIELDS)
        raise ContextError(f"context_extractor.type must be one of {allowed}, got {_clip(kind)}")
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
    _compile(expression)
    return expression


def _nesting(expression: str) -> int:
    """How deep brackets, braces and parentheses nest, outside quoted text."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for char in expression:
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _ast_depth(node: dict[str, Any]) -> int:
    """Depth of a parsed expression, walked without recursion."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_EXPRESSION_DEPTH:
            break
        stack.extend(
            (child, depth + 1) for child in current.get("children", ()) if isinstance(child, dict)
        )
    return deepest


def _compile(expression: str) -> Any:
    """The parsed expression, or a ContextError saying which limit it passes."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ContextError(
            f"context_extractor.expression is {len(expression)} characters long; at most "
            f"{MAX_EXPRESSION_LENGTH} are allowed"
        )
    if _nesting(expression) > MAX_EXPRESSION_NESTING:
        raise ContextError(
            "context_extractor.expression nests brackets, braces or parentheses more than "
            f"{MAX_EXPRESSION_NESTING} deep"
        )
    try:
        parsed = jmespath.compile(expression)
    except JMESPathError as exc:
        raise ContextError(
            f"context_extractor.expression is not valid JMESPath: {_clip(str(exc), 300)}"
        ) from exc
    except (RecursionError, ValueError, TypeError) as exc:
        raise ContextError("context_extractor.expression is not valid JMESPath") from exc
    if _ast_depth(parsed.parsed) > MAX_EXPRESSION_DEPTH:
        raise ContextError(
            f"context_extractor.expression nests more than {MAX_EXPRESSION_DEPTH} levels deep"
        )
    return parsed


# --- bounded values --------------------------------------------------------------------------


class ValueTooLarge(Exception):
    """A value passed its byte limit (callers turn it into a ContextError naming the
    limit)."""


def bounded_json(value: Any, max_bytes: int, compact: bool = False) -> str:
    """JSON text of `value`, keys sorted, or ValueTooLarge as soon as it passes `max_bytes` UTF-8
    bytes: the encoder yields pieces as it goes, so a value whose parts share references
    costs at most the limit to find too large, never its full size."""
    pieces, size = [], 0
    encoder = json.JSONEncoder(
        ensure_ascii=False,
        sort_keys=not compact,
        default=str,
        separators=(",", ":") if compact else None,
    )
    for piece in encoder.iterencode(value):
        size += len(piece.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise ValueTooLarge
        pieces.append(piece)
    return "".join(pieces)


def _measure(value: Any, max_bytes: int, deadline: float) -> int:
    """About the size of `value` as JSON, counting shared parts as often as they appear;
    ValueTooLarge past `max_bytes`. Walks without recursion and stops at the limit."""
    size, stack, steps = 0, [value], 0
    while stack:
        current = stack.pop()
        steps += 1
        if steps % 4096 == 0 and time.monotonic() > deadline:
            raise _Timeout
        if isinstance(current, str):
            size += len(current) + 2
        elif isinstance(current, dict):
            size += 2 + len(current)
            for key, item in current.items():
                size += len(key) + 3
                stack.append(item)
        elif isinstance(current, list):
            size += 2 + len(current)
            stack.extend(current)
        else:
            size += 8
        if size > max_bytes:
            raise ValueTooLarge
    return size


class _Timeout(Exception):
    """An evaluation ran past its time bound."""


class _BoundedFunctions:
    """JMESPath's functions, with the two that build long strings in one step checked first
    (the interpreter calls `call_function` on whatever its options name)."""

    def __init__(self, max_bytes: int) -> None:
        self._functions = jmespath_functions.Functions()
        self._max_bytes = max_bytes

    def call_function(self, name: str, arguments: list[Any]) -> Any:
        # the arguments' types are checked by the real function; check sizes only when valid
        if name == "join" and len(arguments) == 2 and isinstance(arguments[1], list):
            separator, array = arguments
            texts = [text for text in array if isinstance(text, str)]
            size = len(separator) * max(0, len(array) - 1) if isinstance(separator, str) else 0
            if size + sum(len(text) for text in texts) > self._max_bytes:
                raise ValueTooLarge
        elif name == "to_string" and len(arguments) == 1 and not isinstance(arguments[0], str):
            return bounded_json(arguments[0], self._max_bytes, compact=True)  # as JMESPath's
        return self._functions.call_function(name, arguments)


# node types whose value can be larger than the values they were made from
_BUILDERS = frozenset(
    {
        "multi_select_list",
        "multi_select_dict",
        "flatten",
        "projection",
        "value_projection",
        "filter_projection",
        "function_expression",
    }
)


class _BoundedInterpreter(jmespath_visitor.TreeInterpreter):  # type: ignore[misc]  # untyped
    """JMESPath's interpreter under a deadline and a step budget, where no value it builds may
    grow past the byte limit. Each step costs at most about the limit, so the evaluation as a
    whole is bounded in time and memory."""

    def __init__(self, max_bytes: int, deadline: float) -> None:
        super().__init__(jmespath_visitor.Options(custom_functions=_BoundedFunctions(max_bytes)))
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._steps = 0

    def visit(self, node: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self._steps += 1
        if self._steps > MAX_EXPRESSION_STEPS or time.monotonic() > self._deadline:
            raise _Timeout
        result = super().visit(node, *args, **kwargs)
        if node["type"] in _BUILDERS:
            _measure(result, self._max_bytes, self._deadline)
        return result


def search(expression: str, data: Any, limits: ContextLimits = DEFAULT_LIMITS) -> Any:
    """Evaluate a JMESPath expression within the limits; ContextError naming the one passed."""
    parsed = _compile(expression)
    deadline = time.monotonic() + limits.jmespath_timeout
    interpreter = _BoundedInterpreter(limits.max_bytes, deadline)
    try:
        return interpreter.visit(parsed.parsed, data)
    except ValueTooLarge:
        raise ContextError(
            f"context_extractor expression built a value larger than {limits.max_bytes} bytes"
        ) from None
    except _Timeout:
        raise ContextError(
            "context_extractor expression took longer than "
            f"{limits.jmespath_timeout:g} s on this item"
        ) from None
    except JMESPathError as exc:
        raise ContextError(f"context_extractor expression failed: {_clip(str(exc), 300)}") from exc
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise ContextError(f"context_extractor expression failed: {type(exc).__name__}") from exc


def check_passages(passages: list[str], limits: ContextLimits, what: str = "context") -> None:
    """ContextError when passages pass a limit (in number, or in UTF-8 bytes together)."""
    if len(passages) > limits.max_passages:
        raise ContextError(
            f"{what} has {len(passages)} passages; at most {limits.max_passages} are allowed "
            "per item"
        )
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in passages)
    if size > limits.max_bytes:
        raise ContextError(
            f"{what} is {size} bytes; at most {limits.max_bytes} are allowed per item"
        )


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


def _json(value: Any, max_bytes: int = DEFAULT_LIMITS.max_bytes) -> str:
    try:
        return bounded_json(value, max_bytes)
    except ValueTooLarge:
        raise ContextError(
            f"a context passage is larger than {max_bytes} bytes as JSON; at most "
            f"{max_bytes} are allowed per item"
        ) from None


def to_passages(value: Any, limits: ContextLimits = DEFAULT_LIMITS) -> list[str]:
    """Normalise a context value to passages: strings as-is, other values as JSON text.

    ``None`` -> ``[]``; a list gives one passage per (non-``None``) element; blank strings drop.
    More elements than the passage limit, or a value that would serialise past the byte
    limit, is a ContextError (found before the work, or as soon as the limit is passed).
    """
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if len(items) > limits.max_passages:
        raise ContextError(
            f"context has {len(items)} passages; at most {limits.max_passages} are allowed per item"
        )
    texts = (
        item if isinstance(item, str) else _json(item, limits.max_bytes)
        for item in items
        if item is not None
    )
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


def _result_passages(result: Any, limits: ContextLimits) -> list[str]:
    """One passage per result, or per document when the result is a list of documents."""
    if isinstance(result, list) and result:
        texts = [_doc_text(element) for element in result]
        if all(text is not None for text in texts):
            return to_passages(texts, limits)
    return to_passages([result], limits)


def _tool_result_passages(
    tools: list[str] | None, input: Any, output: Any, limits: ContextLimits = DEFAULT_LIMITS
) -> list[str]:
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
                passages.extend(_result_passages(result, limits))
                if len(passages) > limits.max_passages:
                    check_passages(passages, limits)
    return passages


def extract_context(
    spec: dict[str, Any], input: Any, output: Any, limits: ContextLimits = DEFAULT_LIMITS
) -> list[str]:
    """Apply a context extractor to an item's input and output."""
    checked = validate_extractor(spec)
    if checked is None:
        raise ContextError("context_extractor is missing")
    if checked["type"] == "tool_results":
        return _tool_result_passages(checked["tools"], input, output, limits)
    found = search(checked["expression"], {"input": input, "output": output}, limits)
    return to_passages(found, limits)


# --- resolution ------------------------------------------------------------------------------


def _extractor_applies(extractor: dict[str, Any] | None, input: Any, output: Any) -> bool:
    return extractor is not None and is_agent_shaped(input, output)


def context_source(
    item_context: Any, input: Any, output: Any, extractor: dict[str, Any] | None
) -> str:
    """Which source gives the item its context: "item", "extractor" or "run" (the run's
    static context, which items then need not copy)."""
    if item_context is not None:
        return "item"
    if _extractor_applies(extractor, input, output):
        return "extractor"
    return "run"


def resolve_context(
    item_context: Any,
    input: Any,
    output: Any,
    run_context: list[str] | None,
    extractor: dict[str, Any] | None,
    limits: ContextLimits = DEFAULT_LIMITS,
) -> list[str]:
    """The item's context passages, by the resolution order in the module docstring, checked
    against the limits."""
    source = context_source(item_context, input, output, extractor)
    if source == "item":
        passages = to_passages(item_context, limits)
    elif source == "extractor":
        assert extractor is not None
        passages = extract_context(extractor, input, output, limits)
    else:
        passages = to_passages(run_context, limits)
    check_passages(passages, limits)
    return passages


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
        # any() stops at the first passage: this runs for every item of a run
        or any(isinstance(text, str) and text.strip() for text in run_context or ())
    )
