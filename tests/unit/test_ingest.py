"""Unit tests for recallq.runs.ingest: submission validation and writing a run (temp SQLite
file)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import func, select

from recallq.runs.ingest import (
    RunSpec,
    SubmissionError,
    build_spec,
    create_run,
    item_row,
    parse_ndjson_lines,
)
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.state.migrate import upgrade
from recallq.state.runs import stores_for
from recallq.state.tables import Item, Run

KNOWN = ["local/lexical"]
MAX_ITEM = Settings().max_item_bytes


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Settings come from the test's own arguments, not from RECALLQ_ variables around it."""
    for name in list(os.environ):
        if name.startswith("RECALLQ_"):
            monkeypatch.delenv(name)


def spec(**kwargs) -> RunSpec:
    kwargs.setdefault("model", "local/lexical")
    return build_spec(known_models=KNOWN, **kwargs)


# --- build_spec ----------------------------------------------------------------------------


def test_build_spec_defaults() -> None:
    result = spec()
    assert result == RunSpec(model="local/lexical", scale=1.0, project="default")
    assert type(result.scale) is float


def test_build_spec_keeps_its_fields() -> None:
    result = spec(
        name="nightly",
        scale=10,
        context=["a", "  ", "b"],
        context_extractor={"type": "tool_results", "tools": ["search", "search"]},
        project="team-a",
        idempotency_key="key-1",
    )
    assert result.name == "nightly"
    assert result.scale == 10.0
    assert result.context == ["a", "b"]
    assert result.context_extractor == {"type": "tool_results", "tools": ["search"]}
    assert (result.project, result.idempotency_key) == ("team-a", "key-1")


def test_build_spec_string_context_is_one_passage() -> None:
    assert spec(context="only passage").context == ["only passage"]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "LOCAL/LEXICAL", "local/lexical "])
def test_build_spec_unknown_model(model: str) -> None:
    with pytest.raises(SubmissionError) as info:
        build_spec(model=model, known_models=KNOWN)
    assert info.value.code == "unknown_model"
    assert info.value.status == 422
    assert repr(model) in info.value.message


@pytest.mark.parametrize("model", [{}, [], 0, False])
def test_build_spec_a_model_that_is_no_string_is_no_model(model: Any) -> None:
    # an empty object was taken as "no model": the default one (schemathesis, issue 28)
    with pytest.raises(SubmissionError) as info:
        build_spec(model=model, known_models=KNOWN)
    assert info.value.code == "unknown_model"


def test_build_spec_accepts_any_known_model() -> None:
    assert build_spec(model="b", known_models=iter(["a", "b"])).model == "b"


@pytest.mark.parametrize("model", [None, ""])
def test_build_spec_default_model_from_settings(model) -> None:
    assert build_spec(model=model, known_models=KNOWN).model == "local/lexical"


def test_build_spec_default_model_follows_the_settings() -> None:
    default = Settings(default_model="gpt-4o-mini").default_model
    chosen = build_spec(model=None, known_models=["gpt-4o-mini"], default_model=default)
    assert chosen.model == "gpt-4o-mini"
    with pytest.raises(SubmissionError) as info:
        build_spec(model=None, known_models=KNOWN, default_model=default)
    assert info.value.code == "unknown_model"


@pytest.mark.parametrize(
    "scale", [0, -1, -0.01, float("nan"), float("inf"), True, "1", None, [1]], ids=repr
)
def test_build_spec_bad_scale(scale) -> None:
    with pytest.raises(SubmissionError) as info:
        spec(scale=scale)
    assert info.value.status == 422
    assert info.value.code == "invalid_request"
    assert "scale" in info.value.message


def test_build_spec_huge_integer_scale_is_a_422() -> None:
    with pytest.raises(SubmissionError) as info:
        spec(scale=10**400)
    assert info.value.status == 422


@pytest.mark.parametrize(
    "extractor",
    [
        "tool_results",
        ["tool_results"],
        {},
        {"type": "nope"},
        {"type": "tool_results", "extra": 1},
        {"type": "tool_results", "tools": []},
        {"type": "tool_results", "tools": "search"},
        {"type": "jmespath"},
        {"type": "jmespath", "expression": ""},
        {"type": "jmespath", "expression": "[["},
    ],
    ids=repr,
)
def test_build_spec_bad_context_extractor(extractor) -> None:
    with pytest.raises(SubmissionError) as info:
        spec(context_extractor=extractor)
    assert info.value.status == 422
    assert info.value.code == "invalid_request"
    assert "context_extractor" in info.value.message


@pytest.mark.parametrize("context", [{"a": 1}, 3, True], ids=repr)
def test_build_spec_bad_context(context) -> None:
    with pytest.raises(SubmissionError) as info:
        spec(context=context)
    assert info.value.status == 422


@pytest.mark.parametrize("name", ["x" * 201, 3, ["a"]], ids=repr)
def test_build_spec_bad_name(name) -> None:
    with pytest.raises(SubmissionError) as info:
        spec(name=name)
    assert info.value.status == 422


def test_build_spec_name_of_200_chars_is_fine() -> None:
    assert spec(name="x" * 200).name == "x" * 200


def test_submission_error_defaults() -> None:
    error = SubmissionError("bad")
    assert isinstance(error, ValueError)
    assert (error.message, error.code, error.status, str(error)) == (
        "bad",
        "invalid_request",
        422,
        "bad",
    )


# --- item_row ------------------------------------------------------------------------------

STATIC = spec(context=["static passage"])


@pytest.mark.parametrize("raw", [None, 3, "q1", ["id", "q1"], True], ids=repr)
def test_item_row_rejects_non_objects(raw) -> None:
    with pytest.raises(SubmissionError) as info:
        item_row(raw, 4, STATIC)
    assert info.value.status == 422
    assert info.value.message.startswith("item 4:")


def test_item_row_reads_aliases_and_keeps_other_fields_as_metadata() -> None:
    raw = {
        "id": "a",
        "question": "q",
        "answer": "a",
        "reference": "g",
        "retrieved_contexts": [{"page_content": "p"}],
        "category": "billing",
    }
    row, _ = item_row(raw, 2, STATIC)
    assert (row["input"], row["output"], row["ground_truth"]) == ("q", "a", "g")
    assert row["contexts"] == ["p"] and row["item_metadata"] == {"category": "billing"}


def test_item_row_typo_of_a_field_gets_a_hint() -> None:
    with pytest.raises(SubmissionError) as info:
        item_row({"id": "a", "ground_thruth": "g", "context": ["c"]}, 2, STATIC)
    assert info.value.message == "item 2 (a): unknown field 'ground_thruth'; did you mean " + (
        "'ground_truth'?"
    )
    assert (info.value.code, info.value.status) == ("invalid_request", 422)


def test_item_row_ambiguous_fields_are_named() -> None:
    with pytest.raises(SubmissionError) as info:
        item_row({"context": ["ideal"], "retrieval_context": ["got"]}, 0, STATIC)
    assert "fields 'context' and 'retrieval_context' both give 'context'" in info.value.message


def test_item_row_full() -> None:
    raw = {
        "id": "q1",
        "input": "When was Einstein born?",
        "output": "1879",
        "ground_truth": "Einstein was born in 1879.",
        "context": ["Einstein was born on 14 March 1879."],
    }
    row, resolvable = item_row(raw, 0, STATIC)
    assert resolvable is True
    assert row == {
        "idx": 0,
        "key": "q1",
        "input": "When was Einstein born?",
        "output": "1879",
        "ground_truth": "Einstein was born in 1879.",
        "contexts": ["Einstein was born on 14 March 1879."],
        "item_metadata": None,
        "id_precision": None,
        "id_recall": None,
    }


def test_item_row_id_defaults_to_index() -> None:
    row, _ = item_row({"ground_truth": "x"}, 7, STATIC)
    assert (row["idx"], row["key"]) == (7, "7")


@pytest.mark.parametrize(("value", "key"), [(42, "42"), (0, "0"), (-3, "-3")])
def test_item_row_int_id_becomes_string(value: int, key: str) -> None:
    row, _ = item_row({"id": value}, 1, STATIC)
    assert row["key"] == key


@pytest.mark.parametrize("value", ["", True, False, 1.5, ["a"], {"a": 1}, "x" * 201], ids=repr)
def test_item_row_rejects_bad_ids(value) -> None:
    with pytest.raises(SubmissionError) as info:
        item_row({"id": value}, 3, STATIC)
    assert info.value.message.startswith("item 3: id must be")


def test_item_row_id_of_200_chars_is_fine() -> None:
    row, _ = item_row({"id": "k" * 200}, 0, STATIC)
    assert row["key"] == "k" * 200


@pytest.mark.parametrize(
    ("ground_truth", "stored"),
    [
        ("Einstein was born in 1879.", "Einstein was born in 1879."),
        (None, None),
        ("", None),
        ("   ", None),
        ({"born": 1879, "city": "Zürich"}, '{"born": 1879, "city": "Zürich"}'),
        (["a", "b"], '["a", "b"]'),
        (1879, "1879"),
    ],
    ids=repr,
)
def test_item_row_ground_truth(ground_truth, stored) -> None:
    row, _ = item_row({"ground_truth": ground_truth}, 0, STATIC)
    assert row["ground_truth"] == stored


def test_item_row_without_ground_truth_key() -> None:
    row, _ = item_row({"id": "a"}, 0, STATIC)
    assert row["ground_truth"] is None


def test_item_context_wins_over_static_context() -> None:
    row, resolvable = item_row({"context": ["own", "  ", {"text": "doc"}]}, 0, STATIC)
    assert row["contexts"] == ["own", "doc"]
    assert resolvable is True


def test_item_passage_object_without_text_names_the_item_and_its_keys() -> None:
    with pytest.raises(SubmissionError) as info:
        item_row({"id": "q", "context": [{"doc": 1}]}, 0, STATIC)
    assert info.value.message == (
        "item 0 (q): context passage 0 has no 'text', 'page_content' or 'content' text "
        "(its keys: 'doc')"
    )


def test_item_string_context_is_one_passage() -> None:
    row, _ = item_row({"context": "own passage"}, 0, STATIC)
    assert row["contexts"] == ["own passage"]


def test_static_context_is_the_fallback() -> None:
    for raw in ({}, {"context": None}):
        row, resolvable = item_row(raw, 0, STATIC)
        assert row["contexts"] is None  # the run's static context, stored once on the run
        assert resolvable is True


def test_item_with_no_context_source_is_not_resolvable() -> None:
    row, resolvable = item_row({"ground_truth": "x"}, 0, spec())
    assert row["contexts"] is None
    assert resolvable is False


def test_empty_item_context_counts_as_a_source_without_fallback() -> None:
    row, resolvable = item_row({"context": []}, 0, STATIC)
    assert row["contexts"] == []
    assert resolvable is True


def agent_item(**extra) -> dict:
    tool_call = {
        "state": "result",
        "toolCallId": "c1",
        "toolName": "search",
        "args": {"q": "einstein"},
        "result": [{"text": "doc one"}, {"text": "doc two"}],
    }
    message = {
        "id": "m1",
        "role": "assistant",
        "content": {"toolInvocations": [tool_call]},
        "createdAt": "2025-01-01T00:00:00Z",
    }
    return {"input": {"inputMessages": []}, "output": [message], **extra}


def test_extractor_applies_to_agent_shaped_items() -> None:
    run = spec(context=["static"], context_extractor={"type": "tool_results"})
    row, resolvable = item_row(agent_item(), 0, run)
    assert row["contexts"] == ["doc one", "doc two"]
    assert resolvable is True


def test_item_context_wins_over_extractor() -> None:
    run = spec(context=["static"], context_extractor={"type": "tool_results"})
    row, _ = item_row(agent_item(context=["own"]), 0, run)
    assert row["contexts"] == ["own"]


def test_extractor_ignores_items_that_are_not_agent_shaped() -> None:
    run = spec(context=["static"], context_extractor={"type": "tool_results"})
    row, resolvable = item_row({"input": "q", "output": "a"}, 0, run)
    assert row["contexts"] is None  # the run's static context
    assert resolvable is True


def test_failing_extractor_names_the_item() -> None:
    run = spec(context_extractor={"type": "jmespath", "expression": "abs(output)"})
    with pytest.raises(SubmissionError) as info:
        item_row(agent_item(id="q9"), 5, run)
    assert info.value.status == 422
    assert info.value.message.startswith("item 5 (q9):")


# --- parse_ndjson_lines --------------------------------------------------------------------


def test_ndjson_skips_blank_lines() -> None:
    lines: list[str | bytes] = [
        '{"id": "a"}\n',
        "\n",
        "   \n",
        b'{"id": "b"}\n',
        b"\r\n",
        b"",
        '{"id": "c"}',
    ]
    assert list(parse_ndjson_lines(lines, MAX_ITEM)) == [{"id": "a"}, {"id": "b"}, {"id": "c"}]


def test_ndjson_accepts_non_object_json() -> None:
    # shape is item_row's job; parsing only decodes
    assert list(parse_ndjson_lines(["[1]", "3", "null"], MAX_ITEM)) == [[1], 3, None]


@pytest.mark.parametrize(
    "bad", ['{"id": ', "not json", "{'id': 'a'}", b"\x80abc", '{"id": "a"} {"id": "b"}'], ids=repr
)
def test_ndjson_invalid_line_names_its_number(bad) -> None:
    lines = ['{"id": "a"}', "", bad, '{"id": "c"}']
    items = parse_ndjson_lines(lines, MAX_ITEM)
    assert next(items) == {"id": "a"}
    with pytest.raises(SubmissionError) as info:
        next(items)
    assert info.value.code == "invalid_json"
    assert info.value.status == 422
    assert info.value.message.startswith("line 3: invalid JSON")


def test_ndjson_line_too_large() -> None:
    lines = [b'{"id": "a"}', b'{"id": "' + b"x" * 30 + b'"}']
    with pytest.raises(SubmissionError) as info:
        list(parse_ndjson_lines(lines, max_bytes=20))
    assert (info.value.code, info.value.status) == ("item_too_large", 413)
    assert info.value.message.startswith("line 2:")


# --- create_run on a temporary SQLite database ----------------------------------------------


@pytest.fixture
def db(tmp_path):
    url = "sqlite:///" + str(tmp_path / "t.db")
    upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def counts(db: Database) -> tuple[int, int]:
    with db.session() as session:
        runs = session.scalar(select(func.count()).select_from(Run))
        items = session.scalar(select(func.count()).select_from(Item))
    return runs or 0, items or 0


def stored_items(db: Database, run_id: str) -> list[Item]:
    with db.session() as session:
        return list(session.scalars(select(Item).where(Item.run_id == run_id).order_by(Item.idx)))


def _create(db: Database, run_spec: RunSpec, items, settings: dict) -> str:
    config = Settings(**settings)
    _, runs = stores_for(db, config)
    with db.session() as session:
        return create_run(session, runs, run_spec, items, config).id


def submit(db: Database, run_spec: RunSpec, items, **settings) -> str:
    return _create(db, run_spec, items, settings)


def rejected(db: Database, run_spec: RunSpec, items, **settings) -> SubmissionError:
    with pytest.raises(SubmissionError) as info:
        _create(db, run_spec, items, settings)
    return info.value


def test_create_run_stores_run_and_items_in_order(db) -> None:
    run_spec = spec(name="n", scale=10, context=["static"])
    items = [
        {"id": "q1", "ground_truth": "first", "context": ["own"]},
        {"ground_truth": {"fact": 1}},
        {"id": 7, "input": {"q": "?"}, "output": "o"},
    ]
    run_id = submit(db, run_spec, items)

    with db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert (run.name, run.model, run.scale, run.total_items) == ("n", "local/lexical", 10.0, 3)
        assert (run.status, run.project, run.context) == ("queued", "default", ["static"])
    stored = stored_items(db, run_id)
    assert [(i.idx, i.key) for i in stored] == [(0, "q1"), (1, "1"), (2, "7")]
    assert [i.ground_truth for i in stored] == ["first", '{"fact": 1}', None]
    assert [i.contexts for i in stored] == [["own"], None, None]  # None: the run's context
    assert (stored[2].input, stored[2].output) == ({"q": "?"}, "o")
    assert {i.status for i in stored} == {"pending"}
    assert counts(db) == (1, 3)


def test_create_run_across_batches_from_a_generator(db) -> None:
    settings = {"insert_batch_size": 2}
    run_id = submit(db, spec(context=["s"]), ({"id": f"k{i}"} for i in range(5)), **settings)
    stored = stored_items(db, run_id)
    assert [(i.idx, i.key) for i in stored] == [(i, f"k{i}") for i in range(5)]
    assert counts(db) == (1, 5)


def test_create_run_from_ndjson_lines(db) -> None:
    lines = [b'{"id": "a", "context": ["c"]}\n', b"\n", b'{"id": "b"}\n']
    run_id = submit(db, spec(), parse_ndjson_lines(lines, MAX_ITEM))
    assert [i.key for i in stored_items(db, run_id)] == ["a", "b"]


@pytest.mark.parametrize(
    "ids", [["a", "b", "a"], [1, "1"], ["x", "x"]], ids=["later", "int-vs-str", "adjacent"]
)
def test_duplicate_ids_are_rejected(db, ids) -> None:
    error = rejected(db, spec(context=["s"]), [{"id": key} for key in ids])
    assert (error.code, error.status) == ("duplicate_id", 422)
    assert counts(db) == (0, 0)


def test_duplicate_id_against_the_default_id_is_rejected(db) -> None:
    # the second item's id defaults to "1"
    error = rejected(db, spec(context=["s"]), [{"id": "1"}, {}])
    assert error.code == "duplicate_id"
    assert counts(db) == (0, 0)


def test_duplicate_ids_in_different_batches_are_rejected(db) -> None:
    settings = {"insert_batch_size": 2}
    items = [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "a"}]
    error = rejected(db, spec(context=["s"]), items, **settings)
    assert error.code == "duplicate_id"
    assert counts(db) == (0, 0)


def test_same_ids_in_different_runs_are_fine(db) -> None:
    submit(db, spec(context=["s"]), [{"id": "a"}])
    submit(db, spec(context=["s"]), [{"id": "a"}])
    assert counts(db) == (2, 2)


@pytest.mark.parametrize(
    "items",
    [[], iter(()), parse_ndjson_lines(["", "\n"], MAX_ITEM)],
    ids=["list", "iterator", "ndjson-lines"],  # the same in every xdist worker
)
def test_empty_run_is_rejected(db, items) -> None:
    error = rejected(db, spec(context=["s"]), items)
    assert (error.code, error.status) == ("empty_run", 422)
    assert counts(db) == (0, 0)


@pytest.mark.parametrize("static", [None, [], ["   "], ""], ids=repr)
def test_run_without_any_context_source_is_rejected(db, static) -> None:
    items = [{"id": "a", "ground_truth": "x"}, {"id": "b", "input": "q", "output": "o"}]
    error = rejected(db, spec(context=static), items)
    assert (error.code, error.status) == ("no_context", 422)
    assert counts(db) == (0, 0)


def test_extractor_that_never_applies_gives_no_context(db) -> None:
    run_spec = spec(context_extractor={"type": "tool_results"})
    error = rejected(db, run_spec, [{"id": "a", "input": "q", "output": "plain text"}])
    assert error.code == "no_context"
    assert counts(db) == (0, 0)


def test_one_item_with_context_is_enough(db) -> None:
    run_id = submit(db, spec(), [{"id": "a"}, {"id": "b", "context": ["c"]}])
    assert [i.contexts for i in stored_items(db, run_id)] == [None, ["c"]]


def test_agent_items_with_extractor_are_accepted(db) -> None:
    run_id = submit(db, spec(context_extractor={"type": "tool_results"}), [agent_item()])
    assert stored_items(db, run_id)[0].contexts == ["doc one", "doc two"]


def test_bad_item_after_inserted_batches_leaves_nothing(db) -> None:
    settings = {"insert_batch_size": 1}
    items = [{"id": "a"}, {"id": "b"}, {"id": "c", "contxt": ["x"]}]
    error = rejected(db, spec(context=["s"]), items, **settings)
    assert error.message == "item 2 (c): unknown field 'contxt'; did you mean 'context'?"
    assert counts(db) == (0, 0)


def test_bad_ndjson_line_after_inserted_batches_leaves_nothing(db) -> None:
    settings = {"insert_batch_size": 1}
    lines = ['{"id": "a"}', '{"id": "b"}', "{broken"]
    error = rejected(db, spec(context=["s"]), parse_ndjson_lines(lines, MAX_ITEM), **settings)
    assert error.code == "invalid_json"
    assert counts(db) == (0, 0)


def test_too_many_items_is_rejected(db) -> None:
    settings = {"max_items_per_run": 2}
    submit(db, spec(context=["s"]), [{"id": "a"}, {"id": "b"}], **settings)
    error = rejected(db, spec(context=["s"]), [{"id": "a"}, {"id": "b"}, {"id": "c"}], **settings)
    assert (error.code, error.status) == ("too_many_items", 413)
    assert counts(db) == (1, 2)


def test_rejected_run_keeps_earlier_runs(db) -> None:
    run_id = submit(db, spec(context=["s"]), [{"id": "a"}, {"id": "b"}])
    rejected(db, spec(context=["s"]), [{"id": "x"}, {"id": "x"}])
    rejected(db, spec(), [{"id": "y"}])
    rejected(db, spec(context=["s"]), [])
    assert counts(db) == (1, 2)
    assert [i.key for i in stored_items(db, run_id)] == ["a", "b"]


def test_item_row_scores_ids_without_a_call() -> None:
    raw = {
        "id": "q2",
        "ground_truth": "x",
        "context": ["a"],
        "retrieved_context_ids": ["d3", "d1", "d2"],
        "reference_context_ids": ["d1", "d2"],
    }
    row, _ = item_row(raw, 0, STATIC)
    assert row["id_precision"] == pytest.approx((1 / 2 + 2 / 3) / 2, abs=1e-4)
    assert row["id_recall"] == 1.0
    assert row["item_metadata"]["retrieved_context_ids"] == ["d3", "d1", "d2"]
    with pytest.raises(SubmissionError, match="item 0: reference_context_ids must be a list"):
        item_row({**raw, "reference_context_ids": "d1"}, 0, STATIC)


def test_precision_field_one_rule_one_message() -> None:
    assert spec().precision == "cited"
    assert spec(precision="judged").precision == "judged"
    assert spec(precision="off").precision == "off"
    with pytest.raises(SubmissionError, match='precision must be "cited", "judged" or "off"'):
        spec(precision="ranked")
    batched = build_spec(  # the provider batch lane makes the context_relevance requests
        model="local/lexical",
        known_models=KNOWN,
        mode="batch",
        batch_models=KNOWN,
        precision="judged",
    )
    assert batched.precision == "judged" and batched.mode == "batch"
