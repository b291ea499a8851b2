"""Unit tests for recallq.judge.protocol: the judge protocol v1 prompts, schemas and parsing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from recallq.judge.protocol import (
    ATTRIBUTION,
    ATTRIBUTION_SCHEMA,
    EXTRACTION,
    EXTRACTION_SCHEMA,
    ProtocolError,
    attribution_messages,
    extraction_messages,
    parse_answer,
    response_format,
)

FENCE_OPEN = "```json\n"
BLOCK = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


def last_user_content(messages: list[dict[str, str]]) -> str:
    users = [m for m in messages if m["role"] == "user"]
    assert users, "no user message"
    assert messages[-1] is users[-1], "the data must be in the last message"
    return users[-1]["content"]


def json_block(content: str) -> object:
    """The data of the single fenced ```json block in the message."""
    assert content.count(FENCE_OPEN) == 1
    assert content.count("```") == 2
    blocks = BLOCK.findall(content)
    assert len(blocks) == 1
    assert content.rstrip().endswith("```")
    return json.loads(blocks[0])


# --- messages ------------------------------------------------------------------------------


def test_extraction_messages_shape() -> None:
    messages = extraction_messages("Einstein was born in 1879. He won the Nobel Prize.")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert all(isinstance(m["content"], str) and m["content"] for m in messages)
    assert '{"claims"' in messages[0]["content"]


@pytest.mark.parametrize(
    "ground_truth",
    [
        "Einstein was born in 1879. He won the Nobel Prize.",
        'He said "hello"\nand left.\t Done \\ ok',
        "Zürich, 東京, emoji 🎉",
        '{"born": 1879}',
        "",
    ],
    ids=repr,
)
def test_extraction_data_block_round_trips(ground_truth: str) -> None:
    content = last_user_content(extraction_messages(ground_truth))
    assert json_block(content) == {"ground_truth": ground_truth}


def test_extraction_block_keeps_unicode_readable() -> None:
    content = last_user_content(extraction_messages("Zürich"))
    assert "Zürich" in content


def test_attribution_messages_shape() -> None:
    messages = attribution_messages(["a"], ["b"])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert '{"verdicts"' in messages[0]["content"]
    assert messages[0]["content"] != extraction_messages("x")[0]["content"]


def test_attribution_data_block_round_trips() -> None:
    claims = ["Einstein was born in 1879", 'He said "E=mc²"']
    contexts = ["Albert Einstein was born on 14 March 1879 in Ulm.", "Line one\nline two", "ctx 3"]
    content = last_user_content(attribution_messages(claims, contexts))
    assert json_block(content) == {
        "claims": [
            {"index": 0, "text": "Einstein was born in 1879"},
            {"index": 1, "text": 'He said "E=mc²"'},
        ],
        "contexts": [
            {"index": 0, "text": "Albert Einstein was born on 14 March 1879 in Ulm."},
            {"index": 1, "text": "Line one\nline two"},
            {"index": 2, "text": "ctx 3"},
        ],
    }


def test_attribution_data_block_with_no_contexts() -> None:
    content = last_user_content(attribution_messages(["a claim"], []))
    assert json_block(content) == {"claims": [{"index": 0, "text": "a claim"}], "contexts": []}


def test_attribution_data_key_order_is_claims_then_contexts() -> None:
    data: Any = json_block(last_user_content(attribution_messages(["c"], ["x"])))
    assert list(data) == ["claims", "contexts"]
    assert list(data["claims"][0]) == ["index", "text"]
    assert list(data["contexts"][0]) == ["index", "text"]


def test_data_with_backticks_is_still_recoverable_from_the_fence() -> None:
    ground_truth = "Use ``` to open a code fence."
    content = last_user_content(extraction_messages(ground_truth))
    start = content.index(FENCE_OPEN) + len(FENCE_OPEN)
    data, _ = json.JSONDecoder().raw_decode(content[start:])
    assert data == {"ground_truth": ground_truth}


# --- response_format -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "schema"),
    [("claim_extraction", EXTRACTION_SCHEMA), ("claim_attribution", ATTRIBUTION_SCHEMA)],
)
def test_response_format(name: str, schema: dict) -> None:
    assert response_format(name) == {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": True},
    }
    assert response_format(name)["json_schema"]["strict"] is True


def test_schema_names_are_the_contract_names() -> None:
    assert EXTRACTION == "claim_extraction"
    assert ATTRIBUTION == "claim_attribution"


def test_extraction_schema_is_claims_list_of_strings() -> None:
    assert EXTRACTION_SCHEMA["type"] == "object"
    assert EXTRACTION_SCHEMA["required"] == ["claims"]
    assert EXTRACTION_SCHEMA["additionalProperties"] is False
    assert EXTRACTION_SCHEMA["properties"] == {
        "claims": {"type": "array", "items": {"type": "string"}}
    }


def test_attribution_schema_is_strict_verdict_list() -> None:
    assert ATTRIBUTION_SCHEMA["required"] == ["verdicts"]
    assert ATTRIBUTION_SCHEMA["additionalProperties"] is False
    item = ATTRIBUTION_SCHEMA["properties"]["verdicts"]["items"]
    assert item["additionalProperties"] is False
    # strict mode needs every property listed as required
    assert set(item["required"]) == set(item["properties"])
    assert set(item["properties"]) == {"claim_index", "verdict", "context_indices", "reason"}
    assert item["properties"]["claim_index"] == {"type": "integer"}
    assert item["properties"]["verdict"]["enum"] == ["yes", "no"]
    assert item["properties"]["context_indices"] == {
        "type": "array",
        "items": {"type": "integer"},
    }
    assert item["properties"]["reason"] == {"type": "string"}


# --- parse_answer --------------------------------------------------------------------------

VERDICTS = {
    "verdicts": [{"claim_index": 0, "verdict": "yes", "context_indices": [0], "reason": "r"}]
}


def test_parse_valid_extraction() -> None:
    assert parse_answer(EXTRACTION, '{"claims": ["a", "b"]}', "stop") == {"claims": ["a", "b"]}


def test_parse_valid_attribution() -> None:
    assert parse_answer(ATTRIBUTION, json.dumps(VERDICTS), "stop") == VERDICTS


def test_parse_keeps_attribution_entries_unchanged() -> None:
    odd = {"verdicts": [{"claim_index": "x", "verdict": "Yes."}, 3], "extra": 1}
    assert parse_answer(ATTRIBUTION, json.dumps(odd), None) == odd


@pytest.mark.parametrize("finish_reason", [None, "stop", "tool_calls", "content_filter"])
def test_parse_accepts_non_length_finish_reasons(finish_reason) -> None:
    assert parse_answer(EXTRACTION, '{"claims": []}', finish_reason) == {"claims": []}


def test_parse_tolerates_surrounding_whitespace() -> None:
    assert parse_answer(EXTRACTION, '\n  {"claims": ["a"]}  \n', "stop") == {"claims": ["a"]}


@pytest.mark.parametrize(
    "content",
    [
        '```json\n{"claims": ["a", "b"]}\n```',
        '```\n{"claims": ["a", "b"]}\n```',
        '```json{"claims": ["a", "b"]}```',
        'Here are the claims:\n\n```json\n{"claims": ["a", "b"]}\n```\nHope this helps.',
        '  ```json\n  {\n "claims": [\n  "a",\n  "b"\n ]\n}\n  ```  ',
    ],
    ids=["json-fence", "bare-fence", "inline-fence", "prose-around", "indented"],
)
def test_parse_json_inside_a_fence(content: str) -> None:
    assert parse_answer(EXTRACTION, content, "stop") == {"claims": ["a", "b"]}


def test_parse_attribution_inside_a_fence() -> None:
    content = f"Verdicts:\n```json\n{json.dumps(VERDICTS, indent=2)}\n```"
    assert parse_answer(ATTRIBUTION, content, "stop") == VERDICTS


def test_parse_object_with_backticks_in_strings_is_not_refenced() -> None:
    content = '{"claims": ["write ```json``` blocks", "b"]}'
    assert parse_answer(EXTRACTION, content, "stop") == {"claims": ["write ```json``` blocks", "b"]}


@pytest.mark.parametrize(
    "content",
    [
        '{"claims": ["a", ',
        "not json at all",
        "{'claims': ['a']}",
        '{"claims": ["a"]} trailing text',
        "```json\n{broken\n```",
    ],
    ids=["truncated", "prose", "single-quotes", "trailing", "broken-fence"],
)
def test_parse_invalid_json_raises_quoting_the_text(content: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_answer(EXTRACTION, content, "stop")
    message = str(info.value)
    assert "invalid JSON" in message
    assert content in message


def test_parse_invalid_json_clips_long_text() -> None:
    content = "x" * 1000
    with pytest.raises(ProtocolError) as info:
        parse_answer(EXTRACTION, content, "stop")
    message = str(info.value)
    assert "x" * 200 + "…" in message
    assert "x" * 201 not in message


def test_protocol_error_is_a_value_error() -> None:
    assert issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize(
    ("schema_name", "content", "key"),
    [
        (EXTRACTION, "[]", "claims"),
        (EXTRACTION, '["a", "b"]', "claims"),
        (EXTRACTION, '"claims"', "claims"),
        (EXTRACTION, "42", "claims"),
        (EXTRACTION, "null", "claims"),
        (EXTRACTION, "{}", "claims"),
        (EXTRACTION, '{"claims": "a"}', "claims"),
        (EXTRACTION, '{"claims": null}', "claims"),
        (EXTRACTION, '{"claims": {"0": "a"}}', "claims"),
        (EXTRACTION, json.dumps(VERDICTS), "claims"),
        (ATTRIBUTION, '{"claims": ["a"]}', "verdicts"),
        (ATTRIBUTION, '{"verdicts": {}}', "verdicts"),
        (ATTRIBUTION, '{"verdicts": "yes"}', "verdicts"),
        (ATTRIBUTION, '[{"claim_index": 0, "verdict": "yes"}]', "verdicts"),
    ],
)
def test_parse_wrong_shape_raises(schema_name: str, content: str, key: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_answer(schema_name, content, "stop")
    message = str(info.value)
    assert f'"{key}" list' in message
    assert content in message


@pytest.mark.parametrize("content", ['{"claims": ["a"]}', '{"claims": [', "", None], ids=repr)
def test_parse_cut_off_answer_raises(content) -> None:
    with pytest.raises(ProtocolError, match="cut off"):
        parse_answer(EXTRACTION, content, "length")


def test_parse_cut_off_attribution_raises() -> None:
    with pytest.raises(ProtocolError, match="cut off"):
        parse_answer(ATTRIBUTION, json.dumps(VERDICTS), "length")


@pytest.mark.parametrize("content", [None, "", "   ", "\n\t\n"], ids=repr)
def test_parse_empty_answer_raises(content) -> None:
    with pytest.raises(ProtocolError, match="empty"):
        parse_answer(EXTRACTION, content, "stop")


def test_parse_cleans_claims_of_blanks_and_non_strings() -> None:
    content = json.dumps(
        {"claims": ["  first  ", "", "   ", 3, None, True, {"x": 1}, ["y"], "\tsecond\n", "third"]}
    )
    assert parse_answer(EXTRACTION, content, "stop") == {"claims": ["first", "second", "third"]}


def test_parse_claims_can_end_up_empty() -> None:
    assert parse_answer(EXTRACTION, '{"claims": ["", " ", 1]}', "stop") == {"claims": []}


# --- packed extraction ---------------------------------------------------------------------


def test_packed_extraction_carries_every_ground_truth_with_its_index() -> None:
    from recallq.judge.protocol import EXTRACTION_PACKED, packed_extraction_messages

    messages = packed_extraction_messages(["First fact.", "Second fact."])
    data = json.loads(messages[-1]["content"].split("```json\n", 1)[1].rsplit("```", 1)[0])
    assert data == {
        "ground_truths": [{"index": 0, "text": "First fact."}, {"index": 1, "text": "Second fact."}]
    }
    assert "exactly as if it were the only one" in messages[0]["content"]
    assert response_format(EXTRACTION_PACKED)["json_schema"]["name"] == "claim_extraction_packed"


def test_packed_claims_keep_good_entries_and_drop_the_rest() -> None:
    from recallq.judge.protocol import EXTRACTION_PACKED, packed_claims

    content = json.dumps(
        {
            "items": [
                {"index": 0, "claims": [" Ada wrote code. ", "", 7, "Ada was born in 1815"]},
                {"index": 0, "claims": ["repeated index: both entries of index 0 are dropped"]},
                {"index": 3, "claims": ["out of range"]},
                {"index": True, "claims": ["not an index"]},
                {"index": 1, "claims": "not a list"},
                "not an object",
                {"index": 2, "claims": ["Rome is in Italy"]},
            ]
        }
    )
    data = parse_answer(EXTRACTION_PACKED, content, "stop")
    truths = ["Ada wrote code. Ada was born in 1815.", "Paris is in France.", "Rome is in Italy."]
    assert packed_claims(data, truths) == {2: ["Rome is in Italy"]}
    del data["items"][1]  # index 0 answered once: kept, cleaned
    assert packed_claims(data, truths) == {
        0: ["Ada wrote code.", "Ada was born in 1815"],
        2: ["Rome is in Italy"],
    }


def test_a_packed_answer_without_items_is_malformed() -> None:
    from recallq.judge.protocol import EXTRACTION_PACKED

    with pytest.raises(ProtocolError, match='expected an object with a "items" list'):
        parse_answer(EXTRACTION_PACKED, '{"claims": []}', "stop")


@pytest.mark.parametrize(
    "answer",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"claims": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"claims": ["a"], "extra": ' + "[" * 950 + "]" * 950 + "}",
    ],
)
def test_an_answer_nested_too_deeply_is_malformed_not_a_crash(answer: str) -> None:
    """A hostile judge's answer nested past the parser's depth (or past what walking it
    allows) is a malformed answer, like any other JSON the protocol cannot take."""
    with pytest.raises(ProtocolError, match="nested too deeply"):
        parse_answer(EXTRACTION, answer, "stop")
