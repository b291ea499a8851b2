"""Contexts cannot blow up: passages are limited in number and bytes, JMESPath expressions
in length and nesting, and their evaluation in time and in the size of what they build."""

from __future__ import annotations

import dataclasses
import tracemalloc
from typing import Any

import pytest

from recallq.core import context as ctx

ITEM = {
    "input": {"inputMessages": []},
    "output": [{"id": "m", "role": "assistant", "content": "doc " * 250, "createdAt": "t"}],
}
# each stage refers to the last one ten times: 10^12 copies of the item after 12 stages
BOMB = " | ".join(["[" + ",".join(["@"] * 10) + "]"] * 12)
#: The default limits with no practical time bound: the size limit, not the machine's load,
#: decides what stops these expressions (tracemalloc makes evaluation several times slower).
SIZE_ONLY = dataclasses.replace(ctx.DEFAULT_LIMITS, jmespath_timeout=600.0)


def _bounded(expression: str, limits: ctx.ContextLimits = ctx.DEFAULT_LIMITS) -> str:
    """Why `expression` is refused; what it built stays small (memory, unlike time, does not
    depend on the machine's load; how fast: `python -m bench --sections bounds`)."""
    tracemalloc.start()
    try:
        with pytest.raises(ctx.ContextError) as refused:
            ctx.search(expression, ITEM, limits)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 30 * 1024 * 1024, peak
    return str(refused.value)


def test_the_jmespath_bomb_stops_at_the_size_limit() -> None:
    assert len(BOMB) < 300
    assert "larger than 1048576 bytes" in _bounded(BOMB, SIZE_ONLY)


@pytest.mark.parametrize(
    "expression",
    [
        "to_string(" + " | ".join(["[" + ",".join(["@"] * 10) + "]"] * 4) + ")",
        " | ".join(["[@,@,@,@,@,@,@,@,@,@][]"] * 10),  # flattening doubles real lists
        "join(',', [" + ",".join(["'" + "a" * 30 + "'"] * 20) + "] | [@,@,@,@,@,@,@,@][] "
        "| [@,@,@,@,@,@,@,@][] | [@,@,@,@,@,@,@,@][] | [@,@,@,@,@,@,@,@][] | [@,@][])",
        "length(to_string([@,@,@,@,@,@,@,@,@,@] | [@,@,@,@,@,@,@,@,@,@] | "
        "[@,@,@,@,@,@,@,@,@,@] | [@,@,@,@,@,@,@,@,@,@]))",
    ],
)
def test_values_built_in_one_step_are_bounded_too(expression: str) -> None:
    assert "larger than" in _bounded(expression, SIZE_ONLY)


def test_evaluation_has_a_time_bound() -> None:
    limits = ctx.ContextLimits(jmespath_timeout=0.05, max_bytes=100 * 1024 * 1024)
    slow = "sort_by(" + " | ".join(["[@,@,@,@,@,@,@,@][]"] * 6) + ", &to_string(@))"
    message = _bounded(slow, limits)
    assert "longer than 0.05 s" in message or "larger than" in message


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("[" * 3000 + "]" * 3000, "characters long"),
        ("[" * 20 + "@" + "]" * 20, "more than 16 deep"),
        ("[*]" * 300, "more than 64 levels"),
        ("!" * 900 + "a", "not valid JMESPath"),
        ("a[", "not valid JMESPath"),
    ],
)
def test_expressions_are_limited_before_they_run(expression: str, says: str) -> None:
    with pytest.raises(ctx.ContextError, match=says):
        ctx.validate_extractor({"type": "jmespath", "expression": expression})


def test_quoted_brackets_do_not_count_as_nesting() -> None:
    expression = "output[?content == '" + "[" * 30 + "'].content"
    assert ctx.validate_extractor({"type": "jmespath", "expression": expression})


@pytest.mark.parametrize("kind", [["jmespath"], {"a": 1}, 7, None, True])
def test_an_extractor_type_that_is_not_a_string_is_a_context_error(kind: Any) -> None:
    with pytest.raises(ctx.ContextError, match="context_extractor.type must be one of"):
        ctx.validate_extractor({"type": kind})


def test_ordinary_expressions_still_work() -> None:
    spec = {"type": "jmespath", "expression": "output[?role=='assistant'].content"}
    assert ctx.extract_context(spec, ITEM["input"], ITEM["output"]) == ["doc " * 250]
    assert ctx.search("to_string(@)", {"b": [1, 2]}) == '{"b":[1,2]}'  # JMESPath's own format
    assert ctx.search("join('-', ['a', 'b'])", {}) == "a-b"


def test_passages_are_limited_in_number_and_bytes() -> None:
    limits = ctx.ContextLimits(max_bytes=100, max_passages=3)
    assert ctx.resolve_context(["a", "b", "c"], None, None, None, None, limits) == ["a", "b", "c"]
    with pytest.raises(ctx.ContextError, match="4 passages; at most 3"):
        ctx.resolve_context(["a"] * 4, None, None, None, None, limits)
    with pytest.raises(ctx.ContextError, match="101 bytes; at most 100"):
        ctx.resolve_context(["é" * 50, "x"], None, None, None, None, limits)  # é is 2 bytes
    with pytest.raises(ctx.ContextError, match="larger than 100 bytes"):
        ctx.resolve_context([{"text": "x" * 200}], None, None, None, None, limits)
    # a list of a million elements is refused before any is looked at
    with pytest.raises(ctx.ContextError, match="1000000 passages"):
        ctx.to_passages([None] * 1_000_000, limits)


def test_bounded_json_stops_early_on_shared_parts() -> None:
    value: Any = "x" * 100
    for _ in range(40):  # 2^40 copies by reference
        value = [value, value]
    tracemalloc.start()
    try:
        with pytest.raises(ctx.ValueTooLarge):
            ctx.bounded_json(value, 10_000)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak  # it stopped early: the whole would be 2^40 x 100 bytes
    assert ctx.bounded_json({"b": 1, "a": [1]}, 100) == '{"a": [1], "b": 1}'


def test_the_source_of_an_items_context() -> None:
    agent_input, agent_output = ITEM["input"], ITEM["output"]
    extractor = {"type": "tool_results"}
    assert ctx.context_source(["c"], None, None, extractor) == "item"
    assert ctx.context_source(None, agent_input, agent_output, extractor) == "extractor"
    assert ctx.context_source(None, agent_input, agent_output, None) == "run"
    assert ctx.context_source(None, "q", "a", extractor) == "run"
