import json
import sys
from pathlib import Path

import pytest

from recallq.runs import data_files, dataset
from recallq.runs.dataset import (
    FIELD_ALIASES,
    MAX_METADATA_BYTES,
    DatasetError,
    items_from,
    normalise,
    read_records,
    records_from,
)

DATA = Path(__file__).parent.parent / "data"
EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def error_of(call, *args, **kwargs) -> str:
    """The message of the DatasetError a call raises (draining generators), checked one line."""
    with pytest.raises(DatasetError) as caught:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            list(result)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


# --- the alias table -------------------------------------------------------------------------


def test_alias_table_is_the_documented_one():
    assert FIELD_ALIASES == {
        "id": (),
        "input": ("user_input", "question", "query"),
        "output": ("response", "actual_output", "answer"),
        "ground_truth": ("reference", "groundTruth", "expected_output", "ground_truths"),
        "context": ("retrieved_contexts", "retrieval_context", "contexts"),
    }


# --- tools' shapes normalise without edits ---------------------------------------------------


def test_ragas_jsonl_normalises():
    items = list(items_from(DATA / "ragas.jsonl"))
    assert items == [
        {
            "input": "When did the first Super Bowl take place?",
            "output": "The first Super Bowl was played on January 15, 1967.",
            "ground_truth": "The first Super Bowl was held on January 15, 1967, in Los Angeles.",
            "context": [
                "The First AFL-NFL World Championship Game was played on January 15, 1967, "
                "at the Los Angeles Memorial Coliseum."
            ],
        },
        {
            "input": "Who wrote Pride and Prejudice?",
            "output": "Jane Austen wrote it.",
            "ground_truth": "Pride and Prejudice was written by Jane Austen and published in 1813.",
            "context": [
                "Pride and Prejudice is an 1813 novel by Jane Austen.",
                "Austen's novels were published anonymously.",
            ],
            "metadata": {
                "reference_contexts": [
                    "Pride and Prejudice is an 1813 novel of manners written by Jane Austen."
                ]
            },
        },
    ]


def test_deepeval_json_array_normalises():
    items = list(items_from(DATA / "deepeval.json"))
    assert [item["input"] for item in items] == [
        "What is the refund window for annual plans?",
        "Which regions host customer data?",
    ]
    first = items[0]
    # DeepEval's null "context" (its ideal context) and "comments" are absent, not ambiguous.
    assert first == {
        "input": "What is the refund window for annual plans?",
        "output": "Annual plans can be refunded within 30 days.",
        "ground_truth": "Annual plans are refundable within 30 days of purchase. "
        "Monthly plans are not refundable.",
        "context": [
            "Refunds: annual subscriptions may be refunded in full within 30 days of purchase.",
            "Monthly subscriptions are not eligible for refunds.",
        ],
        "metadata": {"additional_metadata": {"topic": "billing"}, "comments": None},
    }


@pytest.mark.parametrize("name", ["eval_set.jsonl", "agent_run.jsonl"])
def test_canonical_examples_pass_through_unchanged(name):
    """recallq's own item shape is a fixed point, agent-shaped input/output included; only
    null fields drop out, which recallq reads as absent anyway."""
    path = EXAMPLES / name
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert (
        any(value is None for record in raw for value in record.values())
        or name != "eval_set.jsonl"
    )
    expected = [{k: v for k, v in record.items() if v is not None} for record in raw]
    assert list(items_from(path)) == expected


def test_langchain_document_contexts():
    record = {
        "id": "d1",
        "question": "q",
        "ground_truth": "g",
        "contexts": [
            {"page_content": "first", "metadata": {"source": "a.pdf", "page": 3}},
            None,
            {"text": "second", "page_content": "ignored: text comes first"},
            {"content": "third", "score": 0.7},
            "fourth",
        ],
    }
    assert normalise(record, 0)["context"] == ["first", "second", "third", "fourth"]


def test_document_objects_in_memory():
    class Document:  # the attribute shape of langchain_core.documents.Document
        def __init__(self, page_content: str) -> None:
            self.page_content = page_content
            self.metadata = {"source": "x"}

    records = [{"question": "q", "reference": "g", "retrieved_contexts": [Document("p1")]}]
    assert list(items_from(records))[0]["context"] == ["p1"]
    single = normalise({"reference": "g", "context": Document("only")}, 0)
    assert single["context"] == ["only"]


# --- context shapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ("one passage", ["one passage"]),
        ({"text": "one object"}, ["one object"]),
        ([], []),
        (["a", None, "b"], ["a", "b"]),
        (("a", "b"), ["a", "b"]),
    ],
)
def test_context_values(context, expected):
    assert normalise({"ground_truth": "g", "context": context}, 0)["context"] == expected


def test_missing_and_null_context_stay_absent():
    # Absent differs from []: recallq then falls back to the run's extractor or static context.
    assert "context" not in normalise({"ground_truth": "g"}, 0)
    assert "context" not in normalise({"ground_truth": "g", "contexts": None}, 0)
    assert normalise({"ground_truth": "g", "context": []}, 0)["context"] == []


def test_passage_object_without_text_names_item_and_keys():
    record = {"id": "q7", "reference": "g", "contexts": ["ok", {"title": "T", "body": "B"}]}
    message = error_of(normalise, record, 4)
    assert message == (
        "item 4 (q7): context passage 1 has no 'text', 'page_content' or 'content' text "
        "(its keys: 'body', 'title')"
    )


@pytest.mark.parametrize(
    ("context", "fragment"),
    [
        ([{"text": ["a"]}], "context passage 0: 'text' must be a string, got a list"),
        ([3], "context passage 0 is a number"),
        (3, "context must be a list of passages"),
        (True, "got a boolean"),
    ],
)
def test_bad_context_values(context, fragment):
    assert fragment in error_of(normalise, {"context": context}, 2)


def test_agent_shaped_input_and_output_untouched():
    agent_input = {"inputMessages": [{"role": "user", "content": "hi"}], "systemMessages": []}
    agent_output = [{"id": "m", "role": "assistant", "content": {"parts": []}}]
    item = normalise({"input": agent_input, "output": agent_output, "ground_truth": "g"}, 0)
    assert item["input"] is agent_input and item["output"] is agent_output


def test_ground_truths_list_is_joined():
    item = normalise({"ground_truths": ["first.", None, "second."]}, 0)
    assert item["ground_truth"] == "first.\nsecond."
    assert normalise({"ground_truths": "as is"}, 0)["ground_truth"] == "as is"
    assert "list of strings" in error_of(normalise, {"ground_truths": ["a", 1]}, 0)


def test_non_string_ground_truth_passes_through():
    # scoring serialises a non-string ground truth as JSON text; normalise must not.
    assert normalise({"reference": {"a": 1}}, 0)["ground_truth"] == {"a": 1}


# --- mapping and ambiguity -------------------------------------------------------------------


def test_mapping_applies_before_aliases():
    record = {"id": "m1", "gold": "g", "question": "q", "passages": ["p"], "answer": "a"}
    # "answer" is an output alias, but the mapping sends it elsewhere: here, a second id.
    assert "fields 'id' and 'answer' both give 'id'" in error_of(
        normalise, record, 0, {"gold": "ground_truth", "answer": "id"}
    )
    del record["answer"]
    item = normalise(record, 0, {"gold": "ground_truth", "passages": "context"})
    assert item == {"id": "m1", "input": "q", "ground_truth": "g", "context": ["p"]}


def test_mapping_to_unknown_field_is_an_error():
    message = error_of(normalise, {"gold": "g"}, 0, {"gold": "truth"})
    assert message == (
        "mapping gold=truth: 'truth' is not an item field; "
        "map to one of id, input, output, ground_truth, context, to metadata or metadata.NAME "
        "(kept as metadata), or to - (dropped)"
    )
    assert "not an item field" in error_of(normalise, {"gold": "g"}, 0, {"gold": "metadata."})


def test_deepeval_ideal_context_beside_the_retrieved_one():
    """DeepEval's `context` is the ideal context: ambiguous beside `retrieval_context` until a
    mapping sends it to metadata or drops it."""
    record = {"input": "q", "context": ["ideal"], "retrieval_context": ["got"], "tag": "t"}
    message = error_of(normalise, record, 0)
    assert "fields 'context' and 'retrieval_context' both give 'context'" in message
    hint = (
        "--map context=metadata.ideal_context keeps it as metadata and scores 'retrieval_context'"
    )
    assert hint in message
    # whichever field comes first, the hint never points at the retrieved passages
    reversed_record = {"retrieval_context": ["got"], "context": ["ideal"]}
    reversed_message = error_of(normalise, reversed_record, 0)
    assert hint in reversed_message and "retrieval_context=" not in reversed_message
    kept = normalise(record, 0, {"context": "metadata.ideal_context"})
    assert kept == {
        "input": "q",
        "context": ["got"],
        "metadata": {"tag": "t", "ideal_context": ["ideal"]},
    }
    assert normalise(record, 0, {"context": "metadata"})["metadata"]["context"] == ["ideal"]
    assert normalise(record, 0, {"context": "-", "tag": "-"}) == {"input": "q", "context": ["got"]}


def test_mapped_metadata_is_not_taken_for_a_typo():
    assert normalise({"contxt": "x", "gold": "g"}, 0, {"contxt": "metadata"}) == {
        "metadata": {"contxt": "x", "gold": "g"}
    }


def test_parse_mapping():
    assert dataset.parse_mapping(["gold=ground_truth,ctx=metadata.ctx", "x=-"]) == {
        "gold": "ground_truth",
        "ctx": "metadata.ctx",
        "x": "-",
    }
    assert dataset.parse_mapping([]) == {}


@pytest.mark.parametrize(
    ("texts", "fragment"),
    [
        (["reference"], "mapping 'reference': write SOURCE=TARGET"),
        (["=ground_truth"], "write SOURCE=TARGET"),
        (["a=ground_truth", "a=input"], "'a' is mapped twice (ground_truth and input)"),
        (["a=b.c"], "mapping a=b.c: 'b.c' is not an item field"),
    ],
)
def test_parse_mapping_errors(texts, fragment):
    assert fragment in error_of(dataset.parse_mapping, texts)


def test_csv_column_mapped_away_from_context(tmp_path):
    path = write(tmp_path, "d.csv", "context,context_1,reference\nideal,got,g\n")
    assert list(items_from(path, mapping={"context": "metadata.ideal"})) == [
        {"ground_truth": "g", "context": ["got"], "metadata": {"ideal": "ideal"}}
    ]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            {"id": "q3", "reference": "a", "ground_truth": "b"},
            "item 3 (q3): fields 'reference' and 'ground_truth' both give 'ground_truth'",
        ),
        (
            {"id": "q3", "contexts": ["a"], "retrieved_contexts": ["b"]},
            "item 3 (q3): fields 'contexts' and 'retrieved_contexts' both give 'context'",
        ),
        (
            {"question": "a", "query": "b", "user_input": "c"},
            "item 3: fields 'question', 'query' and 'user_input' all give 'input'; keep one",
        ),
    ],
)
def test_two_fields_for_one_canonical_field(record, expected):
    assert error_of(normalise, record, 3).startswith(expected)


def test_a_null_duplicate_is_not_ambiguous():
    assert normalise({"reference": "a", "ground_truth": None}, 0) == {"ground_truth": "a"}


# --- typo hints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "hint"),
    [
        ("ground_thruth", "ground_truth"),
        ("contxt", "context"),
        ("refrence", "reference"),
        ("retrieved_context", "retrieved_contexts"),
        ("Question", "question"),
        ("ID", "id"),
    ],
)
def test_typo_of_a_missing_field_is_an_error_with_a_hint(field, hint):
    record = {"id": "q3", "input": "i", "ground_truth": "g", "context": ["c"]}
    canonical = data_files.ALIAS_TO_FIELD.get(hint, hint)
    del record[canonical]
    record[field] = "value"
    label = "item 3" if canonical == "id" else "item 3 (q3)"
    assert error_of(normalise, record, 3) == (
        f"{label}: unknown field {field!r}; did you mean {hint!r}?"
    )


def test_look_alike_beside_the_real_field_is_metadata():
    record = {"ground_truth": "g", "ground_thruth": "old", "context": [], "contxt": "x"}
    assert normalise(record, 0)["metadata"] == {"ground_thruth": "old", "contxt": "x"}


@pytest.mark.parametrize("field", ["idx", "query_id", "contexts_v2", "topic", "source"])
def test_ordinary_fields_are_not_typos(field):
    assert normalise({field: "x"}, 0) == {"metadata": {field: "x"}}


# --- metadata --------------------------------------------------------------------------------


def test_explicit_metadata_is_merged_and_wins():
    record = {"ground_truth": "g", "topic": "top-level", "lang": "en", "metadata": {"topic": "m"}}
    assert normalise(record, 0)["metadata"] == {"topic": "m", "lang": "en"}


def test_non_object_metadata_is_an_ordinary_field():
    assert normalise({"metadata": "free text"}, 0) == {"metadata": {"metadata": "free text"}}


def test_metadata_limit():
    overhead = len('{"blob":""}')
    fits = {"id": "big", "blob": "x" * (MAX_METADATA_BYTES - overhead)}
    assert normalise(fits, 0)["metadata"]["blob"] == fits["blob"]
    # Counted in UTF-8 bytes: one "é" is two.
    too_big = {"id": "big", "blob": "é" * (MAX_METADATA_BYTES // 2), "small": 1}
    message = error_of(normalise, too_big, 9)
    assert message.startswith("item 9 (big): metadata is 16.0 KiB of JSON, above the 16 KiB limit")
    assert "largest field: 'blob'" in message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (float("nan"), "metadata field 'score' is not valid JSON: NaN and infinity"),
        ({"nested": float("inf")}, "NaN and infinity are not allowed"),
        ({1, 2}, "metadata field 'score' is not valid JSON: Object of type set"),
    ],
)
def test_metadata_values_must_be_json(value, fragment):
    assert fragment in error_of(normalise, {"id": "q", "score": value}, 0)


def test_field_names_must_be_strings():
    assert error_of(normalise, {0: "x"}, 5) == "item 5: field names must be strings, got 0"


def test_errors_quote_odd_field_names_on_one_line():
    message = error_of(normalise, {"ground\nthruth": "x"}, 0)
    assert "'ground\\nthruth'" in message


# --- JSONL and JSON --------------------------------------------------------------------------


def test_jsonl_skips_blank_lines_and_reads_a_byte_order_mark(tmp_path):
    path = write(tmp_path, "data.jsonl", '\ufeff{"id": "a"}\n\n  \r\n{"id": "b"}\r\n')
    assert list(read_records(path)) == [{"id": "a"}, {"id": "b"}]


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = write(tmp_path, "data.jsonl", '{"id": "a"}\n\n{"id": "b" "x": 1}\n')
    assert error_of(read_records, path) == (
        f"{path} line 3: invalid JSON: Expecting ',' delimiter at column 12"
    )
    path = write(tmp_path, "list.jsonl", '{"id": "a"}\n["b"]\n')
    assert error_of(read_records, path) == f"{path} line 2: expected a JSON object, got a list"


def test_json_file_holding_jsonl_is_read_as_jsonl(tmp_path):
    path = write(tmp_path, "data.json", '{"id": "a"}\n{"id": "b"}\n')
    assert list(read_records(path)) == [{"id": "a"}, {"id": "b"}]


def test_pretty_printed_single_object_gets_a_hint(tmp_path):
    path = write(tmp_path, "data.json", '{\n  "items": []\n}\n')
    assert error_of(read_records, path) == (
        f"{path} line 1: invalid JSON: Expecting property name enclosed in double quotes at "
        "column 2 (a .json file holds a JSON array of items, or one item per line)"
    )


def test_json_array_streams_elements_larger_than_a_chunk(tmp_path):
    records = [
        {"id": f"q{i}", "text": "é" * (i * 9000), "n": [1.5, -2e-3, None, True], "s": '"\\\n'}
        for i in range(30)
    ]
    path = write(tmp_path, "big.json", "\ufeff  " + json.dumps(records, indent=1))
    assert list(read_records(path)) == records
    path = write(tmp_path, "compact.json", json.dumps(records, ensure_ascii=True))
    assert list(read_records(path)) == records


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"a": 1},\n {"b": 2}', "line 2: invalid JSON: the array is not closed at column 10"),
        ('[{"a": 1},\n', "line 2: invalid JSON: the array is not closed at column 1"),
        ('[{"a": 1},]', "line 1: invalid JSON: Expecting value at column 11"),
        ('[{"a": 1}] {"b": 2}', "line 1: invalid JSON: extra data after the array at column 12"),
        ('[{"a": 1} {"b": 2}]', "line 1: invalid JSON: expecting ',' at column 11"),
        (
            '[\n  {"a": 1},\n  {"b" 2}\n]',
            "line 3: invalid JSON: Expecting ':' delimiter at column 8",
        ),
        ('[{"a": 1}, 7]', "line 1: expected a JSON object, got a number"),
        ("[]", None),
    ],
)
def test_json_array_errors(tmp_path, text, message):
    path = write(tmp_path, "data.json", text)
    if message is None:
        assert list(read_records(path)) == []
    else:
        assert error_of(read_records, path) == f"{path} {message}"


def test_json_array_error_far_into_a_big_file_is_reported_at_its_line(tmp_path):
    body = ",\n".join(json.dumps({"id": i, "pad": "x" * 100}) for i in range(3000))
    path = write(tmp_path, "data.json", "[\n" + body + ',\n{"id": tru}\n]')
    assert error_of(read_records, path) == (
        f"{path} line 3002: invalid JSON: Expecting value at column 8"
    )


def test_json_array_syntax_error_is_reported_without_reading_on(tmp_path):
    # The bad byte far behind the error would be reported if the reader kept reading.
    content = b'[{"id": tru},\n' + b" " * (data_files._CHUNK_BYTES * 4) + b'{"id": "\xff"}]'
    path = write(tmp_path, "data.json", content)
    assert (
        error_of(read_records, path) == f"{path} line 1: invalid JSON: Expecting value at column 9"
    )


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 8, 13])
def test_json_array_any_chunk_boundary(tmp_path, monkeypatch, chunk_bytes):
    """Every token of the array straddles a chunk boundary at some chunk size."""
    monkeypatch.setattr(data_files, "_CHUNK_BYTES", chunk_bytes)
    records = [
        {"id": "é\u00e9😀", "n": -1.25e-3, "t": True, "f": False, "z": None, "l": [1, [2]]},
        {"s": 'quote " and \\ backslash', "inf": 1e308, "empty": {}},
    ]
    text = json.dumps(records, ensure_ascii=False, separators=(" , ", " : "))
    path = write(tmp_path, "data.json", f" {text} \n")
    assert list(read_records(path)) == records
    bad = write(tmp_path, "bad.json", '[{"a": 1},\n {"b": nul}]')
    assert error_of(read_records, bad) == f"{bad} line 2: invalid JSON: Expecting value at column 8"


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("data.jsonl", b'{"a": 1}\n{"a": "\xff"}\n', "line 2: not UTF-8 (invalid start byte)"),
        (
            "data.json",
            b'[{"a": 1},\n' + b'{"b": "xx"},\n' * 20000 + b'{"c": "\xe9"}]',
            "line 20002: not UTF-8 (invalid continuation byte)",
        ),
        (
            "data.csv",
            b"id,reference\nq1,ok\nq2,caf\xe9\n",
            "line 3: not UTF-8 (invalid continuation byte)",
        ),
    ],
)
def test_non_utf8_is_named_with_its_line(tmp_path, name, content, where):
    path = write(tmp_path, name, content)
    assert error_of(read_records, path) == f"{path} {where}; save the file as UTF-8"


def test_blank_and_missing_files(tmp_path):
    assert list(read_records(write(tmp_path, "empty.jsonl", "\n \n"))) == []
    assert (
        error_of(read_records, tmp_path / "nope.jsonl")
        == f"{tmp_path / 'nope.jsonl'}: no such file"
    )
    assert "is a directory" in error_of(read_records, tmp_path)
    path = write(tmp_path, "odd.json", "hello")
    assert "expects a JSON array or one JSON object per line" in error_of(read_records, path)


# --- CSV -------------------------------------------------------------------------------------


def test_csv_numbered_context_columns():
    path = DATA / "contexts.csv"
    assert list(read_records(path)) == [
        {
            "id": "q1",
            "question": "How long is the warranty?",
            "context": ["The warranty lasts 2 years.", "It covers manufacturing defects."],
            "reference": "The warranty lasts two years\r\nand covers manufacturing defects.",
            "topic": "warranty",
        },
        # Every context cell empty: no context (absent), like any other empty cell.
        {
            "id": "q2",
            "question": "Can I return an opened item?",
            "reference": "Opened items can be returned within 14 days.",
        },
        {
            "id": "q3",
            "question": "Who pays return shipping?",
            "context": [
                "Return shipping is free for defective items.",
                "Otherwise the customer pays.",
            ],
            "reference": "The customer pays return shipping unless the item is defective.",
            "topic": "returns",
        },
    ]
    assert list(items_from(path))[2]["metadata"] == {"topic": "returns"}


def test_csv_context_columns_sort_by_number(tmp_path):
    path = write(tmp_path, "d.csv", "context_10,context_2,context_1\nten,two,one\n")
    assert list(read_records(path)) == [{"context": ["one", "two", "ten"]}]


def test_csv_context_json_column(tmp_path):
    path = write(
        tmp_path,
        "d.csv",
        "id,question,retrieved_contexts,reference,ground_truths\n"
        'q1,Q,"[""a"", ""b""]",,"[""g1"", ""g2""]"\n'
        "q2,Q,\"['pandas', 'repr']\",R,\n"
        "q3,Q,just one passage,R,\n"
        "q4,Q,[],R,\n",
    )
    records = list(read_records(path))
    assert [r.get("retrieved_contexts") for r in records] == [
        ["a", "b"],
        ["pandas", "repr"],
        "just one passage",
        [],
    ]
    assert records[0]["ground_truths"] == ["g1", "g2"]
    items = list(items_from(path))
    assert items[2]["context"] == ["just one passage"]
    assert items[0]["ground_truth"] == "g1\ng2"


def test_csv_mapped_column_holds_a_list(tmp_path):
    path = write(tmp_path, "d.csv", 'gold,passages\nG,"[""p1"", ""p2""]"\n')
    mapping = {"gold": "ground_truth", "passages": "context"}
    assert list(items_from(path, mapping=mapping)) == [
        {"ground_truth": "G", "context": ["p1", "p2"]}
    ]


def test_csv_cells_blank_rows_and_unnamed_index(tmp_path):
    # pandas' to_csv writes its index under an empty header; spreadsheets leave blank rows.
    path = write(
        tmp_path,
        "d.csv",
        "\ufeff,id ,reference,score,metadata\n"
        '0,q1,R,0.5,"{""lang"": ""en""}"\n'
        "\n"
        ",,,,\n"
        "1,q2,  ,,plain\n",
    )
    assert list(read_records(path)) == [
        {"id": "q1", "reference": "R", "score": "0.5", "metadata": {"lang": "en"}},
        {"id": "q2", "metadata": "plain"},
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('id,context\nq1,"[1, "\nq2,x\n', "line 2: column 'context' starts with '[' but is not"),
        ('id,context\nq1,"{""a"": 1}"\nq2,"[""a"",', "line 3: column 'context' starts with '['"),
        ("id,reference\nq1,a,b\n", "line 2: 3 cells but the header has 2 columns"),
        ("id,id\nq1,q2\n", "line 1: column 'id' appears twice"),
        ("contexts,context_1\na,b\n", "line 1: both 'contexts' and 'context_1' columns give"),
        ('id,context\nq1,"[{""a"": 1}"\n', "line 2: column 'context' starts with '['"),
    ],
)
def test_csv_errors(tmp_path, content, message):
    path = write(tmp_path, "d.csv", content)
    assert error_of(read_records, path).startswith(f"{path} {message}")


def test_csv_line_numbers_count_multi_line_cells(tmp_path):
    path = write(tmp_path, "d.csv", 'id,reference\nq1,"two\nlines"\nq2,R\n"q3",x,extra\n')
    assert error_of(read_records, path).startswith(f"{path} line 5: 3 cells")
    assert error_of(items_from, write(tmp_path, "e.csv", "id,contxt\nq1,x\n")) == (
        f"{tmp_path / 'e.csv'} line 2: item 0 (q1): unknown field 'contxt'; did you mean 'context'?"
    )


def test_csv_cells_longer_than_csv_default_limit(tmp_path):
    passage = "p" * 300_000
    path = write(tmp_path, "d.csv", f'reference,context\nR,"[""{passage}""]"\n')
    assert list(read_records(path)) == [{"reference": "R", "context": [passage]}]


# --- unknown suffixes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('[{"id": "a"}]', [{"id": "a"}]),
        ('\n{"id": "a"}\n{"id": "b"}\n', [{"id": "a"}, {"id": "b"}]),
        ("question,reference\nQ,R\n", [{"question": "Q", "reference": "R"}]),
        ("title,context_1\nT,c\n", [{"title": "T", "context": ["c"]}]),
    ],
)
def test_unknown_suffix_is_sniffed(tmp_path, content, expected):
    assert list(read_records(write(tmp_path, "data.txt", content))) == expected


def test_unknown_suffix_that_is_nothing_known(tmp_path):
    path = write(tmp_path, "data.txt", "name,age\nann,3\n")
    assert error_of(read_records, path).startswith(f"{path}: expects JSONL, JSON or CSV")
    path = write(tmp_path, "gold.tsv", "gold,x\nG,1\n")
    assert list(read_records(path, mapping={"gold": "ground_truth"})) == [{"gold": "G", "x": "1"}]


# --- Parquet ---------------------------------------------------------------------------------


def test_parquet(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    table = pyarrow.table(
        {
            "user_input": ["Q1", "Q2", None],
            "retrieved_contexts": [["a", "b"], None, []],
            "reference": ["R1", "R2", "R3"],
            "score": [0.5, float("nan"), None],
        }
    )
    path = tmp_path / "data.parquet"
    parquet.write_table(table, path)
    assert list(items_from(path)) == [
        {"input": "Q1", "ground_truth": "R1", "context": ["a", "b"], "metadata": {"score": 0.5}},
        {"input": "Q2", "ground_truth": "R2"},
        {"ground_truth": "R3", "context": []},
    ]
    broken = write(tmp_path, "broken.parquet", b"not parquet")
    assert error_of(read_records, broken).startswith(f"{broken}: not a readable Parquet file")


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    # None in sys.modules makes the import fail as if pyarrow were not installed.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = write(tmp_path, "data.parquet", b"PAR1")
    assert error_of(read_records, path) == (
        f'{path}: reading Parquet needs pyarrow; pip install "recallq[parquet]"'
    )


# --- in-memory data --------------------------------------------------------------------------


def test_records_from_lists_generators_and_paths():
    records = [{"id": "a"}, {"id": "b"}]
    assert list(records_from(records)) == records
    assert list(records_from(r for r in records)) == records
    assert list(records_from(str(DATA / "ragas.jsonl")))[0]["user_input"].startswith("When")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": "a"}, "data must be a file path, a list of dicts or a pandas DataFrame, got an"),
        (b"[]", "data must be a file path"),
        (7, "got a number"),
        ([{"id": "a"}, ["b"]], "item 1: must be an object (a dict), got a list"),
    ],
)
def test_records_from_rejects(data, message):
    assert message in error_of(records_from, data)


def test_dataframe():
    pandas = pytest.importorskip("pandas")
    numpy = pytest.importorskip("numpy")
    frame = pandas.DataFrame(
        {
            "id": ["a", "b", "c"],
            "question": ["Q1", None, "Q3"],
            "contexts": [["x", "y"], numpy.array(["z"]), None],
            "reference": ["R1", "R2", numpy.nan],
            "rating": pandas.array([1, None, 3], dtype="Int64"),
            "when": [pandas.Timestamp("2025-01-02T03:04:05"), pandas.NaT, None],
            "weight": numpy.array([0.5, numpy.nan, 2.0]),
        }
    )
    assert list(items_from(frame)) == [
        {
            "id": "a",
            "input": "Q1",
            "ground_truth": "R1",
            "context": ["x", "y"],
            "metadata": {"rating": 1, "when": "2025-01-02T03:04:05", "weight": 0.5},
        },
        {"id": "b", "ground_truth": "R2", "context": ["z"]},
        {"id": "c", "input": "Q3", "metadata": {"rating": 3, "weight": 2.0}},
    ]


def test_dataframe_larger_than_one_slice():
    pandas = pytest.importorskip("pandas")
    n = data_files._FRAME_CHUNK_ROWS * 2 + 5
    frame = pandas.DataFrame({"id": [f"q{i}" for i in range(n)], "reference": ["r"] * n})
    assert [item["id"] for item in items_from(frame)] == [f"q{i}" for i in range(n)]


def test_items_from_in_memory_errors_name_the_item():
    records = [{"reference": "ok"}, {"id": "q1", "reference": "a", "ground_truth": "b"}]
    assert error_of(items_from, records).startswith(
        "item 1 (q1): fields 'reference' and 'ground_truth'"
    )


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_an_unterminated_string_is_placed_once(tmp_path: Path, suffix: str) -> None:
    """json says "Unterminated string starting at": the column follows it, no second "at"."""
    path = tmp_path / f"data{suffix}"
    text = '{"id": "a", "ground_truth": "x'
    path.write_text(f"[{text}" if suffix == ".json" else text)
    message = error_of(lambda: list(read_records(path)))
    assert "Unterminated string starting at column" in message
    assert " at at " not in message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.jsonl", ""),
        ("blank.jsonl", "\n \n"),
        ("empty.json", "[]"),
        ("header-only.csv", "id,ground_truth,context\n"),
    ],
)
def test_a_file_without_items_is_named(tmp_path, name, content):
    # read_records streams what there is; the items of a run say which file held none
    path = write(tmp_path, name, content)
    assert list(read_records(path)) == []
    assert error_of(items_from, path) == f"{path}: the file holds no items"
    assert list(items_from([])) == []  # in-memory data: nothing to name (the run says so)


def test_a_csv_whose_columns_name_no_field_lists_them_and_suggests_a_mapping(tmp_path):
    path = write(tmp_path, "odd.csv", "q,gold,passages\nhi,Paris is in France,Paris\n")
    assert error_of(items_from, path) == (
        f"{path} line 1: no column is an item field (the columns are 'q', 'gold' and "
        "'passages'); name them id, input, output, ground_truth and context, or map them, "
        "e.g. --map q=ground_truth (mapping= in Python)"
    )
    mapping = {"gold": "ground_truth", "passages": "context"}
    (item,) = items_from(path, mapping=mapping)
    assert (item["ground_truth"], item["context"]) == ("Paris is in France", ["Paris"])
    blank = write(tmp_path, "blank-header.csv", ",\n1,2\n")
    assert error_of(items_from, blank) == f"{blank} line 1: the header names no column"
    numbered = write(tmp_path, "numbered.csv", "context_1,notes\np,n\n")
    assert [item["context"] for item in items_from(numbered)] == [["p"]]
