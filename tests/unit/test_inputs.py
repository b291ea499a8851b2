"""recallq.core.inputs: what a client sends is parsed and checked before anything looks at it."""

from __future__ import annotations

import json

import pytest

from recallq.core import inputs


def _refused(text: str | bytes, depth: int = 64) -> str:
    with pytest.raises(inputs.UnsafeInput) as refused:
        inputs.loads(text, depth)
    return str(refused.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"scale": NaN}', "NaN is not valid JSON"),
        ("[Infinity]", "Infinity is not valid JSON"),
        ("[-Infinity]", "-Infinity is not valid JSON"),
        ("[1e400]", "too large"),
        ('{"id": "a\\u0000b"}', "a NUL character"),
        ('{"a\\u0000": 1}', "a key contains a NUL character"),
        ('["\\ud800"]', "a lone UTF-16 surrogate"),
        ('["\\udc00x"]', "a lone UTF-16 surrogate"),
        ("[" + "9" * 5000 + "]", "body:"),
        ("{nope", "invalid JSON"),
    ],
)
def test_unsafe_json_is_refused_saying_why(text: str, says: str) -> None:
    assert says in _refused(text)


def test_not_utf8_is_refused() -> None:
    assert "not UTF-8" in _refused(b'["\xff"]')


def test_nesting_is_limited_without_recursion_errors() -> None:
    assert inputs.loads("[" * 64 + "]" * 64, 64) is not None  # 64 levels: fine
    assert "deeper than 64" in _refused("[" * 65 + "]" * 65)
    assert "deeper than 64" in _refused("[" * 100_000)  # the decoder's own recursion limit
    deep_object = '{"a": ' * 70 + "1" + "}" * 70
    assert "deeper than 64" in _refused(deep_object)


def test_good_json_passes_unchanged() -> None:
    value = {"id": "q1", "ground_truth": "Ünïcode 😀 fine", "n": [1, 2.5, -3, True, None]}
    assert inputs.loads(json.dumps(value), 64) == value
    assert inputs.loads(json.dumps(value, ensure_ascii=False).encode(), 64) == value
    assert inputs.loads('"\\ud83d\\ude00"', 64) == "😀"  # a surrogate pair is one character


def test_where_says_where() -> None:
    with pytest.raises(inputs.UnsafeInput, match="^line 7: "):
        inputs.loads("[NaN]", 64, where="line 7")


def test_check_text() -> None:
    assert inputs.check_text("fine", "name") == "fine"
    with pytest.raises(inputs.UnsafeInput, match="name contains a NUL character"):
        inputs.check_text("a\x00", "name")
    assert inputs.text_problem("\udfff") == "a lone UTF-16 surrogate"


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"a": "open', "invalid JSON: Unterminated string starting at column 7"),
        ('{"a": 1 "b": 2}', "invalid JSON: Expecting ',' delimiter at column 9"),
    ],
)
def test_json_errors_say_where_once(text: str, says: str) -> None:
    with pytest.raises(inputs.UnsafeInput) as info:
        inputs.loads(text, max_depth=8)
    assert str(info.value) == f"body: {says}"
    assert " at at " not in str(info.value)
