import pytest

from recallq.core.context import (
    ContextError,
    can_resolve_any,
    extract_context,
    is_agent_shaped,
    resolve_context,
    to_passages,
    validate_extractor,
)

TOOLS = {"type": "tool_results"}


def msg(role, content, id="m1"):
    return {"id": id, "role": role, "content": content, "createdAt": "2025-01-01T00:00:00Z"}


def invocation(result, name="search", call_id="c1", state="result", args=None):
    inv = {"state": state, "toolName": name, "args": args or {"q": "x"}, "result": result}
    if call_id is not None:
        inv["toolCallId"] = call_id
    return inv


def agent_input(input_messages=(), remembered=()):
    return {
        "inputMessages": list(input_messages),
        "rememberedMessages": list(remembered),
        "systemMessages": [],
        "taggedSystemMessages": {},
    }


# --- validate_extractor ----------------------------------------------------------------------


def test_validate_none_and_normalises():
    assert validate_extractor(None) is None
    assert validate_extractor({"type": "tool_results"}) == {"type": "tool_results", "tools": None}
    assert validate_extractor({"type": "tool_results", "tools": ["a", "b", "a"]}) == {
        "type": "tool_results",
        "tools": ["a", "b"],
    }
    assert validate_extractor({"type": "jmespath", "expression": "output[0].content"}) == {
        "type": "jmespath",
        "expression": "output[0].content",
    }


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("tool_results", "must be an object"),
        ({}, "type must be one of"),
        ({"type": "regex"}, "type must be one of 'tool_results', 'jmespath', got 'regex'"),
        ({"type": "jmespath"}, "expression is required"),
        ({"type": "jmespath", "expression": "  "}, "expression is required"),
        ({"type": "jmespath", "expression": 3}, "expression is required"),
        ({"type": "jmespath", "expression": "foo["}, "not valid JMESPath"),
        ({"type": "tool_results", "tools": "search"}, "tools must be a non-empty list"),
        ({"type": "tool_results", "tools": []}, "tools must be a non-empty list"),
        ({"type": "tool_results", "tools": ["ok", 1]}, "tools must be a non-empty list"),
        ({"type": "tool_results", "expression": "a"}, "unknown field(s): expression"),
    ],
)
def test_validate_rejects(spec, fragment):
    with pytest.raises(ContextError) as excinfo:
        validate_extractor(spec)
    assert fragment in str(excinfo.value)


# --- is_agent_shaped -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("input", "output", "expected"),
    [
        (agent_input(), [msg("assistant", "hi")], True),
        (None, [msg("assistant", "hi")], True),
        ({"inputMessages": []}, [{"role": "assistant", "content": "no id"}], True),
        ("what year?", [msg("assistant", "hi")], False),
        ({"question": "what year?"}, [msg("assistant", "hi")], False),
        (agent_input(), [], False),
        (agent_input(), "plain answer", False),
        (agent_input(), None, False),
        (agent_input(), [{"id": "m1", "content": "no role"}], False),
        (agent_input(), [msg("assistant", "ok"), "not a message"], False),
    ],
)
def test_is_agent_shaped(input, output, expected):
    assert is_agent_shaped(input, output) is expected


# --- to_passages -----------------------------------------------------------------------------


def test_to_passages():
    assert to_passages(None) == []
    assert to_passages("a") == ["a"]
    assert to_passages("   ") == []
    assert to_passages([]) == []
    assert to_passages(["a", "", " ", None, 5, {"b": 1, "a": "é"}]) == [
        "a",
        "5",
        '{"a": "é", "b": 1}',
    ]
    assert to_passages({"k": "v"}) == ['{"k": "v"}']


# --- tool_results ----------------------------------------------------------------------------


def test_tool_results_from_tool_invocations():
    content = {"format": 2, "parts": [], "toolInvocations": [invocation("Einstein: 1879")]}
    assert extract_context(TOOLS, agent_input(), [msg("assistant", content)]) == ["Einstein: 1879"]


def test_tool_results_from_both_part_shapes():
    parts = [
        {"type": "text", "text": "looking"},
        {"type": "tool-invocation", "toolInvocation": invocation("from invocation part")},
        {"type": "tool-result", "toolCallId": "c2", "toolName": "search", "result": "from result"},
        {"type": "tool-result", "toolCallId": "c3", "toolName": "search", "output": "from output"},
    ]
    output = [msg("assistant", {"format": 2, "parts": parts})]
    assert extract_context(TOOLS, agent_input(), output) == [
        "from invocation part",
        "from result",
        "from output",
    ]


def test_tool_results_dedupe_by_call_id_and_content():
    inv = invocation("same call")
    anonymous = invocation("no id", call_id=None)
    content = {
        "toolInvocations": [inv, anonymous],
        "parts": [
            {"type": "tool-invocation", "toolInvocation": inv},
            {"type": "tool-invocation", "toolInvocation": anonymous},
        ],
    }
    other = {"toolInvocations": [invocation("same call", call_id="c9")]}
    output = [msg("assistant", content), msg("assistant", other, id="m2")]
    assert extract_context(TOOLS, None, output) == ["same call", "no id", "same call"]


def test_tool_results_skips_unfinished_invocations():
    content = {
        "toolInvocations": [
            invocation("pending", state="call", call_id="a"),
            invocation("partial", state="partial-call", call_id="b"),
            {"toolCallId": "c", "toolName": "search", "args": {}},
            {"toolCallId": "d", "toolName": "search", "result": "stateless"},
        ]
    }
    assert extract_context(TOOLS, None, [msg("assistant", content)]) == ["stateless"]


def test_tool_results_tools_filter():
    content = {
        "toolInvocations": [
            invocation("kept", name="search", call_id="a"),
            invocation("dropped", name="weather", call_id="b"),
            invocation("also kept", name="lookup", call_id="c"),
        ]
    }
    spec = {"type": "tool_results", "tools": ["search", "lookup"]}
    assert extract_context(spec, None, [msg("assistant", content)]) == ["kept", "also kept"]


def test_tool_results_only_from_assistant_messages():
    tool_data = {"toolInvocations": [invocation("user-supplied", call_id="u")]}
    history = [
        msg("user", tool_data, id="u1"),
        msg("assistant", {"toolInvocations": [invocation("earlier", call_id="h")]}, id="h1"),
    ]
    remembered = [msg("assistant", {"toolInvocations": [invocation("remembered", call_id="r")]})]
    output = [
        msg("user", tool_data, id="u2"),
        msg("system", tool_data, id="s1"),
        msg("assistant", {"toolInvocations": [invocation("now", call_id="n")]}, id="a1"),
    ]
    inp = agent_input(input_messages=history, remembered=remembered)
    assert extract_context(TOOLS, inp, output) == ["remembered", "earlier", "now"]


def test_tool_results_non_string_results_become_json():
    content = {
        "toolInvocations": [
            invocation({"year": 1879, "name": "Einstein"}, call_id="a"),
            invocation(42, call_id="b"),
            invocation([1, 2], call_id="c"),
            invocation(None, call_id="d"),
            invocation("", call_id="e"),
        ]
    }
    assert extract_context(TOOLS, None, [msg("assistant", content)]) == [
        '{"name": "Einstein", "year": 1879}',
        "42",
        "[1, 2]",
    ]


def test_tool_results_list_of_documents_split():
    docs = [
        {"text": "doc one", "score": 0.9},
        {"content": "doc two"},
        {"snippet": "doc three", "url": "http://x"},
        "doc four",
    ]
    mixed = [{"text": "t"}, {"title": "no text key"}]
    content = {"toolInvocations": [invocation(docs, call_id="a"), invocation(mixed, call_id="b")]}
    assert extract_context(TOOLS, None, [msg("assistant", content)]) == [
        "doc one",
        "doc two",
        "doc three",
        "doc four",
        '[{"text": "t"}, {"title": "no text key"}]',
    ]


def test_tool_results_string_content_and_part_list_content():
    parts = [{"type": "tool-result", "toolCallId": "p", "toolName": "search", "result": "bare"}]
    output = [msg("assistant", "just text"), msg("assistant", parts, id="m2")]
    assert extract_context(TOOLS, None, output) == ["bare"]


# --- jmespath --------------------------------------------------------------------------------


def test_jmespath_over_output():
    output = [
        msg("user", "question", id="u"),
        msg("assistant", "answer one", id="a1"),
        msg("assistant", {"parts": [{"type": "text", "text": "x"}]}, id="a2"),
    ]
    spec = {"type": "jmespath", "expression": "output[?role=='assistant'].content"}
    assert extract_context(spec, agent_input(), output) == [
        "answer one",
        '{"parts": [{"text": "x", "type": "text"}]}',
    ]


def test_jmespath_result_shapes():
    inp = {"inputMessages": [{"role": "user", "content": "q"}], "extra": {"n": 1}}
    output = [msg("assistant", "a")]

    def run(expression):
        return extract_context({"type": "jmespath", "expression": expression}, inp, output)

    assert run("input.inputMessages[0].content") == ["q"]
    assert run("input.missing") == []
    assert run("input.extra") == ['{"n": 1}']
    assert run("length(output)") == ["1"]


def test_jmespath_runtime_error_is_context_error():
    spec = {"type": "jmespath", "expression": "abs(output[0].content)"}
    with pytest.raises(ContextError, match="expression failed"):
        extract_context(spec, None, [msg("assistant", "a")])


def test_extract_context_rejects_bad_spec():
    with pytest.raises(ContextError, match="type must be one of"):
        extract_context({"type": "nope"}, None, [msg("assistant", "a")])


# --- resolve_context / can_resolve_any -------------------------------------------------------

AGENT_OUT = [msg("assistant", {"toolInvocations": [invocation("retrieved")]})]


def test_item_context_wins():
    assert resolve_context(["own"], agent_input(), AGENT_OUT, ["static"], TOOLS) == ["own"]
    assert resolve_context("own", "q", "a", ["static"], None) == ["own"]


def test_explicit_empty_item_context_stays_empty():
    assert resolve_context([], agent_input(), AGENT_OUT, ["static"], TOOLS) == []
    assert can_resolve_any([], "q", "a", None, None) is True


def test_extractor_used_when_agent_shaped():
    assert resolve_context(None, agent_input(), AGENT_OUT, ["static"], TOOLS) == ["retrieved"]
    # An applicable extractor that finds nothing does not fall back to static context.
    empty_out = [msg("assistant", "no tools used")]
    assert resolve_context(None, agent_input(), empty_out, ["static"], TOOLS) == []


def test_static_fallback_when_not_agent_shaped():
    assert resolve_context(None, "q", "plain answer", ["static", " "], TOOLS) == ["static"]
    assert resolve_context(None, agent_input(), AGENT_OUT, ["static"], None) == ["static"]
    assert resolve_context(None, "q", "a", None, TOOLS) == []


def test_can_resolve_any():
    assert can_resolve_any(["own"], "q", "a", None, None) is True
    assert can_resolve_any(None, agent_input(), AGENT_OUT, None, TOOLS) is True
    assert can_resolve_any(None, "q", "a", ["static"], None) is True
    assert can_resolve_any(None, "q", "a", None, TOOLS) is False
    assert can_resolve_any(None, agent_input(), AGENT_OUT, None, None) is False
    assert can_resolve_any(None, "q", "a", [], None) is False
    assert can_resolve_any(None, "q", "a", ["  "], None) is False
