"""Human labels and agreement over HTTP: a real API (keys required), a real worker scoring with
the offline judge, Postgres and Redis."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from recallq.labels import store as labels
from tests.integration.secured import (
    api_and_worker,
    bearer,
    completed_run,
    error_of,
    key_id_of,
    make_key,
    post_labels,
    recallq,
    secured_env,
)

FACTS = [
    ("Paris is the capital of France.", "Paris is the capital of France."),
    ("Water boils at 100 degrees.", "Water boils at 90 degrees."),
    ("The Nile flows through Egypt.", "The Nile flows north through Egypt and Sudan."),
]


def _items(n: int) -> list[dict[str, Any]]:
    """Items of three claims, some supported by the context and some not."""
    items = []
    for i in range(n):
        truths = [FACTS[(i + k) % 3][0] for k in range(3)]
        context = [FACTS[(i + k) % 3][1] for k in range(2)]
        items.append(
            {"id": f"doc/{i}", "ground_truth": " ".join(truths), "context": context, "topic": i % 2}
        )
    return items


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "write": make_key(env, "labels", "write", label="labeller"),
        "read": make_key(env, "labels", "read", label="reader"),
        "other": make_key(env, "elsewhere", "admin", label="outsider"),
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    with api_and_worker(env) as url:
        yield url


def _scored_run(api: str, key: str, n: int = 12) -> str:
    return str(completed_run(api, key, {"items": _items(n), "model": "local/lexical"})["id"])


@pytest.fixture(scope="module")
def run(api: str, keys: dict[str, str]) -> str:
    return _scored_run(api, keys["write"])


def _label_url(api: str, run: str, item: str, index: int) -> str:
    return f"{api}/v1/runs/{run}/items/{item}/claims/{index}/label"


def _item(api: str, key: str, run: str, item: str) -> dict[str, Any]:
    response = httpx.get(
        f"{api}/v1/runs/{run}/items/{item.replace('/', '%2F')}", headers=bearer(key)
    )
    if response.status_code == 404:  # an id with / is reached through the items list
        page = httpx.get(f"{api}/v1/runs/{run}/items?limit=100", headers=bearer(key)).json()
        return next(i for i in page["items"] if i["id"] == item)
    return dict(response.json())


def _labels(api: str, key: str, run: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{api}/v1/runs/{run}/labels", headers=bearer(key))
    assert response.status_code == 200, response.text
    return list(response.json()["labels"])


def test_set_list_and_clear_a_label_leaves_the_judge_verdict(
    api: str, env: dict[str, str], keys: dict[str, str], run: str
) -> None:
    judged = _item(api, keys["read"], run, "doc/0")["claims"][1]
    opposite = "no" if judged["verdict"] == "yes" else "yes"
    put = httpx.put(
        _label_url(api, run, "doc/0", 1),
        json={"verdict": opposite, "note": "checked by hand"},
        headers=bearer(keys["write"]),
    )
    assert put.status_code == 200, put.text
    body = put.json()
    assert body["verdict"] == opposite and body["judge_verdict"] == judged["verdict"]
    assert body["labelled_by"] == key_id_of(env, "labeller")
    assert _item(api, keys["read"], run, "doc/0")["claims"][1]["verdict"] == judged["verdict"]
    listed = _labels(api, keys["read"], run)
    assert [(x["item_id"], x["claim_index"], x["verdict"]) for x in listed] == [
        ("doc/0", 1, opposite)
    ]
    jsonl = httpx.get(f"{api}/v1/runs/{run}/labels?format=jsonl", headers=bearer(keys["read"]))
    assert jsonl.headers["content-type"].startswith("application/x-ndjson")
    assert '"note": "checked by hand"' in jsonl.text
    as_csv = httpx.get(f"{api}/v1/runs/{run}/labels?format=csv", headers=bearer(keys["read"]))
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert rows[0]["item_id"] == "doc/0" and rows[0]["verdict"] == opposite
    cleared = httpx.delete(_label_url(api, run, "doc/0", 1), headers=bearer(keys["write"]))
    assert cleared.status_code == 204
    assert _labels(api, keys["read"], run) == []


def test_roles_projects_and_bad_input(api: str, keys: dict[str, str], run: str) -> None:
    url = _label_url(api, run, "doc/0", 0)
    good = {"verdict": "yes"}
    assert error_of(httpx.put(url, json=good, headers=bearer(keys["read"]))) == (403, "forbidden")
    assert error_of(httpx.put(url, json=good)) == (401, "unauthenticated")
    assert error_of(httpx.put(url, json=good, headers=bearer(keys["other"]))) == (404, "not_found")
    other_reads = httpx.get(f"{api}/v1/runs/{run}/agreement", headers=bearer(keys["other"]))
    assert error_of(other_reads) == (404, "not_found")
    write = bearer(keys["write"])
    bodies: list[Any] = [{"verdict": "maybe"}, {"verdict": "yes", "note": "x" * 2001}, {"v": 1}, []]
    for body in bodies:
        assert error_of(httpx.put(url, json=body, headers=write)) == (422, "invalid_request")
    missing_claim = httpx.put(_label_url(api, run, "doc/0", 99), json=good, headers=write)
    assert error_of(missing_claim) == (404, "not_found")
    missing_item = httpx.put(_label_url(api, run, "nope", 0), json=good, headers=write)
    assert error_of(missing_item) == (404, "not_found")
    negative = httpx.put(_label_url(api, run, "doc/0", -1), json=good, headers=write)
    assert error_of(negative) == (422, "invalid_request")
    huge = httpx.put(_label_url(api, run, "doc/0", 2**40), json=good, headers=write)
    assert error_of(huge) == (422, "invalid_request")
    assert _labels(api, keys["read"], run) == []


def test_import_reports_each_problem_by_line_and_stores_the_good_rows(
    api: str, keys: dict[str, str]
) -> None:
    run = _scored_run(api, keys["write"], n=4)
    claim = _item(api, keys["read"], run, "doc/2")["claims"][0]["text"]
    lines = [
        "item_id,claim_index,claim,verdict,note",
        "doc/0,0,,yes,fine",  # 2: stored
        "doc/0,1,,No ,",  # 3: stored (verdicts are read loosely)
        "doc/9,0,,yes,",  # 4: unknown item
        "doc/1,0,,perhaps,",  # 5: bad verdict
        "doc/0,0,,no,",  # 6: duplicate of line 2
        "doc/1,7,,yes,",  # 7: no such claim
        "doc/1,x,,yes,",  # 8: bad index
        "doc/1,2,,,",  # 9: left empty: skipped
        f'doc/2,,"{claim}",yes,by text',  # 10: stored, matched by the claim's text
    ]
    response = httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content="\n".join(lines) + "\n",
        headers={**bearer(keys["write"]), "Content-Type": "text/csv"},
    )
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["stored"] == 3 and result["skipped"] == 1
    assert [p["line"] for p in result["problems"]] == [4, 5, 6, 7, 8]
    assert "doc/9" in result["problems"][0]["problem"]
    assert "duplicate of line 2" in result["problems"][2]["problem"]
    stored = {
        (x["item_id"], x["claim_index"]): x["verdict"] for x in _labels(api, keys["read"], run)
    }
    assert stored == {("doc/0", 0): "yes", ("doc/0", 1): "no", ("doc/2", 0): "yes"}

    jsonl = '{"item_id": "doc/3", "claim_index": 0, "verdict": "no"}\nnot json\n'
    response = httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content=jsonl,
        headers={**bearer(keys["write"]), "Content-Type": "application/x-ndjson"},
    )
    assert response.json()["stored"] == 1 and response.json()["problems"][0]["line"] == 2

    too_big = httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content=b"x" * (10 * 1024 * 1024 + 1),
        headers={**bearer(keys["write"]), "Content-Type": "text/csv"},
    )
    assert error_of(too_big) == (413, "body_too_large")
    read_only = httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content=jsonl,
        headers={**bearer(keys["read"]), "Content-Type": "application/x-ndjson"},
    )
    assert error_of(read_only) == (403, "forbidden")


def test_every_row_of_a_broken_file_is_stored_or_reported_by_its_line(
    api: str, keys: dict[str, str]
) -> None:
    """Issue 28's broken files, through the API: nothing is lost without a word."""
    run = _scored_run(api, keys["write"], n=4)
    head = "item_id,claim_index,verdict,note,context\n"
    passage = "p" * 200_000  # over the csv module's default field limit (131,072)
    lines = [
        'doc/0,0,yes,"a quote never closed,',  # 2
        "doc/1,0,no,,",  # 3: read again after the quote's line: stored
        f"doc/2,0,yes,,{passage}",  # 4: a long cell: stored
        "",  # 5: blank
        "garbage",  # 6
        "doc/3,0,yes,n\x00ote,",  # 7
    ]
    data = (head + "\n".join(lines) + "\n").encode() + b"doc/3,1,\xff,,\n"  # 8
    response = post_labels(api, keys["write"], run, data, "text/csv")
    assert response.status_code == 200, response.text[:500]
    result = response.json()
    assert result["stored"] == 2 and result["skipped"] == 0, result
    assert result["problems"] == [
        {"line": 2, "problem": "not CSV: a quote opened on this line is never closed"},
        {"line": 6, "problem": "1 cells, fewer than the header's 5 columns"},
        {"line": 7, "problem": "note contains a NUL character"},
        {"line": 8, "problem": "not UTF-8 text (byte 0xff)"},
    ]
    stored = {(x["item_id"], x["claim_index"]) for x in _labels(api, keys["read"], run)}
    assert stored == {("doc/1", 0), ("doc/2", 0)}

    jsonl = b'{"item_id": "doc/0", "claim_index": 1, "verdict": "no"}\n{"item_id": "doc/0"}\n'
    response = post_labels(api, keys["write"], run, jsonl, "application/x-ndjson")
    assert response.json()["stored"] == 1
    assert response.json()["problems"] == [
        {"line": 2, "problem": "no verdict (or human_verdict) field"}
    ]

    for data, kind in [
        (b"a,b\n1,2\n", "text/csv"),  # columns matching nothing: was "skipped 1"
        (b'{"item_id": "doc/0", "claim_index": 0}\n', "application/x-ndjson"),
    ]:
        refused = post_labels(api, keys["write"], run, data, kind)
        assert error_of(refused) == (422, "invalid_request"), refused.text
        assert refused.json()["error"]["message"].startswith("line 1: ")
    for body in (b"[1,2]", b'"str"', b"null"):
        refused = post_labels(api, keys["write"], run, body, "application/json")
        assert error_of(refused) == (415, "unsupported_media_type")
    assert len(_labels(api, keys["read"], run)) == 3


def test_a_sample_of_a_run_without_claims_is_a_conflict(api: str, keys: dict[str, str]) -> None:
    """The request is valid; the run has nothing to label yet (409, as the schema says)."""
    items = [{"id": "empty", "ground_truth": None, "context": ["x"]}]
    run = completed_run(api, keys["write"], {"items": items, "model": "local/lexical"})["id"]
    drawn = httpx.post(
        f"{api}/v1/runs/{run}/labels/sample", json={"size": 1}, headers=bearer(keys["write"])
    )
    assert error_of(drawn) == (409, "conflict")
    assert "has no scored item with claims" in drawn.json()["error"]["message"]


def test_a_drawn_sample_gets_a_corrected_mean_and_hand_picked_labels_do_not(
    api: str, keys: dict[str, str]
) -> None:
    run = _scored_run(api, keys["write"], n=12)
    write, read = bearer(keys["write"]), bearer(keys["read"])
    # hand-picked: agreement, no correction
    httpx.put(_label_url(api, run, "doc/5", 0), json={"verdict": "no"}, headers=write)
    chosen = httpx.get(f"{api}/v1/runs/{run}/agreement", headers=read).json()
    assert chosen["sample"] == "chosen" and chosen["corrected"] is None
    assert chosen["labelled_claims"] == 1

    drawn = httpx.post(
        f"{api}/v1/runs/{run}/labels/sample", json={"size": 6, "seed": 3}, headers=write
    )
    assert drawn.status_code == 200, drawn.text
    sample = drawn.json()["item_ids"]
    assert len(sample) == 6 and len(set(sample)) == 6
    again = httpx.post(
        f"{api}/v1/runs/{run}/labels/sample", json={"size": 6, "seed": 3}, headers=write
    )
    assert again.json()["item_ids"] == sample  # seeded
    too_big = httpx.post(
        f"{api}/v1/runs/{run}/labels/sample",
        json={"size": 6, "seed": labels.MAX_SEED + 1},
        headers=write,
    )
    assert error_of(too_big) == (422, "invalid_request"), too_big.text
    sheet = httpx.get(f"{api}/v1/runs/{run}/labels/sample?format=csv", headers=read)
    reader = csv.DictReader(io.StringIO(sheet.text))
    assert reader.fieldnames == [
        "item_id", "claim_index", "claim", "context", "judge_verdict", "judge_reason",
        "human_verdict", "note",
    ]  # fmt: skip
    rows = list(reader)
    assert {r["item_id"] for r in rows} == set(sample)
    assert all(r["human_verdict"] == "" and r["note"] == "" for r in rows)
    # the person disagrees with the judge on every claim 0, agrees on the rest
    for row in rows:
        judge = row["judge_verdict"]
        row["human_verdict"] = (
            ("no" if judge == "yes" else "yes") if row["claim_index"] == "0" else judge
        )
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    imported = httpx.post(
        f"{api}/v1/runs/{run}/labels",
        content=out.getvalue(),
        headers={**write, "Content-Type": "text/csv"},
    ).json()
    assert imported["stored"] == len(rows) and imported["problems"] == []

    body = httpx.get(f"{api}/v1/runs/{run}/agreement", headers=read).json()
    assert body["sample"] == "random"
    assert body["labelled_claims"] == len(rows) + (0 if "doc/5" in sample else 1)
    flipped = [r for r in rows if r["claim_index"] == "0"]
    yes_to_no = sum(r["judge_verdict"] == "yes" for r in flipped)
    assert body["confusion"]["judge_yes_human_no"] >= yes_to_no
    corrected = body["corrected"]
    assert corrected["method"] == "ppi" and corrected["labelled_items"] == 6
    low, high = corrected["mean_score_ci95"]
    assert low <= corrected["mean_score"] <= high
    # the correction is the sample's mean human-minus-judge score difference
    diffs = [((r["human_verdict"] == "yes") - (r["judge_verdict"] == "yes")) / 3 for r in rows]
    expected = corrected["judge_mean_score"] + sum(diffs) / 6
    assert corrected["mean_score"] == pytest.approx(expected, abs=1e-3)

    grouped = httpx.get(f"{api}/v1/runs/{run}/agreement?by=topic", headers=read).json()
    assert set(grouped["by_group"]) == {"0", "1"}
    assert (
        sum(g["labelled_claims"] for g in grouped["by_group"].values()) == body["labelled_claims"]
    )


def test_the_same_judge_twice_agrees_with_itself(api: str, keys: dict[str, str], run: str) -> None:
    second = _scored_run(api, keys["write"])
    body = httpx.get(
        f"{api}/v1/runs/{run}/agreement?against={second}", headers=bearer(keys["read"])
    ).json()
    assert body["labelled_claims"] == 36 and body["kappa"] == 1.0
    assert body["flip_rate"] == 0.0 and body["flipped"] == []
    unknown = httpx.get(f"{api}/v1/runs/{run}/agreement?against=nope", headers=bearer(keys["read"]))
    assert error_of(unknown) == (404, "not_found")


def test_the_cli_labels_through_the_api(
    api: str, env: dict[str, str], keys: dict[str, str], tmp_path
) -> None:
    run = _scored_run(api, keys["write"], n=6)
    cli = {**env, "RECALLQ_API_URL": api, "RECALLQ_API_KEY": keys["write"]}
    sheet = tmp_path / "to_label.csv"
    drawn = recallq(cli, "label", run, "--sample", "5", "--seed", "2", "--out", str(sheet))
    assert drawn.returncode == 0, drawn.stderr
    with sheet.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert "5 items (15 claims)" in drawn.stdout and len(rows) == 15
    for row in rows:
        row["human_verdict"] = row["judge_verdict"]
    with sheet.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    imported = recallq(cli, "label", run, "--import", str(sheet))
    assert imported.returncode == 0 and "15 labels stored" in imported.stdout, imported.stderr
    shown = recallq(cli, "agreement", run)
    assert shown.returncode == 0 and "kappa 1" in shown.stdout, shown.stdout + shown.stderr
    as_reader = recallq(
        {**cli, "RECALLQ_API_KEY": keys["read"]}, "label", run, "--import", str(sheet)
    )
    assert as_reader.returncode == 2 and "403 forbidden" in as_reader.stderr


def test_the_agreement_is_kept_until_a_label_changes(
    api: str, env: dict[str, str], keys: dict[str, str]
) -> None:
    """Its bootstraps cost CPU per labelled item, so a completed run's agreement is computed
    once per state of its labels: kept, and computed again when a label is set, changed or
    cleared."""
    from sqlalchemy import create_engine, text

    run_id = _scored_run(api, keys["write"], n=4)
    url = f"{api}/v1/runs/{run_id}/agreement"

    def agreement() -> dict[str, Any]:
        response = httpx.get(url, headers=bearer(keys["read"]))
        assert response.status_code == 200, response.text
        return dict(response.json())

    def label(item: str, index: int, verdict: str) -> None:
        put = httpx.put(
            _label_url(api, run_id, item, index),
            json={"verdict": verdict},
            headers=bearer(keys["write"]),
        )
        assert put.status_code == 200, put.text

    engine = create_engine(env["RECALLQ_DATABASE_URL"])

    def kept_agreements() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM kept_views WHERE run_id = :run "
                        "AND body->>'shape' LIKE 'agreement/%'"
                    ),
                    {"run": run_id},
                ).scalar_one()
            )

    judged = _item(api, keys["read"], run_id, "doc/0")["claims"][0]["verdict"]
    label("doc/0", 0, judged)
    first = agreement()
    assert first["labelled_claims"] == 1 and first["confusion"][f"judge_{judged}_human_{judged}"]
    assert kept_agreements() == 1 and agreement() == first  # read back, not computed again
    other = "no" if judged == "yes" else "yes"
    label("doc/0", 0, other)  # changed
    assert agreement()["confusion"][f"judge_{judged}_human_{other}"] == 1
    label("doc/1", 0, "yes")  # added
    assert agreement()["labelled_claims"] == 2
    cleared = httpx.delete(_label_url(api, run_id, "doc/1", 0), headers=bearer(keys["write"]))
    assert cleared.status_code == 204
    assert agreement()["labelled_claims"] == 1
    # one per state of the labels: clearing doc/1 went back to the state after the change
    assert kept_agreements() == 3
    engine.dispose()
