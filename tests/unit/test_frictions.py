"""A new user's frictions (issue 28, item 7), the in-process half: each test states what a
newcomer met and fails on the code before the fix. The CLI-level half (real `recallq`
processes) is tests/e2e/test_new_user_frictions.py; the compose version a newcomer asked
about is tests/unit/test_compose.py's (already fixed: the file states 2.20.0, with why)."""

from __future__ import annotations

import csv
import gc
import io
import json
import re
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import recallq
from recallq.cli import explain
from recallq.cli.backends import LocalBackend
from recallq.cli.label_commands import describe
from recallq.cli.output import print_run
from recallq.cli.parser import build_parser
from recallq.cli.reports import write_report
from recallq.core import export
from recallq.results import items_frame
from recallq.runs import ingest, item_views
from recallq.runs.reads import RunReads
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.viewer import environment
from recallq.viewer import text as display
from recallq.viewer.formatting import spend

REPO = Path(__file__).resolve().parents[2]
ITEMS = [
    {"id": "a", "ground_truth": "Paris is in France.", "context": ["Paris is in France."],
     "category": "geo"},
    {"id": "b", "ground_truth": "Two plus two is four.", "context": ["Unrelated text."],
     "category": "math", "level": 2},
    {"id": "c", "ground_truth": "The Seine is a river.", "context": []},
]  # fmt: skip


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, str]]:
    """A local run (SQLite, the lexical judge) of ITEMS, scored in this process."""
    folder = tmp_path_factory.mktemp("frictions")
    url = f"sqlite:///{folder / 'recallq.db'}"
    result = recallq.evaluate(ITEMS, database_url=url, progress=False)
    yield Settings(database_url=url), result.run_id


def _view(**usage: Any) -> dict[str, Any]:
    counts = {"total": 200, "pending": 0, "running": 0, "succeeded": 8, "failed": 0}
    return {
        "id": "r1",
        "name": None,
        "status": "cancelled",
        "model": "unpriced-model",
        "scale": 1,
        "counts": {**counts, "cancelled": 192},
        "summary": {"mean_score": 0.5, "claims_total": 10, "claims_attributed": 5},
        "usage": {"llm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
        | usage,
    }


# --- messages and help -----------------------------------------------------------------------


def test_an_unknown_model_without_a_models_file_says_that_none_is_loaded() -> None:
    """Friction: an API started without RECALLQ_MODELS_FILE refused every model, and the
    README's quickstart never exported it."""
    with pytest.raises(ingest.SubmissionError) as refused:
        ingest.require_known_model("gpt-4o-mini", ["local/lexical"])
    assert "no models file is loaded" in refused.value.message
    assert "RECALLQ_MODELS_FILE" in refused.value.message
    service = (REPO / "README.md").read_text().split("## Run the service", 1)[1]
    quickstart = service.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "export RECALLQ_MODELS_FILE=" in quickstart


def test_a_local_run_into_a_services_database_says_where_it_goes() -> None:
    """Friction: with the service's variables exported, `recallq run` stored into the
    service's Postgres under project `default`, seen by neither `recallq runs` nor the pages."""
    from recallq.cli.local_runs import stored_where  # (each new name imported where it is used:
    # on the code before the fix every test fails alone, not the module at collection)

    service = Settings(
        database_url="postgresql+psycopg://postgres:secret@db/recallq",
        api_url="http://127.0.0.1:8000",
    )
    note = stored_where(service)
    assert note is not None
    assert "'default'" in note and "--local" in note and "recallq submit" in note
    assert "secret" not in note
    beside_an_api = stored_where(Settings(api_url="http://127.0.0.1:8000"))
    assert beside_an_api is not None and "--local" in beside_an_api
    assert stored_where(Settings()) is None  # the plain local case says nothing


def test_the_corrected_gate_says_it_compares_the_lower_bound() -> None:
    """Friction: "corrected mean score 0.6667 (95% lower bound 0.4, ...) is below --min-score
    0.45" read as if 0.6667 were below 0.45."""
    from recallq.cli.label_commands import corrected_verdict

    corrected = {"mean_score": 0.6667, "mean_score_ci95": [0.4, 0.93], "labelled_items": 3}
    passed, line = corrected_verdict(corrected, 0.45)
    assert not passed
    assert line.startswith("the 95% lower bound 0.4 of the corrected mean score")
    assert re.search(r"lower bound 0\.4 .* is below --min-score 0\.45", line)
    assert corrected_verdict(corrected, 0.3)[0]


def test_agreement_says_which_corrected_figure_the_gate_uses() -> None:
    """Friction: `agreement` printed two corrected figures without saying which one the gate
    uses."""
    body = {
        "labelled_claims": 4,
        "labelled_items": 2,
        "agreement": 1.0,
        "kappa": 1.0,
        "kappa_ci95": [1.0, 1.0],
        "precision": 1.0,
        "recall": 1.0,
        "confusion": {
            f"judge_{judge}_human_{human}": 1 for judge in ("yes", "no") for human in ("yes", "no")
        },
        "corrected": {
            "judge_mean_score": 0.5,
            "mean_score": 0.5,
            "mean_score_ci95": [0.25, 0.75],
            "labelled_items": 2,
            "judge_claim_recall": 0.5,
            "claim_recall": 0.5,
            "claim_recall_ci95": [0.2, 0.8],
        },
    }
    text = describe(body)
    assert "gate --corrected" in text and "lower bound (0.25)" in text
    assert "not the claim recall" in text


def test_run_help_does_not_list_the_refused_batch_option() -> None:
    """Friction: `recallq run --help` listed `--batch refused: batch mode needs the service`."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(subcommands.choices, dict)
    run_help = subcommands.choices["run"].format_help()
    assert "--batch" not in run_help and "refused" not in run_help
    assert parser.parse_args(["run", "x.jsonl", "--batch"]).batch  # still refused with a reason


def test_an_unreachable_api_is_explained_by_where_its_url_came_from() -> None:
    """Friction: `recallq runs --api URL` said "pass --api or set RECALLQ_API_URL"."""
    request = httpx.Request("GET", "http://127.0.0.1:9/v1/runs")
    refused = httpx.ConnectError("Connection refused", request=request)
    given = explain(refused, Settings(), "runs", api_option="http://127.0.0.1:9")
    assert given is not None and "given with --api" in given
    assert "pass --api" not in given
    from_env = explain(refused, Settings(api_url="http://127.0.0.1:9"), "runs")
    assert from_env is not None and "RECALLQ_API_URL" in from_env and "--local" in from_env
    neither = explain(refused, Settings(), "submit")
    assert neither is not None and "pass --api URL or set RECALLQ_API_URL" in neither


def test_cancel_heads_its_summary_with_its_own_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Friction: `cancel` printed its summary under the header `recallq status`."""
    print_run(_view(), False, "cancel")
    out = capsys.readouterr().out
    assert out.startswith("recallq cancel\n") and "recallq status" not in out


# --- figures ----------------------------------------------------------------------------------


def test_compare_by_table_is_headed_by_the_field_in_one_number_format() -> None:
    """Friction: a `--by` table headed `group`, its means in mixed formats (0, 1, 0.6879)."""
    result = {
        "matched": 2,
        "unmatched": {"base_only": 0, "candidate_only": 0, "unscored": 0},
        "base_mean": 0.5,
        "candidate_mean": 0.5,
        "mean_difference": 0.0,
        "ci95": [-0.1, 0.1],
        "improved": 0,
        "regressed": 0,
        "unchanged": 2,
        "largest_changes": [],
        "by_group": {
            "geo": {"matched": 1, "base_mean": 1.0, "candidate_mean": 0.6879},
            "math": {"matched": 1, "base_mean": 0.0, "candidate_mean": None},
        },
    }
    lines = display.compare_lines(result, "category")
    table = lines[lines.index("by category") + 1 :]
    assert table[0].split() == ["category", "matched", "base_mean", "candidate_mean"]
    assert table[1].split() == ["geo", "1", "1.0000", "0.6879"]
    assert table[2].split() == ["math", "1", "0.0000", "-"]
    groups = {"geo": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 1.0}}
    (row,) = display.group_lines("category", groups)[1:]
    assert row.split()[-1] == "1.0000"


def test_an_unpriced_model_and_a_stage_without_calls_read_apart() -> None:
    """Friction: a model without a price showed `$0.0000` for one stage (no call: the claim
    cache served it) and "not priced" for the other."""
    assert spend({"llm_calls": 0, "cost_usd": 0.0}) == "no calls"
    assert spend({"llm_calls": 4, "cost_usd": 0.0}) == "not priced"


def test_text_status_shows_cost_and_usage_per_stage() -> None:
    """Friction: text `status` had no cost and no per-stage usage."""
    stages = {
        "extraction": {"llm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0},
        "attribution": {
            "llm_calls": 8,
            "prompt_tokens": 800,
            "completion_tokens": 80,
            "cost_usd": 0.0,
        },
    }
    lines = display.summary_lines(
        _view(llm_calls=8, prompt_tokens=800, completion_tokens=80, by_stage=stages)
    )
    text = "\n".join(lines)
    assert re.search(r"cost_usd\s+not priced", text)
    assert re.search(r"extraction\s+no calls\n", text)
    assert re.search(r"attribution\s+8 calls, 880 tokens, cost_usd not priced", text)
    priced = display.summary_lines(_view(llm_calls=2, cost_usd=0.0123))
    assert any(re.fullmatch(r"\s+cost_usd\s+0\.0123", line) for line in priced)


def test_claim_cache_hits_of_a_stopped_run_say_they_count_unscored_items() -> None:
    """Friction: a run cancelled at 8 of 200 showed `claim_cache_hits 200`, beside 8 scored."""
    text = "\n".join(display.summary_lines(_view(claim_cache_hits=200)))
    assert re.search(
        r"claim_cache_hits\s+200 items took claims from the claim cache \(no extraction "
        r"call\), scored or not",
        text,
    )


# --- local runs: ids, report, items table -------------------------------------------------------


def test_a_unique_start_of_a_run_id_names_the_run(local: tuple[Settings, str]) -> None:
    """Friction: a run id's unique prefix was refused (the local database: an API takes whole
    ids, its routes name one run)."""
    from recallq.runs.reads import AmbiguousRunId

    settings, run_id = local
    database = Database(settings.database_url)
    try:
        reads = RunReads(database, local=True)
        assert reads.expand_id(run_id[:8], "default") == run_id
        assert reads.expand_id(run_id, "default") == run_id
        assert reads.expand_id("no-such", "default") == "no-such"  # not found, later
        assert reads.expand_id(run_id[:8], "another-project") == run_id[:8]
        # more runs until two share a first character (17 at most: 16 hex digits)
        firsts = {run_id[0]}
        while True:
            other = recallq.evaluate(
                ITEMS[:1], database_url=settings.database_url, progress=False, fresh=True
            ).run_id
            if other[0] in firsts:
                break
            firsts.add(other[0])
        with pytest.raises(AmbiguousRunId, match="several runs"):
            reads.expand_id(other[0], "default")
    finally:
        database.dispose()


def test_the_reports_lowest_items_read_as_words(
    local: tuple[Settings, str], tmp_path: Path
) -> None:
    """Friction: the report's lowest-scoring list rendered bare (`1. 1 0`)."""
    settings, run_id = local
    backend = LocalBackend(settings)
    try:
        path = write_report(backend, run_id, tmp_path / "r.html", base=None, lowest=5)
    finally:
        backend.close()
    html = path.read_text()
    index = html.split('class="report-index', 1)[1].split("</ol>", 1)[0]
    entries = [re.sub(r"<[^>]+>", "", li).split() for li in index.split("<li>")[1:]]
    assert ["item", "b:", "score", "0", "(0", "of", "1", "claims", "supported)"] in entries


def test_the_items_table_marks_items_scored_without_context(local: tuple[Settings, str]) -> None:
    """Friction: the items list did not mark no-context items."""
    settings, run_id = local
    database = Database(settings.database_url)
    try:
        with database.session() as session:
            table = item_views.items_table(session, run_id, item_views.ItemFilter(), 10)
    finally:
        database.dispose()
    marked = {row["id"]: row["no_context"] for row in table.rows}
    assert marked == {"a": False, "b": False, "c": True}
    html = (
        environment()
        .get_template("items.html")
        .render(
            run={"id": run_id, "name": None, "counts": {"total": 3}, "scale": 1},
            items=table.rows,
            filters=item_views.ItemFilter(),
            statuses=[],
            item_url=lambda key: f"/items/{key}",
            matched=None,
            searched_to=None,
            max_text=100,
            static_url="/static",
            browser={"signed_in": False},
            refresh_seconds=None,
            auth_on=False,
            csrf_token="",
            searched=None,
            searched_all=False,
            from_start=True,
            first_url=None,
            next_url=None,
        )
    )
    rows = re.findall(r'<tr data-item-id="(\w)".*?</tr>', html, re.S)
    marked_row = r'<tr data-item-id="(\w)"(?:(?!</tr>).)*data-testid="no-context"'
    marks = re.findall(marked_row, html, re.S)
    assert rows == ["a", "b", "c"] and marks == ["c"]


# --- metadata as columns --------------------------------------------------------------------


def test_metadata_is_a_column_per_field_in_frames_and_csv(local: tuple[Settings, str]) -> None:
    """Friction: metadata stayed one JSON column in `to_pandas()` and CSV."""
    pytest.importorskip("pandas")
    settings, run_id = local
    database = Database(settings.database_url)
    try:
        reads = RunReads(database, local=True)
        results = list(reads.iter_results(run_id, "default"))
        fields = reads.metadata_fields(run_id, "default", every=True)
    finally:
        database.dispose()
    assert fields == ["category", "level"]
    frame = items_frame(results)
    assert list(frame.columns[-3:]) == ["metadata", "metadata.category", "metadata.level"]
    assert list(frame["metadata.category"][:2]) == ["geo", "math"]
    assert frame["metadata.category"].isna().tolist() == [False, False, True]
    text = "".join(export.lines(results, "csv", metadata_fields=fields))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["metadata.category"] for row in rows] == ["geo", "math", ""]
    assert rows[1]["metadata.level"] == "2" and json.loads(rows[1]["metadata"])["level"] == 2


# --- the worker's log and the Python client -------------------------------------------------


def test_a_broker_url_without_a_password_is_shown_without_one() -> None:
    """Friction: the worker's log showed `redis://:[redacted]@...` for a URL with no password
    (kombu masks one whether or not there is one; recallq.patches)."""
    from kombu.connection import Connection

    from recallq import patches
    from recallq.core.redact import Redactor

    patches.prepare_kombu()
    assert Connection("redis://127.0.0.1:6379/0").as_uri() == "redis://127.0.0.1:6379/0"
    assert Redactor()(Connection("redis://127.0.0.1:6379/0").as_uri()) == (
        "redis://127.0.0.1:6379/0"
    )
    with_password = Connection("redis://:hunter22@127.0.0.1:6379/0").as_uri()
    assert "hunter22" not in with_password and ":**@" in with_password


class _Runs(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools the connection

    def do_GET(self) -> None:
        body = json.dumps({"runs": [], "next_cursor": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_client_dropped_without_close_leaves_no_unclosed_socket() -> None:
    """Friction: `recallq.Client` left a `ResourceWarning: unclosed socket`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Runs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client = recallq.Client(f"http://127.0.0.1:{server.server_address[1]}", api_key="k")
            assert client.runs() == []
            del client
            gc.collect()
        # only this client's: the collection may also find what earlier tests of this process left
        port = f"{server.server_address[1]})"
        unclosed = [
            str(w.message)
            for w in caught
            if issubclass(w.category, ResourceWarning) and port in str(w.message)
        ]
        assert unclosed == []
    finally:
        server.shutdown()
        server.server_close()
